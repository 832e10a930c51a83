"""Governed datasets: the pure core of profiles.

Two things a dataset version gets when it is ingested, computed here without a database, a
web framework or an artifact store (pyarrow, DuckDB and PyYAML only):

- a **profile**: :class:`Profiler` streams Arrow batches once, in bounded memory, into a
  :class:`Profile` of per-column counts, nulls, min/max/mean, quantiles (a KLL sketch), a
  distinct estimate (HyperLogLog) and top values; profilers of partitions merge. Personal
  columns keep no raw value. :func:`diff` compares two profiles (schema changes, null-rate
  and mean changes, KS and PSI estimates).
"""

from __future__ import annotations

from shamal.datasets._columns import Kind, Scalar
from shamal.datasets._diff import ColumnShift, ProfileDiff, TypeChange, diff
from shamal.datasets._profile import QUANTILES, ColumnProfile, Profile, Profiler, TopValue

__all__ = [
    "QUANTILES",
    "ColumnProfile",
    "ColumnShift",
    "Kind",
    "Profile",
    "ProfileDiff",
    "Profiler",
    "Scalar",
    "TopValue",
    "TypeChange",
    "diff",
]
