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

The entities and rules load with the package; everything else (pyarrow, DuckDB, the service)
on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shamal import lazy
from shamal.datasets._entities import DataSet, DataVersion, Part, VersionStatus, WriteMode
from shamal.datasets._rules import DataRef, check_alias, check_name, parse_ref

if TYPE_CHECKING:
    from shamal.datasets._columns import Kind, Scalar
    from shamal.datasets._diff import ColumnShift, ProfileDiff, TypeChange, diff
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
    from shamal.datasets._profile import QUANTILES, ColumnProfile, Profile, Profiler, TopValue
    from shamal.datasets._service import NAMESPACE, DatasetService
    from shamal.datasets._sources import (
        SOURCE_SCHEMES,
        SourceIngestion,
        SourcePolicy,
        format_of,
        parse_source,
    )
    from shamal.datasets._validation import REDACTED, ExpectationResult, Report, validate

_WHERE: dict[str, tuple[str, str | None]] = {
    "parse_source": ("_sources", "parse_source"),
    "format_of": ("_sources", "format_of"),
    "SourcePolicy": ("_sources", "SourcePolicy"),
    "SourceIngestion": ("_sources", "SourceIngestion"),
    "SOURCE_SCHEMES": ("_sources", "SOURCE_SCHEMES"),
    "Limits": ("_ingest", "Limits"),
    "ColumnProfile": ("_profile", "ColumnProfile"),
    "ColumnShift": ("_diff", "ColumnShift"),
    "ColumnType": ("_expectations", "ColumnType"),
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
    "MAX_EXPECTATIONS": ("_expectations", "MAX_EXPECTATIONS"),
    "MAX_SUITE_BYTES": ("_expectations", "MAX_SUITE_BYTES"),
    "MatchesRegex": ("_expectations", "MatchesRegex"),
    "NAMESPACE": ("_service", "NAMESPACE"),
    "NotNull": ("_expectations", "NotNull"),
    "Profile": ("_profile", "Profile"),
    "ProfileDiff": ("_diff", "ProfileDiff"),
    "Profiler": ("_profile", "Profiler"),
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
    "diff": ("_diff", "diff"),
    "validate": ("_validation", "validate"),
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
    "ColumnShift",
    "ColumnType",
    "CustomSql",
    "DataRef",
    "DataSet",
    "DataVersion",
    "DatasetService",
    "Expectation",
    "ExpectationResult",
    "Fresh",
    "InRange",
    "InSet",
    "Kind",
    "MatchesRegex",
    "NotNull",
    "Part",
    "Profile",
    "ProfileDiff",
    "Profiler",
    "Report",
    "RowCount",
    "Scalar",
    "Severity",
    "Suite",
    "SuiteBuilder",
    "TopValue",
    "TypeChange",
    "Unique",
    "VersionStatus",
    "WriteMode",
    "check_alias",
    "check_name",
    "diff",
    "parse_ref",
    "validate",
]


def __getattr__(name: str) -> Any:
    return lazy.attribute(__name__, _WHERE, name, globals())
