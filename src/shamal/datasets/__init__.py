"""Datasets: named tables owned by a team, with immutable, content-addressed versions.

A version is a list of Parquet parts in the artifact store (so other tools read them without
Shamal, and encryption at rest, S3 and hash checks apply to data too), with its schema, row
count, source, profile and validation report. Versions are numbered without gaps under
concurrent writers; aliases (``customers@prod``) and tags name them; ``NAME``, ``NAME/3`` and
``NAME@alias`` refer to them (:func:`parse_ref`).

The pure core, free of database, web framework and artifact store:

- a **profile**: :class:`Profiler` streams Arrow batches once, in bounded memory, into a
  :class:`Profile` of per-column counts, nulls, min/max/mean, quantiles (a KLL sketch), a
  distinct estimate (HyperLogLog) and top values; profilers of partitions merge. Personal
  columns keep no raw value. :func:`diff` compares two profiles.
- a **validation**: a :class:`Suite` of :class:`Expectation` s (YAML or a builder) that
  :func:`validate` evaluates over a version's Parquet files in one DuckDB scan, custom SQL
  confined to the version, into a :class:`Report`.
- **privacy**: a :class:`PrivacyPolicy` names a dataset's personal columns and how each is
  transformed (hmac per purpose, tokenize, drop, generalize) by a :class:`Pseudonymizer` on
  each batch before it is stored; :class:`Erasure` records a data subject removed from every
  version.

The entities and rules load with the package; everything else (pyarrow, DuckDB, the service)
on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shamal import lazy
from shamal.datasets._entities import (
    DataSet,
    DataVersion,
    DeadLetter,
    Erasure,
    Part,
    Residency,
    StagedPart,
    StoreResidency,
    VersionStatus,
    WriteMode,
)
from shamal.datasets._rules import DataRef, check_alias, check_name, parse_ref

if TYPE_CHECKING:
    from shamal.datasets._batcher import Message, MicroBatcher
    from shamal.datasets._brokers import Broker, describe, open_broker, parse_url
    from shamal.datasets._columns import Kind, Scalar
    from shamal.datasets._confined import check_select, quote_identifier, quote_text
    from shamal.datasets._consumer import Consumer
    from shamal.datasets._diff import (
        ColumnShift,
        ProfileDiff,
        TypeChange,
        VersionDiff,
        diff,
        diff_versions,
    )
    from shamal.datasets._expectations import (
        KINDS,
        MAX_EXPECTATIONS,
        MAX_SUITE_BYTES,
        ColumnType,
        CustomSql,
        Expectation,
        Fresh,
        InRange,
        InSet,
        MatchesRegex,
        NotNull,
        RowCount,
        Severity,
        Suite,
        SuiteBuilder,
        Unique,
    )
    from shamal.datasets._ingest import FORMATS, Limits
    from shamal.datasets._privacy import ColumnRule, PrivacyPolicy, Pseudonymizer
    from shamal.datasets._profile import QUANTILES, ColumnProfile, Profile, Profiler, TopValue
    from shamal.datasets._service import NAMESPACE, DatasetService
    from shamal.datasets._sources import (
        SOURCE_SCHEMES,
        SourceIngestion,
        SourcePolicy,
        format_of,
        parse_source,
    )
    from shamal.datasets._streams import StreamService, StreamWrite
    from shamal.datasets._validation import REDACTED, ExpectationResult, Report, validate

_WHERE: dict[str, tuple[str, str | None]] = {
    "parse_source": ("_sources", "parse_source"),
    "format_of": ("_sources", "format_of"),
    "SourcePolicy": ("_sources", "SourcePolicy"),
    "SourceIngestion": ("_sources", "SourceIngestion"),
    "SOURCE_SCHEMES": ("_sources", "SOURCE_SCHEMES"),
    "Limits": ("_ingest", "Limits"),
    "ColumnProfile": ("_profile", "ColumnProfile"),
    "ColumnRule": ("_privacy", "ColumnRule"),
    "ColumnShift": ("_diff", "ColumnShift"),
    "ColumnType": ("_expectations", "ColumnType"),
    "Consumer": ("_consumer", "Consumer"),
    "CustomSql": ("_expectations", "CustomSql"),
    "DatasetService": ("_service", "DatasetService"),
    "Expectation": ("_expectations", "Expectation"),
    "ExpectationResult": ("_validation", "ExpectationResult"),
    "FORMATS": ("_ingest", "FORMATS"),
    "Fresh": ("_expectations", "Fresh"),
    "InRange": ("_expectations", "InRange"),
    "InSet": ("_expectations", "InSet"),
    "KINDS": ("_expectations", "KINDS"),
    "Kind": ("_columns", "Kind"),
    "Broker": ("_brokers", "Broker"),
    "Message": ("_batcher", "Message"),
    "MicroBatcher": ("_batcher", "MicroBatcher"),
    "StreamService": ("_streams", "StreamService"),
    "StreamWrite": ("_streams", "StreamWrite"),
    "MAX_EXPECTATIONS": ("_expectations", "MAX_EXPECTATIONS"),
    "MAX_SUITE_BYTES": ("_expectations", "MAX_SUITE_BYTES"),
    "MatchesRegex": ("_expectations", "MatchesRegex"),
    "NAMESPACE": ("_service", "NAMESPACE"),
    "NotNull": ("_expectations", "NotNull"),
    "PrivacyPolicy": ("_privacy", "PrivacyPolicy"),
    "Profile": ("_profile", "Profile"),
    "ProfileDiff": ("_diff", "ProfileDiff"),
    "Profiler": ("_profile", "Profiler"),
    "Pseudonymizer": ("_privacy", "Pseudonymizer"),
    "QUANTILES": ("_profile", "QUANTILES"),
    "REDACTED": ("_validation", "REDACTED"),
    "Report": ("_validation", "Report"),
    "RowCount": ("_expectations", "RowCount"),
    "Scalar": ("_columns", "Scalar"),
    "Severity": ("_expectations", "Severity"),
    "Suite": ("_expectations", "Suite"),
    "SuiteBuilder": ("_expectations", "SuiteBuilder"),
    "TopValue": ("_profile", "TopValue"),
    "TypeChange": ("_diff", "TypeChange"),
    "Unique": ("_expectations", "Unique"),
    "VersionDiff": ("_diff", "VersionDiff"),
    "diff": ("_diff", "diff"),
    "diff_versions": ("_diff", "diff_versions"),
    "describe": ("_brokers", "describe"),
    "open_broker": ("_brokers", "open_broker"),
    "parse_url": ("_brokers", "parse_url"),
    "validate": ("_validation", "validate"),
    "check_select": ("_confined", "check_select"),
    "quote_identifier": ("_confined", "quote_identifier"),
    "quote_text": ("_confined", "quote_text"),
}

__all__ = [
    "parse_source",
    "format_of",
    "SourcePolicy",
    "SourceIngestion",
    "SOURCE_SCHEMES",
    "Limits",
    "FORMATS",
    "KINDS",
    "MAX_EXPECTATIONS",
    "MAX_SUITE_BYTES",
    "NAMESPACE",
    "QUANTILES",
    "REDACTED",
    "ColumnProfile",
    "ColumnRule",
    "ColumnShift",
    "Broker",
    "ColumnType",
    "Consumer",
    "CustomSql",
    "DataRef",
    "DataSet",
    "DataVersion",
    "DatasetService",
    "DeadLetter",
    "Erasure",
    "Expectation",
    "ExpectationResult",
    "Fresh",
    "InRange",
    "InSet",
    "Kind",
    "MatchesRegex",
    "Message",
    "MicroBatcher",
    "NotNull",
    "Part",
    "PrivacyPolicy",
    "Profile",
    "ProfileDiff",
    "Profiler",
    "Pseudonymizer",
    "Report",
    "Residency",
    "RowCount",
    "Scalar",
    "Severity",
    "StagedPart",
    "StoreResidency",
    "StreamService",
    "StreamWrite",
    "Suite",
    "SuiteBuilder",
    "TopValue",
    "TypeChange",
    "Unique",
    "VersionDiff",
    "VersionStatus",
    "WriteMode",
    "check_alias",
    "check_select",
    "check_name",
    "describe",
    "diff",
    "diff_versions",
    "open_broker",
    "parse_ref",
    "parse_url",
    "quote_identifier",
    "quote_text",
    "validate",
]


def __getattr__(name: str) -> Any:
    return lazy.attribute(__name__, _WHERE, name, globals())
