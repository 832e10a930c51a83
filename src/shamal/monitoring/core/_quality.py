"""Data quality checks over column sketches: nulls, non-finite values, out-of-range values,
new categories, and columns whose kind changed or that appeared or vanished.

Drift asks "did the distribution move?"; quality asks "is the data still well formed?". A
column can break without drifting (a feed starts sending ``inf``), and both are needed to
explain a bad prediction. Every check compares a current sketch with the reference sketch of
the same column, so nothing here ever sees raw rows.

Shares are measured against the rows a check can see:

* null rate: ``nulls / count`` (all rows);
* non-finite share: ``nonfinite / count`` (all rows);
* wrong-type share: ``invalid / count`` (all rows);
* out-of-range share and new-category share: over the present values (the sketch's
  ``valid``: not null, finite, of the column's kind), the rows that carry a usable value.

Out-of-range shares are exact when the current sketch keeps its exact values, its exact
per-value counts, or its exact tails reach past the reference range; otherwise they are
estimated from its quantile grid (see :func:`out_of_range_fraction`, whose docstring states
the error bound).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import numpy as np

from shamal.errors import InvalidParameter
from shamal.monitoring.core._chunks import grid_ranks
from shamal.monitoring.core._sketch import OTHER, ColumnSketch

__all__ = [
    "QualityIssue",
    "QualityKind",
    "new_category_fraction",
    "out_of_range_fraction",
    "quality",
]

logger = logging.getLogger(__name__)

QualityKind = Literal[
    "null_rate",
    "nonfinite",
    "out_of_range",
    "new_category",
    "type_changed",
    "invalid_value",
    "missing_column",
    "new_column",
]

#: The order issues of one column are reported in (most basic first).
_ORDER: Final[dict[str, int]] = {
    "missing_column": 0,
    "new_column": 1,
    "type_changed": 2,
    "invalid_value": 3,
    "null_rate": 4,
    "nonfinite": 5,
    "out_of_range": 6,
    "new_category": 7,
}


#: The longest column name or detail a stored issue may carry.
_MAX_TEXT: Final = 10_000


@dataclass(frozen=True, slots=True)
class QualityIssue:
    """One data quality problem of one column.

    Attributes:
        column: the column's name.
        kind: what is wrong (see :data:`QualityKind`).
        value: what was measured: a share in ``[0, 1]`` for rates and shares, ``1.0`` for
            a structural issue (missing, new or type-changed column).
        limit: the largest value that would not have been an issue.
        detail: one human-readable sentence (safe to show; built from names and numbers).
    """

    column: str
    kind: QualityKind
    value: float
    limit: float
    detail: str

    def to_json(self) -> dict[str, Any]:
        """A JSON object with the issue's fields."""
        return {
            "column": self.column,
            "kind": self.kind,
            "value": self.value,
            "limit": self.limit,
            "detail": self.detail,
        }

    @classmethod
    def from_json(cls, raw: Any) -> QualityIssue:
        """The issue :meth:`to_json` wrote.

        Raises:
            InvalidParameter: not such an object: missing or extra keys, an unknown kind,
                values that are not finite numbers, texts that are not strings or too long.
        """
        if not isinstance(raw, dict) or set(raw) != {"column", "kind", "value", "limit", "detail"}:
            raise InvalidParameter(
                "a quality issue is an object with column, kind, value, limit, detail"
            )
        column, kind, detail = raw["column"], raw["kind"], raw["detail"]
        if not isinstance(column, str) or len(column) > _MAX_TEXT:
            raise InvalidParameter("a quality issue's column must be a string")
        if kind not in _ORDER:
            raise InvalidParameter("a quality issue's kind is unknown")
        if not isinstance(detail, str) or len(detail) > _MAX_TEXT:
            raise InvalidParameter("a quality issue's detail must be a string")
        numbers = []
        for key in ("value", "limit"):
            number = raw[key]
            if (
                isinstance(number, bool)
                or not isinstance(number, int | float)
                or not _finite(number)
            ):
                raise InvalidParameter(f"a quality issue's {key} must be a finite number")
            numbers.append(float(number))
        return cls(column, kind, numbers[0], numbers[1], detail)


def quality(
    reference: Mapping[str, ColumnSketch],
    current: Mapping[str, ColumnSketch],
    *,
    null_rate_increase: float = 0.05,
    out_of_range_share: float = 0.01,
    new_category_share: float = 0.01,
    nonfinite_increase: float = 0.0,
    invalid_increase: float = 0.0,
) -> tuple[QualityIssue, ...]:
    """The data quality issues of ``current`` measured against ``reference``.

    Checks, per column (columns are matched by their mapping key):

    * ``missing_column``: in the reference, absent from current;
    * ``new_column``: in current, absent from the reference;
    * ``type_changed``: the kinds differ (no other check runs on that column);
    * ``invalid_value``: current share of values of the wrong type (a string in a numeric
      column: the sketch's ``invalid``) above the reference's plus ``invalid_increase``;
    * ``null_rate``: current null rate above the reference's plus ``null_rate_increase``;
    * ``nonfinite``: current share of +-inf above the reference's plus ``nonfinite_increase``
      (numeric columns);
    * ``out_of_range``: share of present values outside the reference's ``[min, max]``
      above ``out_of_range_share`` (numeric columns);
    * ``new_category``: share of present values in categories the reference never saw
      above ``new_category_share`` (categorical columns). When the reference's counts were
      capped (a :data:`OTHER` bucket), a category missing from its kept keys may have been in
      that tail, so the limit is raised by the tail's share of the reference.

    A current column with no rows has no rates and gets no rate issues. Every comparison
    is strict: a value equal to its limit is not an issue.

    Args:
        reference: the reference sketches by column.
        current: the current sketches by column.
        null_rate_increase: allowed increase of the null rate, in ``[0, 1]``.
        out_of_range_share: allowed share of out-of-range values, in ``[0, 1]``.
        new_category_share: allowed share of values in new categories, in ``[0, 1]``.
        nonfinite_increase: allowed increase of the share of +-inf values, in ``[0, 1]``.
        invalid_increase: allowed increase of the share of wrong-type values, in ``[0, 1]``.

    Returns:
        The issues, ordered by column name and then from structural to value-level.

    Raises:
        InvalidParameter: a limit outside ``[0, 1]`` or not a number, or an inconsistent
            sketch (negative counts, more nulls than rows).
    """
    limits = {
        "null_rate_increase": null_rate_increase,
        "out_of_range_share": out_of_range_share,
        "new_category_share": new_category_share,
        "nonfinite_increase": nonfinite_increase,
        "invalid_increase": invalid_increase,
    }
    for name, limit in limits.items():
        _check_share_limit(name, limit)
    for sketch in (*reference.values(), *current.values()):
        _check_sketch(sketch)
    issues: list[QualityIssue] = []
    for column in sorted(set(reference) | set(current)):
        ref = reference.get(column)
        cur = current.get(column)
        if cur is None:
            issues.append(_structural(column, "missing_column", "is in the reference, not current"))
        elif ref is None:
            issues.append(_structural(column, "new_column", "is in current, not the reference"))
        elif ref.kind != cur.kind:
            issues.append(
                _structural(column, "type_changed", f"was {ref.kind} and is now {cur.kind}")
            )
        else:
            issues.extend(_column_issues(column, ref, cur, limits))
    issues.sort(key=lambda issue: (issue.column, _ORDER[issue.kind]))
    return tuple(issues)


def out_of_range_fraction(reference: ColumnSketch, current: ColumnSketch) -> float:
    """The share of current's present values outside the reference's ``[min, max]``.

    Exact when the reference range is known exactly (sketch min/max are exact) and current
    keeps its exact values, or exact per-value counts with no :data:`OTHER` bucket, or its
    own ``[min, max]`` lies inside the reference range (then the share is 0), or its tails
    (its smallest and largest values) reach back inside the range at both ends, so every
    value beyond the range is in them.

    Otherwise it is estimated from current's quantile grid: the values at ranks ``r_i``
    (:func:`~shamal.monitoring.core._chunks.grid_ranks`: the builder's ``QUANTILE_RANKS``, or
    evenly spaced ``i / (m - 1)`` for a hand-made grid of ``m`` values; ``r_0`` is the minimum's
    rank 0, the last the maximum's rank 1). For the lower end ``a`` the share below it,
    ``F(a-)``, lies between the ranks of the two grid points around ``a``; it is interpolated
    linearly between them. The upper end is handled the same way. The error of the estimate
    is therefore at most the rank gap around each end (``1 / (m - 1)`` for an even grid,
    0.001 for the builder's), plus whatever rank error the sketch's quantiles carry.

    Returns ``0.0`` when current has no present values; ``nan`` when the reference has no
    range (all its values were null) or current has neither values, counts nor quantiles.
    """
    if _present(current) == 0:
        return 0.0
    low, high = reference.min, reference.max
    if low is None or high is None:
        return math.nan
    exact = _exact_out_of_range(current, low, high)
    if exact is not None:
        return exact
    if current.quantiles:
        return _share_from_grid(np.asarray(current.quantiles, dtype=float), low, high)
    return math.nan


def _exact_out_of_range(current: ColumnSketch, low: float, high: float) -> float | None:
    """The exact out-of-range share when current's range, values or counts give it."""
    if (
        current.min is not None
        and current.max is not None
        and low <= current.min <= current.max <= high
    ):
        return 0.0
    if current.values is not None:
        values = np.asarray([v for v in current.values if not isinstance(v, str)], dtype=float)
        values = values[np.isfinite(values)]
        if values.size:
            return float(np.count_nonzero((values < low) | (values > high)) / values.size)
    counted = _share_from_counts(current.counts, low, high)
    return counted if counted is not None else _share_from_tails(current, low, high)


def _share_from_tails(current: ColumnSketch, low: float, high: float) -> float | None:
    """The exact out-of-range share from current's tails (its smallest and largest values),
    or None when a tail is too short to hold every value beyond its end of the range."""
    present = _present(current)
    if current.tails is None or present == 0:
        return None
    bottom = np.asarray(current.tails[0], dtype=np.float64)
    top = np.asarray(current.tails[1], dtype=np.float64)
    if bottom.size >= present:  # the tails hold every value
        return float(np.count_nonzero((bottom < low) | (bottom > high)) / present)
    # a tail whose innermost value is inside the range holds every value beyond that end
    if bottom.size == 0 or top.size == 0 or bottom[-1] < low or top[0] > high:
        return None
    return float((np.count_nonzero(bottom < low) + np.count_nonzero(top > high)) / present)


def new_category_fraction(
    reference: ColumnSketch, current: ColumnSketch
) -> tuple[float, list[str]]:
    """The share of current's present values in categories the reference lacks, and those
    categories (most frequent first, then by name).

    Current's own :data:`OTHER` bucket is never counted as new: its members are unknown.
    """
    ref_counts = _category_counts(reference)
    cur_counts = _category_counts(current)
    total = sum(count for key, count in cur_counts.items())
    if total == 0:
        return 0.0, []
    new = {
        key: count
        for key, count in cur_counts.items()
        if key != OTHER and key not in ref_counts and count > 0
    }
    names = sorted(new, key=lambda key: (-new[key], key))
    return sum(new.values()) / total, names


def _column_issues(
    column: str, ref: ColumnSketch, cur: ColumnSketch, limits: Mapping[str, float]
) -> list[QualityIssue]:
    """The rate- and value-level issues of a column present on both sides with one kind."""
    issues: list[QualityIssue] = []
    if cur.count == 0:
        return issues
    rates: tuple[tuple[QualityKind, int, int, str, str], ...] = (
        ("invalid_value", ref.invalid, cur.invalid, "invalid_increase", "of the wrong type"),
        ("null_rate", ref.nulls, cur.nulls, "null_rate_increase", "null"),
        ("nonfinite", ref.nonfinite, cur.nonfinite, "nonfinite_increase", "+-inf"),
    )
    for kind, ref_part, cur_part, limit_name, what in rates:
        limit = _rate(ref_part, ref.count) + limits[limit_name]
        rate = cur_part / cur.count
        if rate > limit:
            issues.append(
                QualityIssue(
                    column,
                    kind,
                    rate,
                    limit,
                    f"{cur_part} of {cur.count} rows are {what} ({rate:.2%});"
                    f" the reference had {_rate(ref_part, ref.count):.2%}",
                )
            )
    if cur.kind == "numeric":
        issues.extend(_numeric_issues(column, ref, cur, limits))
    else:
        issues.extend(_categorical_issues(column, ref, cur, limits))
    return issues


def _numeric_issues(
    column: str, ref: ColumnSketch, cur: ColumnSketch, limits: Mapping[str, float]
) -> list[QualityIssue]:
    """The out-of-range issue of a numeric column."""
    issues: list[QualityIssue] = []
    share = out_of_range_fraction(ref, cur)
    limit = limits["out_of_range_share"]
    if share > limit:  # nan (no reference range) compares False: nothing to judge against
        issues.append(
            QualityIssue(
                column,
                "out_of_range",
                share,
                limit,
                f"{share:.2%} of values lie outside the reference range [{ref.min:g}, {ref.max:g}]",
            )
        )
    return issues


def _categorical_issues(
    column: str, ref: ColumnSketch, cur: ColumnSketch, limits: Mapping[str, float]
) -> list[QualityIssue]:
    """The new-category issue of a categorical column."""
    share, names = new_category_fraction(ref, cur)
    ref_counts = _category_counts(ref)
    tail = _rate(ref_counts.get(OTHER, 0), sum(ref_counts.values()))
    limit = min(1.0, limits["new_category_share"] + tail)
    if share <= limit:
        return []
    shown = ", ".join(repr(name[:40]) for name in names[:5])
    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    return [
        QualityIssue(
            column,
            "new_category",
            share,
            limit,
            f"{share:.2%} of values are in categories the reference never saw: {shown}{more}",
        )
    ]


def _structural(column: str, kind: QualityKind, what: str) -> QualityIssue:
    return QualityIssue(column, kind, 1.0, 0.0, f"column {column!r} {what}")


def _category_counts(sketch: ColumnSketch) -> Mapping[str, int]:
    """A categorical sketch's value counts: its counts, else counted from its exact values."""
    if sketch.counts is not None:
        return sketch.counts
    if sketch.values is not None:
        return Counter(str(value) for value in sketch.values)
    return {}


def _share_from_counts(counts: Mapping[str, int] | None, low: float, high: float) -> float | None:
    """The exact out-of-range share from a numeric sketch's per-value counts, or None when
    they are absent, capped or not numeric."""
    if not counts or OTHER in counts:
        return None
    try:
        keys = np.asarray([float(key) for key in counts], dtype=float)
    except ValueError:
        return None
    weights = np.asarray(list(counts.values()), dtype=float)
    finite = np.isfinite(keys)
    total = weights[finite].sum()
    if total <= 0:
        return None
    outside = finite & ((keys < low) | (keys > high))
    return float(weights[outside].sum() / total)


def _share_from_grid(grid: np.ndarray, low: float, high: float) -> float:
    """The out-of-range share estimated from a quantile grid (see out_of_range_fraction)."""
    ranks = grid_ranks(grid.size)
    finite = np.isfinite(grid)
    grid, ranks = grid[finite], ranks[finite]
    if grid.size == 0:
        return math.nan
    if grid.size == 1:
        return float(grid[0] < low or grid[0] > high)
    grid = np.sort(grid)  # a sketch's grid is monotone; sorting guards against rounding noise
    below = _rank_at(grid, ranks, low, side="left")
    above = 1.0 - _rank_at(grid, ranks, high, side="right")
    return float(min(1.0, max(0.0, below + above)))


def _rank_at(
    grid: np.ndarray, ranks: np.ndarray, x: float, *, side: Literal["left", "right"]
) -> float:
    """The interpolated share of values below ``x`` (side left) or at most ``x`` (right)."""
    k = int(np.searchsorted(grid, x, side=side))
    if k == 0:
        return 0.0
    if k == grid.size:
        return 1.0
    left, right = grid[k - 1], grid[k]
    fraction = 0.0 if right <= left else (x - left) / (right - left)
    return float(ranks[k - 1] + fraction * (ranks[k] - ranks[k - 1]))


def _finite(number: float) -> bool:
    try:
        return math.isfinite(number)
    except OverflowError:  # an int beyond any float
        return False


def _present(sketch: ColumnSketch) -> int:
    return max(0, sketch.valid)


def _rate(part: int, whole: int) -> float:
    return part / whole if whole > 0 else 0.0


def _check_share_limit(name: str, limit: float) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int | float) or not 0.0 <= limit <= 1.0:
        raise InvalidParameter(f"{name} must be a number between 0 and 1")


def _check_sketch(sketch: ColumnSketch) -> None:
    counts = (sketch.count, sketch.nulls, sketch.nonfinite, sketch.invalid)
    if any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in counts):
        raise InvalidParameter(f"sketch of column {sketch.name[:80]!r} has an invalid count")
    if sketch.nulls + sketch.nonfinite + sketch.invalid > sketch.count:
        raise InvalidParameter(
            f"sketch of column {sketch.name[:80]!r} has more nulls, infinities and invalid"
            " values than rows"
        )
