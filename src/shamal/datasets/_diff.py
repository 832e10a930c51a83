"""How one profile differs from another: schema changes and per-column shifts.

Distances are estimated from what profiles keep, never from the data: the Kolmogorov-Smirnov
statistic and the population stability index (PSI, ten bins at the first profile's deciles)
from the 101 percentiles of numeric and temporal columns, and a PSI over the top values (plus
one bucket for the rest) of string and boolean columns. Both carry the percentiles' resolution
(1 % of rank) on top of the sketches' error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from shamal.datasets._columns import Scalar, float_to_json
from shamal.datasets._entities import DataVersion
from shamal.datasets._profile import ColumnProfile, Profile

__all__ = ["ColumnShift", "ProfileDiff", "TypeChange", "VersionDiff", "diff", "diff_versions"]

#: Proportions below this count as this, so that an empty bin does not make PSI infinite.
_FLOOR: Final = 1e-4


@dataclass(frozen=True, slots=True)
class TypeChange:
    """A column kept its name but changed its type."""

    name: str
    before: str
    after: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "before": self.before, "after": self.after}


@dataclass(frozen=True, slots=True)
class ColumnShift:
    """How one column present in both profiles moved (``after`` minus ``before``).

    ``ks`` and ``psi`` are None where the profiles cannot say (personal columns, kinds
    without a distribution, or a side with no values). PSI reads as usual: below 0.1 stable,
    0.1 to 0.25 a moderate shift, above 0.25 a major one.
    """

    name: str
    null_rate_change: float
    mean_change: float | None
    distinct_change: int | None
    ks: float | None
    psi: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "null_rate_change": self.null_rate_change,
            "mean_change": None if self.mean_change is None else float_to_json(self.mean_change),
            "distinct_change": self.distinct_change,
            "ks": self.ks,
            "psi": self.psi,
        }


@dataclass(frozen=True, slots=True)
class ProfileDiff:
    """Schema differences and per-column shifts between two profiles."""

    rows_before: int
    rows_after: int
    added: tuple[str, ...]
    removed: tuple[str, ...]
    type_changes: tuple[TypeChange, ...]
    columns: tuple[ColumnShift, ...]

    @property
    def schema_changed(self) -> bool:
        return bool(self.added or self.removed or self.type_changes)

    def column(self, name: str) -> ColumnShift:
        """The shift of one column present in both profiles.

        Raises:
            KeyError: no such column in both profiles.
        """
        for shift in self.columns:
            if shift.name == name:
                return shift
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "rows_before": self.rows_before,
            "rows_after": self.rows_after,
            "added": list(self.added),
            "removed": list(self.removed),
            "type_changes": [t.to_json() for t in self.type_changes],
            "columns": [c.to_json() for c in self.columns],
        }


def diff(before: Profile, after: Profile) -> ProfileDiff:
    """How ``after`` differs from ``before``: columns added, removed or retyped, and for each
    column in both, the change of its null rate, mean and distinct count and the distance
    between its two distributions."""
    names_before, names_after = set(before.names), set(after.names)
    common = [name for name in before.names if name in names_after]
    return ProfileDiff(
        rows_before=before.rows,
        rows_after=after.rows,
        added=tuple(name for name in after.names if name not in names_before),
        removed=tuple(name for name in before.names if name not in names_after),
        type_changes=tuple(
            TypeChange(name, before.column(name).type, after.column(name).type)
            for name in common
            if before.column(name).type != after.column(name).type
        ),
        columns=tuple(_shift(before.column(name), after.column(name)) for name in common),
    )


def _shift(a: ColumnProfile, b: ColumnProfile) -> ColumnShift:
    comparable = a.kind == b.kind and not (a.personal or b.personal)
    ks, psi = _distances(a, b) if comparable else (None, None)
    means = comparable and a.mean is not None and b.mean is not None
    distincts = a.distinct is not None and b.distinct is not None
    return ColumnShift(
        name=a.name,
        null_rate_change=b.null_rate - a.null_rate,
        mean_change=b.mean - a.mean if means else None,  # type: ignore[operator]
        distinct_change=b.distinct - a.distinct if distincts else None,  # type: ignore[operator]
        ks=ks,
        psi=psi,
    )


def _distances(a: ColumnProfile, b: ColumnProfile) -> tuple[float | None, float | None]:
    """KS and PSI between two columns of the same kind, where their profiles allow."""
    if a.percentiles is not None and b.percentiles is not None:
        grid_a, grid_b = np.asarray(a.percentiles), np.asarray(b.percentiles)
        return _ks(grid_a, grid_b), _numeric_psi(grid_a, grid_b)
    if a.top_values and b.top_values and a.kind in ("string", "boolean"):
        return None, _categorical_psi(a, b)
    return None, None


def _cdf(grid: npt.NDArray[np.float64], at: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The distribution function read off 101 percentiles: the share of values <= ``at``."""
    below = np.searchsorted(grid, at, side="right") - 1
    return np.clip(below / (len(grid) - 1), 0.0, 1.0)


def _ks(grid_a: npt.NDArray[np.float64], grid_b: npt.NDArray[np.float64]) -> float:
    points = np.union1d(grid_a, grid_b)
    return float(np.max(np.abs(_cdf(grid_a, points) - _cdf(grid_b, points))))


def _psi(share_a: npt.NDArray[np.float64], share_b: npt.NDArray[np.float64]) -> float:
    share_a = np.maximum(share_a, _FLOOR)
    share_b = np.maximum(share_b, _FLOOR)
    return float(np.sum((share_b - share_a) * np.log(share_b / share_a)))


def _numeric_psi(grid_a: npt.NDArray[np.float64], grid_b: npt.NDArray[np.float64]) -> float:
    edges = np.unique(grid_a[10:100:10])

    def shares(grid: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        cumulative = _cdf(grid, edges)
        return np.diff(np.concatenate([[0.0], cumulative, [1.0]]))

    return _psi(shares(grid_a), shares(grid_b))


def _categorical_psi(a: ColumnProfile, b: ColumnProfile) -> float:
    def shares(profile: ColumnProfile, keys: list[Scalar]) -> npt.NDArray[np.float64]:
        seen = max(profile.count - profile.nulls, 1)
        counts = {t.value: t.count for t in profile.top_values}
        listed = np.array([counts.get(k, 0) / seen for k in keys], dtype=np.float64)
        rest = max(0.0, 1.0 - float(listed.sum()))
        return np.concatenate([listed, [rest]])

    keys = list(dict.fromkeys([t.value for t in a.top_values] + [t.value for t in b.top_values]))
    return _psi(shares(a, keys), shares(b, keys))


@dataclass(frozen=True, slots=True)
class VersionDiff:
    """How version ``after`` of a dataset differs from version ``before``.

    The schema changes are read from the versions' schemas (names, Arrow types and
    nullability, as stored); the row change from their row counts; the per-column shifts from
    their profiles (:func:`diff`). A profile's ``scope`` is ``version`` when it covers every row
    of its version, ``write`` when a concurrent append left it covering only the rows that
    write added: shifts between such profiles compare those rows.
    """

    before: str
    after: str
    same_content: bool
    rows_before: int
    rows_after: int
    added: tuple[dict[str, Any], ...]
    removed: tuple[dict[str, Any], ...]
    type_changes: tuple[TypeChange, ...]
    nullability_changes: tuple[str, ...]
    profile_scopes: tuple[str, str]
    profile: ProfileDiff

    @property
    def row_change(self) -> int:
        return self.rows_after - self.rows_before

    @property
    def schema_changed(self) -> bool:
        return bool(self.added or self.removed or self.type_changes or self.nullability_changes)

    def to_json(self) -> dict[str, Any]:
        return {
            "before": self.before,
            "after": self.after,
            "same_content": self.same_content,
            "rows_before": self.rows_before,
            "rows_after": self.rows_after,
            "row_change": self.row_change,
            "schema_changed": self.schema_changed,
            "added": [dict(c) for c in self.added],
            "removed": [dict(c) for c in self.removed],
            "type_changes": [t.to_json() for t in self.type_changes],
            "nullability_changes": list(self.nullability_changes),
            "profile_scopes": list(self.profile_scopes),
            "columns": [c.to_json() for c in self.profile.columns],
        }


def diff_versions(before: DataVersion, after: DataVersion) -> VersionDiff:
    """How ``after`` differs from ``before``: schema, rows and profile shift per column.

    Raises:
        InvalidParameter: a stored profile is malformed.
    """
    old = {str(c["name"]): c for c in before.schema}
    new = {str(c["name"]): c for c in after.schema}
    common = [name for name in old if name in new]
    return VersionDiff(
        before=before.uri,
        after=after.uri,
        same_content=before.digest == after.digest,
        rows_before=before.row_count,
        rows_after=after.row_count,
        added=tuple(new[n] for n in new if n not in old),
        removed=tuple(old[n] for n in old if n not in new),
        type_changes=tuple(
            TypeChange(n, str(old[n]["type"]), str(new[n]["type"]))
            for n in common
            if old[n]["type"] != new[n]["type"]
        ),
        nullability_changes=tuple(
            n for n in common if bool(old[n].get("nullable")) != bool(new[n].get("nullable"))
        ),
        profile_scopes=(_scope(before), _scope(after)),
        profile=diff(Profile.from_json(before.profile), Profile.from_json(after.profile)),
    )


def _scope(version: DataVersion) -> str:
    return str(version.profile.get("scope", "version"))
