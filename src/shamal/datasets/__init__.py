"""Governed datasets: the pure core of profiles and validation suites.

Two things a dataset version gets when it is ingested, computed here without a database, a
web framework or an artifact store (pyarrow, DuckDB and PyYAML only):

- a **profile**: :class:`Profiler` streams Arrow batches once, in bounded memory, into a
  :class:`Profile` of per-column counts, nulls, min/max/mean, quantiles (a KLL sketch), a
  distinct estimate (HyperLogLog) and top values; profilers of partitions merge. Personal
  columns keep no raw value. :func:`diff` compares two profiles (schema changes, null-rate
  and mean changes, KS and PSI estimates).
- a **validation**: a :class:`Suite` of :class:`Expectation` s (YAML or a builder) that
  :func:`validate` evaluates over the version's Parquet files in one DuckDB scan, custom SQL
  confined to the version, into a :class:`Report` whose ``ok`` says whether every
  error-severity expectation held.
"""

from __future__ import annotations

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
from shamal.datasets._profile import QUANTILES, ColumnProfile, Profile, Profiler, TopValue
from shamal.datasets._validation import REDACTED, ExpectationResult, Report, validate

__all__ = [
    "KINDS",
    "MAX_EXPECTATIONS",
    "MAX_SUITE_BYTES",
    "QUANTILES",
    "REDACTED",
    "ColumnProfile",
    "ColumnShift",
    "ColumnType",
    "CustomSql",
    "Expectation",
    "ExpectationResult",
    "Fresh",
    "InRange",
    "InSet",
    "Kind",
    "MatchesRegex",
    "NotNull",
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
    "diff",
    "validate",
]
