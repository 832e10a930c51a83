"""Drift tests over column sketches, with Evidently's defaults, as pure functions.

Evidently (0.7, ``evidently.legacy.calculations.stattests`` and its default chooser) is the
reference for what each test computes, its default threshold and its drift rule; scipy does
the statistics. Both sides drop nulls and +-inf first, as Evidently does.

Each test, its default threshold and when it calls drift:

- ``ks``: two-sample Kolmogorov-Smirnov p-value (``scipy.stats.ks_2samp``); 0.05; ``p <= t``.
- ``chisquare``: chi-squared p-value, expected = the reference's counts scaled to the current's
  size (``scipy.stats.chisquare``); 0.05; ``p < t``.
- ``z``: two-proportion Z-test p-value (the first category in sorted order against the rest);
  0.05; ``p < t``.
- ``wasserstein``: ``wasserstein_distance / max(std(reference), 0.001)``; 0.1; ``d >= t``.
- ``jensenshannon``: ``scipy.spatial.distance.jensenshannon`` of the binned shares; 0.1;
  ``d >= t``.
- ``psi``: ``sum((r - c) * log(r / c))`` of the binned shares, empty bins filled; 0.1;
  ``d >= t``.

Binning (JS, PSI): a numeric column whose reference has more than 20 distinct values is cut
into equal-width bins over the range of both samples, as many as Sturges' rule gives for
their combined size (``numpy.histogram_bin_edges(..., "sturges")``; Evidently's ``n_bins``
argument is not used there); otherwise each distinct value is a bin. PSI fills an empty bin
with ``min(nonzero) / 1e6`` when the smallest non-empty share is at most 1e-4, else 1e-4.

Exactness: where both sketches hold their exact values (at most ``EXACT_LIMIT`` of them) or
value counts (few distinct values), the tests see the very samples Evidently sees. Otherwise
a numeric side is its quantile grid and its exact tails: KS runs ``ks_2samp`` on a sample of
the side's true size drawn at evenly spaced ranks from the grid (so scipy picks the method it
would pick on the raw data), and beyond 200,000 values a side takes the statistic from
200,000-value samples and the p-value from the true sizes as scipy's asymptotic method does
(``kstwo.sf(D, round(n m / (n + m)))``); Wasserstein uses the grid's atoms with the tails'
values; the binned tests use the grid's CDF at the bin edges, exact in the tails. The
differences from the exact statistics are of the order of the grid's rank step (0.001) and
the sketch's rank error; the tests in ``tests/monitoring/core`` bound them.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Final, cast

import numpy as np

from shamal.errors import InvalidParameter
from shamal.monitoring.core._sketch import (
    DISTINCT_LIMIT,
    OTHER,
    QUANTILE_RANKS,
    ColumnSketch,
    FloatArray,
    Kind,
    numeric_key,
)

__all__ = [
    "DEFAULT_THRESHOLDS",
    "P_VALUE_TESTS",
    "TESTS",
    "choose_test",
    "distinct_values",
    "drifted",
    "psi",
    "run_test",
]

TESTS: Final = ("ks", "chisquare", "z", "wasserstein", "jensenshannon", "psi")
P_VALUE_TESTS: Final = frozenset(("ks", "chisquare", "z"))
DEFAULT_THRESHOLDS: Final = {
    "ks": 0.05,
    "chisquare": 0.05,
    "z": 0.05,
    "wasserstein": 0.1,
    "jensenshannon": 0.1,
    "psi": 0.1,
}
#: Evidently's small-sample boundary: a reference of at most this many values gets p-value tests.
SMALL_REFERENCE: Final = 1000
#: Numeric samples drawn from a quantile grid for KS are at most this long.
_KS_SAMPLE_CAP: Final = 200_000
#: scipy's ks_2samp computes the exact p-value while both samples are at most this long.
_KS_EXACT_N: Final = 10_000
_RANKS: Final = np.asarray(QUANTILE_RANKS, dtype=np.float64)
#: A many-valued side: more distinct values than any rule below looks at.
_MANY: Final = DISTINCT_LIMIT + 1
_LARGEST: Final = float(np.finfo(np.float64).max)


def choose_test(kind: Kind, reference_rows: int, distinct: int) -> str:
    """Evidently's default test for a column.

    Args:
        kind: the column's kind.
        reference_rows: the reference's values (nulls and +-inf dropped).
        distinct: distinct values of reference and current together.

    Returns:
        ``ks`` / ``chisquare`` / ``z`` for a reference of at most 1,000 values (numeric with
        more than 5 distinct values: KS; else chi-squared above 2 distinct values, Z-test at
        most 2); above 1,000: ``wasserstein`` for numeric with more than 5 distinct values,
        else ``jensenshannon``.
    """
    if kind not in ("numeric", "categorical"):
        raise InvalidParameter("a column's kind must be 'numeric' or 'categorical'")
    many = kind == "numeric" and distinct > 5
    if reference_rows <= SMALL_REFERENCE:
        if many:
            return "ks"
        return "chisquare" if distinct > 2 else "z"
    return "wasserstein" if many else "jensenshannon"


def drifted(test: str, statistic: float, threshold: float) -> bool:
    """Evidently's rule: KS ``p <= t``; chi-squared, Z ``p < t``; distances ``d >= t``.

    A NaN statistic (a degenerate test) is never drift, as in Evidently.
    """
    if test == "ks":
        return statistic <= threshold
    if test in P_VALUE_TESTS:
        return statistic < threshold
    return statistic >= threshold


def distinct_values(reference: ColumnSketch, current: ColumnSketch) -> int:
    """Distinct values of both sketches together (more than DISTINCT_LIMIT when unknown)."""
    ref, cur = _value_counts(reference), _value_counts(current)
    if ref is None or cur is None or OTHER in ref or OTHER in cur:
        return _MANY
    return len(set(ref) | set(cur))


def run_test(
    test: str, reference: ColumnSketch, current: ColumnSketch
) -> tuple[float, float | None]:
    """(statistic, p-value or None) of ``test`` on two sketches of one column.

    Raises:
        InvalidParameter: an unknown test, a test that does not fit the column (KS or
            Wasserstein on a categorical column; chi-squared or Z on a numeric column with
            many distinct values), or a side with no values to test.
    """
    if test not in _RUNNERS:
        raise InvalidParameter(f"unknown drift test {test!r}; known: {', '.join(TESTS)}")
    if reference.valid <= 0 or current.valid <= 0:
        raise InvalidParameter(f"column {reference.name!r} has no values to test on one side")
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        value = _RUNNERS[test](reference, current)
    if math.isnan(value):  # a degenerate statistic is no evidence of drift
        value = 1.0 if test in P_VALUE_TESTS else 0.0
    value = min(value, _LARGEST)  # an infinite distance stays JSON-able and above any threshold
    if test in P_VALUE_TESTS:
        return value, value
    return value, None


# --------------------------------------------------------------------------------------------
# Distributions from sketches
# --------------------------------------------------------------------------------------------


def _value_counts(sketch: ColumnSketch) -> dict[str, int] | None:
    """Value -> count of the sketch's valid values, when it knows them exactly."""
    if sketch.counts is not None:
        return dict(sketch.counts)
    if sketch.values is None:
        return None
    out: dict[str, int] = {}
    for value in sketch.values:
        key = numeric_key(float(value)) if sketch.kind == "numeric" else str(value)
        out[key] = out.get(key, 0) + 1
    return out


def _support(sketch: ColumnSketch) -> tuple[FloatArray, FloatArray] | None:
    """A numeric sketch's exact distribution: sorted distinct values and their counts."""
    if sketch.values is not None:
        values, counts = np.unique(np.asarray(sketch.values, dtype=np.float64), return_counts=True)
        return values, counts.astype(np.float64)
    if sketch.counts is not None:
        pairs = sorted((float(k), v) for k, v in sketch.counts.items() if v)
        return (
            np.asarray([p[0] for p in pairs], dtype=np.float64),
            np.asarray([p[1] for p in pairs], dtype=np.float64),
        )
    return None


def _grid(sketch: ColumnSketch) -> FloatArray:
    if sketch.quantiles is None:
        raise InvalidParameter(f"numeric column {sketch.name!r} has no quantiles")
    return np.asarray(sketch.quantiles, dtype=np.float64)


def _sample(sketch: ColumnSketch, size: int) -> FloatArray:
    """``size`` values distributed as the sketch: its exact values where ``size`` is its
    number of values, else values at evenly spaced ranks."""
    support = _support(sketch)
    ranks = (np.arange(size, dtype=np.float64) + 0.5) / size
    if support is not None:
        values, counts = support
        if size == int(counts.sum()):
            return np.repeat(values, counts.astype(np.int64))
        cumulative = np.cumsum(counts) / counts.sum()
        return values[np.minimum(np.searchsorted(cumulative, ranks), values.size - 1)]
    return np.interp(ranks, _RANKS, _grid(sketch))


def _cdf(sketch: ColumnSketch, points: FloatArray) -> FloatArray:
    """The share of the sketch's values at most each point."""
    support = _support(sketch)
    if support is not None:
        values, counts = support
        cumulative = np.concatenate(([0.0], np.cumsum(counts))) / counts.sum()
        return cast(FloatArray, cumulative[np.searchsorted(values, points, side="right")])
    out = _grid_cdf(_grid(sketch), points)
    if sketch.tails is None:
        return out
    # In the tails the sketch knows the values themselves: there the CDF is exact.
    low, high = (np.asarray(t, dtype=np.float64) for t in sketch.tails)
    n = sketch.valid
    below = np.searchsorted(low, points, side="right") / n
    above = 1.0 - (high.size - np.searchsorted(high, points, side="right")) / n
    out = np.where(points < low[-1], below, out)
    return np.where(points >= high[0], above, out)


def _grid_cdf(grid: FloatArray, points: FloatArray) -> FloatArray:
    """The CDF of a piecewise-linear quantile function."""
    # Right-continuous inverse of the piecewise-linear quantile function: at a tie (a run of
    # equal quantiles), the highest rank of the run.
    upper = np.searchsorted(grid, points, side="right")
    inside = (upper > 0) & (upper < grid.size)
    out = np.where(upper >= grid.size, 1.0, 0.0)
    lo = np.clip(upper - 1, 0, grid.size - 1)
    hi = np.clip(upper, 0, grid.size - 1)
    span = grid[hi] - grid[lo]
    frac = np.where(span > 0, (points - grid[lo]) / np.where(span > 0, span, 1.0), 1.0)
    interpolated = _RANKS[lo] + frac * (_RANKS[hi] - _RANKS[lo])
    return np.where(inside, interpolated, out)


def _atoms(sketch: ColumnSketch) -> tuple[FloatArray, FloatArray]:
    """Values and weights whose distribution is the sketch's (for Wasserstein)."""
    support = _support(sketch)
    if support is not None:
        return support
    grid = _grid(sketch)
    n = sketch.valid
    if sketch.tails is None or n <= 2 * len(sketch.tails[0]):
        return grid[:-1] / 2 + grid[1:] / 2, np.diff(_RANKS)
    # The tails' values are known: each is an atom of weight 1 / n; the grid covers the rest.
    low, high = (np.asarray(t, dtype=np.float64) for t in sketch.tails)
    cut = low.size / n
    ranks = np.concatenate(([cut], _RANKS[(cut < _RANKS) & (1 - cut > _RANKS)], [1 - cut]))
    middle = np.interp(ranks, _RANKS, grid)
    values = np.concatenate((low, middle[:-1] / 2 + middle[1:] / 2, high))
    weights = np.concatenate((np.full(low.size, 1 / n), np.diff(ranks), np.full(high.size, 1 / n)))
    return values, weights


# --------------------------------------------------------------------------------------------
# The tests
# --------------------------------------------------------------------------------------------


def _numeric_only(sketch: ColumnSketch, test: str) -> None:
    if sketch.kind != "numeric":
        raise InvalidParameter(f"{test} needs a numeric column; {sketch.name!r} is categorical")


def _ks(reference: ColumnSketch, current: ColumnSketch) -> float:
    _numeric_only(reference, "ks")
    from scipy import stats  # scipy loads on first use (1 s)

    n, m = reference.valid, current.valid
    ref = _sample(reference, min(n, _KS_SAMPLE_CAP))
    cur = _sample(current, min(m, _KS_SAMPLE_CAP))
    if n <= _KS_SAMPLE_CAP and m <= _KS_SAMPLE_CAP:
        # The samples have the true sizes: scipy picks its method as it would on raw data.
        return float(stats.ks_2samp(ref, cur).pvalue)
    d = float(stats.ks_2samp(ref, cur).statistic)
    big, small = max(n, m), min(n, m)
    return float(np.clip(stats.kstwo.sf(d, round(big * small / (big + small))), 0.0, 1.0))


def _category_pairs(
    reference: ColumnSketch, current: ColumnSketch, test: str
) -> tuple[FloatArray, FloatArray]:
    """Counts of reference and current over the categories of both (sorted)."""
    ref, cur = _value_counts(reference), _value_counts(current)
    if ref is None or cur is None:
        raise InvalidParameter(
            f"{test} needs value counts; column {reference.name!r} has too many distinct values"
        )
    keys = sorted(set(ref) | set(cur))
    return (
        np.asarray([ref.get(k, 0) for k in keys], dtype=np.float64),
        np.asarray([cur.get(k, 0) for k in keys], dtype=np.float64),
    )


def _chisquare(reference: ColumnSketch, current: ColumnSketch) -> float:
    ref, cur = _category_pairs(reference, current, "chisquare")
    from scipy import stats  # scipy loads on first use (1 s)

    expected = ref * (cur.sum() / ref.sum())
    return float(stats.chisquare(cur, expected).pvalue)


def _z(reference: ColumnSketch, current: ColumnSketch) -> float:
    ref, cur = _category_pairs(reference, current, "z")
    if (
        np.count_nonzero(ref) == 1
        and np.count_nonzero(cur) == 1
        and np.argmax(ref) == np.argmax(cur)
    ):
        return 1.0
    n1, n2 = ref.sum(), cur.sum()
    # The share of values *not* the first category (Evidently's indicator), each side.
    p1, p2 = 1 - ref[0] / n1, 1 - cur[0] / n2
    pooled = (p1 * n1 + p2 * n2) / (n1 + n2)
    spread = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    if spread == 0:  # one category on both sides (caught above): nothing moved
        return 1.0
    from scipy import stats  # scipy loads on first use (1 s)

    return float(2 * stats.norm.sf(abs((p1 - p2) / spread)))


def _wasserstein(reference: ColumnSketch, current: ColumnSketch) -> float:
    _numeric_only(reference, "wasserstein")
    ref_values, ref_weights = _atoms(reference)
    cur_values, cur_weights = _atoms(current)
    from scipy import stats  # scipy loads on first use (1 s)

    raw = stats.wasserstein_distance(ref_values, cur_values, ref_weights, cur_weights)
    return float(raw) / max(float(reference.std or 0.0), 0.001)


def _binned(reference: ColumnSketch, current: ColumnSketch) -> tuple[FloatArray, FloatArray]:
    """Shares of reference and current per bin, Evidently's binning (module docstring)."""
    ref_counts = _value_counts(reference)
    per_value = ref_counts is not None and len(ref_counts) <= 20
    if reference.kind == "categorical" or (per_value and _value_counts(current) is not None):
        ref, cur = _category_pairs(reference, current, "a binned test")
        return ref / ref.sum(), cur / cur.sum()
    low = min(float(reference.min or 0.0), float(current.min or 0.0))
    high = max(float(reference.max or 0.0), float(current.max or 0.0))
    size = reference.valid + current.valid
    width = (high - low) / (math.log2(size) + 1.0)
    bins = int(math.ceil((high - low) / width)) if width > 0 else 1
    edges = np.linspace(low, high, bins + 1)
    return _bin_shares(reference, edges), _bin_shares(current, edges)


def _bin_shares(sketch: ColumnSketch, edges: FloatArray) -> FloatArray:
    """Shares per bin of ``numpy.histogram`` (the last bin closed), from the sketch's CDF."""
    below = _cdf(sketch, np.nextafter(edges, -np.inf))  # share strictly below each edge
    below[-1] = 1.0  # the last bin holds the maximum
    below[0] = 0.0
    return np.diff(below)


def _jensenshannon(reference: ColumnSketch, current: ColumnSketch) -> float:
    ref, cur = _binned(reference, current)
    from scipy.spatial import distance  # scipy loads on first use (1 s)

    return float(distance.jensenshannon(ref, cur))


def _fill_zeroes(shares: FloatArray) -> FloatArray:
    smallest = float(shares[shares != 0].min())
    fill = smallest / 10**6 if smallest <= 0.0001 else 0.0001
    return np.where(shares == 0, fill, shares)


def _psi(reference: ColumnSketch, current: ColumnSketch) -> float:
    ref, cur = _binned(reference, current)
    ref, cur = _fill_zeroes(ref), _fill_zeroes(cur)
    return float(np.sum((ref - cur) * np.log(ref / cur)))


def psi(reference: ColumnSketch, current: ColumnSketch, *, bins: int = 30) -> float:
    """Population stability index of two sketches of one column, Evidently's definition.

    ``bins`` is kept for the callers that name it; as in Evidently (whose ``n_bins`` default
    is 30), a numeric column is cut by Sturges' rule and a few-valued one per value.

    Raises:
        InvalidParameter: a side with no values, ``bins`` below 1.
    """
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise InvalidParameter("psi's bins must be a positive integer")
    statistic, _ = run_test("psi", reference, current)
    return statistic


_RUNNERS: Final[dict[str, Callable[[ColumnSketch, ColumnSketch], float]]] = {
    "ks": _ks,
    "chisquare": _chisquare,
    "z": _z,
    "wasserstein": _wasserstein,
    "jensenshannon": _jensenshannon,
    "psi": _psi,
}
