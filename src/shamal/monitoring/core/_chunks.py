"""Chunked monitoring: a statistic per chunk of rows, bands from the reference's chunks.

A single verdict over a whole window hides *when* something broke and is swamped by sample
size (with a million rows every p-value is tiny). NannyML's answer, followed here: split the
stream into chunks (a fixed number of rows, or a period of a time key), compute one statistic
per chunk (a drift distance, a null rate, a performance metric), derive a band from the
statistic's values on the *reference's* chunks, and flag each monitored chunk whose value
falls outside that band. The reference's own chunk-to-chunk variation is thus the yardstick:
a statistic that wobbles a lot in the training data gets a wide band.

Semantics learnt from NannyML (``nannyml.chunk``, ``nannyml.thresholds``):

* size chunks are adjacent, never overlap, and a last incomplete chunk is kept, dropped or
  appended to the chunk before it (``incomplete="keep" | "drop" | "append"``, default keep);
* a count-based split uses ``n // number`` rows per chunk, then splits by size;
* the standard-deviation band is ``mean +- sigmas * std`` of the reference chunks' values,
  with the population standard deviation (``ddof=0``, as ``np.std``), each end clipped to the
  statistic's valid range (a distance is never below 0, an accuracy never above 1);
* a value is flagged when strictly below the lower or strictly above the upper end.

Everything here is pure: numpy arrays in, numbers and booleans out.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from shamal.errors import InvalidParameter
from shamal.monitoring.core._sketch import QUANTILE_RANKS, ColumnSketch

__all__ = [
    "DISTANCE_RANGE",
    "MAX_CHUNKS",
    "Band",
    "Incomplete",
    "Sides",
    "TimeChunk",
    "chunk_bands",
    "chunk_count_ranges",
    "chunk_quantile_bands",
    "chunk_ranges",
    "chunk_statistic",
    "chunk_statistics",
    "flag",
    "grid_ranks",
    "time_chunks",
]

logger = logging.getLogger(__name__)

Incomplete = Literal["keep", "drop", "append"]
Sides = Literal["both", "upper", "lower"]

#: The valid range of :func:`chunk_statistic` (both distances are non-negative; the
#: normed Wasserstein distance has no upper bound, Jensen-Shannon with natural logs is at
#: most sqrt(ln 2) but the looser bound keeps one range for both kinds).
DISTANCE_RANGE: Final = (0.0, math.inf)

#: The floor of the reference's standard deviation when norming the Wasserstein distance,
#: so a constant reference column does not divide by zero (Evidently uses the same floor).
_MIN_NORM: Final = 0.001

_RANKS: Final = np.asarray(QUANTILE_RANKS, dtype=np.float64)
_RANKS.setflags(write=False)

#: More chunks than this from one call is refused: a chunk size of 1 over a huge stream
#: would allocate a range per row, which is never what a monitor means.
MAX_CHUNKS: Final = 1_000_000


@dataclass(frozen=True, slots=True)
class Band:
    """The band a chunk statistic is expected to stay in.

    Attributes:
        lower: the lowest value not flagged (``-inf`` when unbounded).
        upper: the highest value not flagged (``inf`` when unbounded).
        mean: the mean of the reference chunks' values.
        std: their population standard deviation.
    """

    lower: float
    upper: float
    mean: float
    std: float

    def to_json(self) -> dict[str, Any]:
        """A JSON object; infinite ends become ``None`` (JSON has no infinity)."""
        return {
            "lower": None if math.isinf(self.lower) else self.lower,
            "upper": None if math.isinf(self.upper) else self.upper,
            "mean": self.mean,
            "std": self.std,
        }

    @classmethod
    def from_json(cls, raw: Any) -> Band:
        """The band :meth:`to_json` wrote (``None`` ends are unbounded).

        Raises:
            InvalidParameter: not such an object: missing or extra keys, values that are not
                finite numbers, a negative std, or ``lower > upper``.
        """
        if not isinstance(raw, dict) or set(raw) != {"lower", "upper", "mean", "std"}:
            raise InvalidParameter("a band is an object with lower, upper, mean and std")
        lower = -math.inf if raw["lower"] is None else _json_number(raw["lower"], "lower")
        upper = math.inf if raw["upper"] is None else _json_number(raw["upper"], "upper")
        mean, std = _json_number(raw["mean"], "mean"), _json_number(raw["std"], "std")
        if std < 0 or lower > upper:
            raise InvalidParameter(
                "a band's std must not be negative nor its lower end above its upper"
            )
        return cls(lower=lower, upper=upper, mean=mean, std=std)


@dataclass(frozen=True, slots=True)
class TimeChunk:
    """The rows of one period of a time key.

    Attributes:
        start: the period's first key value (inclusive).
        stop: the first key value after the period (exclusive).
        rows: the positions of the period's rows in the input, ascending.
    """

    start: float
    stop: float
    rows: NDArray[np.intp]


def chunk_ranges(
    n: int, size: int, *, incomplete: Incomplete = "keep"
) -> tuple[tuple[int, int], ...]:
    """Half-open ``(start, stop)`` row ranges of adjacent chunks of ``size`` rows over ``n``.

    Args:
        n: the number of rows (0 gives no chunks).
        size: rows per chunk, at least 1.
        incomplete: what becomes of the last ``n % size`` rows: ``keep`` (a smaller chunk of
            their own), ``drop`` (left out) or ``append`` (added to the last full chunk; kept
            as their own chunk when there is no full chunk).

    Raises:
        InvalidParameter: ``n`` negative, ``size`` below 1, an unknown ``incomplete``, or more
            than :data:`MAX_CHUNKS` chunks.
    """
    _check_int("n", n, minimum=0)
    _check_int("size", size, minimum=1)
    if incomplete not in ("keep", "drop", "append"):
        raise InvalidParameter("incomplete must be one of keep, drop, append")
    full, rest = divmod(n, size)
    if full + 1 > MAX_CHUNKS:
        raise InvalidParameter(
            f"a chunk size of {size} over {n} rows gives more than {MAX_CHUNKS} chunks"
        )
    ranges = [(i * size, (i + 1) * size) for i in range(full)]
    if rest:
        if incomplete == "keep" or (incomplete == "append" and not ranges):
            ranges.append((full * size, n))
        elif incomplete == "append":
            ranges[-1] = (ranges[-1][0], n)
    return tuple(ranges)


def chunk_count_ranges(
    n: int, number: int, *, incomplete: Incomplete = "keep"
) -> tuple[tuple[int, int], ...]:
    """Row ranges splitting ``n`` rows into about ``number`` chunks of ``n // number`` rows.

    As NannyML's count-based chunker: the size is ``n // number`` and the leftover rows follow
    ``incomplete``; fewer rows than ``number`` give one chunk per row.

    Raises:
        InvalidParameter: ``n`` negative or ``number`` below 1.
    """
    _check_int("n", n, minimum=0)
    _check_int("number", number, minimum=1)
    if n == 0:
        return ()
    return chunk_ranges(n, max(1, n // number), incomplete=incomplete)


def time_chunks(keys: ArrayLike, width: float, *, origin: float = 0.0) -> tuple[TimeChunk, ...]:
    """Group rows by periods of a time key: period ``p`` holds keys in
    ``[origin + p * width, origin + (p + 1) * width)``.

    Keys are numbers (e.g. epoch seconds) or ``datetime64`` values (taken as seconds since the
    epoch). Rows need not be sorted; empty periods give no chunk (as NannyML's period chunker,
    which groups the rows it has).

    Raises:
        InvalidParameter: ``width`` not a positive finite number, ``origin`` not finite, a key
            that is NaN, infinite or NaT, or keys that are not one-dimensional numbers.
    """
    if not _finite_number(width) or width <= 0:
        raise InvalidParameter("width must be a positive finite number")
    if not _finite_number(origin):
        raise InvalidParameter("origin must be a finite number")
    seconds = _key_seconds(keys)
    if seconds.size == 0:
        return ()
    periods = np.floor((seconds - origin) / width)
    order = np.argsort(periods, kind="stable")
    uniques, starts = np.unique(periods[order], return_index=True)
    if uniques.size > MAX_CHUNKS:
        raise InvalidParameter(f"a width of {width:g} gives more than {MAX_CHUNKS} chunks")
    bounds = [*starts.tolist(), order.size]
    return tuple(
        TimeChunk(
            start=origin + float(period) * width,
            stop=origin + (float(period) + 1.0) * width,
            rows=np.sort(order[bounds[i] : bounds[i + 1]]),
        )
        for i, period in enumerate(uniques)
    )


def chunk_statistics(
    values: ArrayLike,
    chunks: Sequence[tuple[int, int] | TimeChunk],
    statistic: Callable[[NDArray[Any]], float],
) -> NDArray[np.float64]:
    """``statistic`` of each chunk of ``values`` (row ranges or time chunks), as a float array.

    Raises:
        InvalidParameter: a range outside ``values``.
    """
    array = np.asarray(values)
    out = np.empty(len(chunks), dtype=np.float64)
    for i, chunk in enumerate(chunks):
        if isinstance(chunk, TimeChunk):
            if chunk.rows.size and (chunk.rows.min() < 0 or chunk.rows.max() >= len(array)):
                raise InvalidParameter("a chunk's rows lie outside the values")
            part = array[chunk.rows]
        else:
            start, stop = chunk
            if not 0 <= start <= stop <= len(array):
                raise InvalidParameter("a chunk's range lies outside the values")
            part = array[start:stop]
        out[i] = float(statistic(part))
    return out


def chunk_bands(
    chunk_values: ArrayLike,
    *,
    sigmas: float = 3.0,
    valid: tuple[float, float] = (-math.inf, math.inf),
    sides: Sides = "both",
) -> Band:
    """NannyML's standard-deviation band: ``mean +- sigmas * std`` of the reference chunks'
    values (population std), each end clipped to ``valid``.

    ``sides="upper"`` leaves the lower end at ``valid``'s low end (NannyML's lower multiplier
    of None): right for a drift distance, where a chunk *closer* to the reference than usual
    is no alarm. ``sides="lower"`` does the same for the upper end (an accuracy that rises is
    no alarm). NaN values (a chunk where the statistic is undefined) are left out. Values
    near the float limits are scaled before squaring, so they give a finite mean and std.

    Raises:
        InvalidParameter: no finite value, an infinite value, ``sigmas`` negative or not
            finite, ``valid`` not an ordered pair of numbers, or an unknown ``sides``.
    """
    if not _finite_number(sigmas) or sigmas < 0:
        raise InvalidParameter("sigmas must be a finite number, at least 0")
    if sides not in ("both", "upper", "lower"):
        raise InvalidParameter("sides must be one of both, upper, lower")
    finite = _reference_values(chunk_values)
    low, high = _valid_range(valid)
    mean, std = _mean_std(finite)
    with np.errstate(over="ignore"):
        lower = low if sides == "upper" else float(np.float64(mean) - np.float64(sigmas) * std)
        upper = high if sides == "lower" else float(np.float64(mean) + np.float64(sigmas) * std)
    return Band(lower=_clip(lower, low, high), upper=_clip(upper, low, high), mean=mean, std=std)


def chunk_quantile_bands(
    chunk_values: ArrayLike,
    *,
    low: float = 0.05,
    high: float = 0.95,
    valid: tuple[float, float] = (-math.inf, math.inf),
) -> Band:
    """A band from quantiles of the reference chunks' values: ``[q(low), q(high)]`` (numpy's
    linear interpolation), clipped to ``valid``. Robust where a few reference chunks are
    outliers that would inflate a standard deviation.

    Raises:
        InvalidParameter: as :func:`chunk_bands`, or ``0 <= low <= high <= 1`` not holding.
    """
    if not (_finite_number(low) and _finite_number(high) and 0.0 <= low <= high <= 1.0):
        raise InvalidParameter("quantiles must satisfy 0 <= low <= high <= 1")
    finite = _reference_values(chunk_values)
    lo, hi = _valid_range(valid)
    lower, upper = np.quantile(finite, [low, high])
    return Band(
        lower=_clip(float(lower), lo, hi),
        upper=_clip(float(upper), lo, hi),
        mean=_mean_std(finite)[0],
        std=_mean_std(finite)[1],
    )


def flag(values: ArrayLike, band: Band) -> NDArray[np.bool_]:
    """Which values fall strictly outside ``band``. NaN (an undefined statistic) is not flagged:
    there is nothing to alert on, and the caller sees the NaN itself."""
    array = np.asarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return np.asarray((array < band.lower) | (array > band.upper), dtype=np.bool_)


def chunk_statistic(reference: ColumnSketch, chunk: ColumnSketch) -> float:
    """The drift distance of one chunk's sketch from the reference sketch.

    * numeric: the Wasserstein distance between the two columns, divided by the reference's
      standard deviation (floored at 0.001), Evidently's "normed Wasserstein". Exact values
      are used where a sketch keeps them, else its quantile grid, each grid value weighted
      by the rank mass around it (see :func:`grid_ranks`);
    * categorical: the Jensen-Shannon distance (natural logarithm, scipy's default) between
      the category frequencies over the union of categories.

    Returns NaN when either side has no present values (no distance is defined).

    Raises:
        InvalidParameter: the kinds differ, or a numeric sketch has neither values nor
            quantiles.
    """
    if reference.kind != chunk.kind:
        raise InvalidParameter(
            f"column {reference.name[:80]!r} changed kind: {reference.kind} vs {chunk.kind}"
        )
    if reference.kind == "categorical":
        return _js_distance(reference, chunk)
    ref_points, ref_weights = _numeric_points(reference)
    cur_points, cur_weights = _numeric_points(chunk)
    if ref_points.size == 0 or cur_points.size == 0:
        return math.nan
    norm = (
        reference.std
        if reference.std is not None and math.isfinite(reference.std)
        else float(np.std(ref_points))
    )
    from scipy.stats import wasserstein_distance  # scipy loads on first use (1 s)

    distance = wasserstein_distance(ref_points, cur_points, ref_weights, cur_weights)
    return float(distance / max(norm, _MIN_NORM))


def grid_ranks(size: int) -> NDArray[np.float64]:
    """The ranks of a quantile grid of ``size`` values: the sketch module's
    :data:`QUANTILE_RANKS` when the grid has their length (the sketches a builder makes), else
    ``size`` evenly spaced ranks from 0 to 1 (a grid built by hand)."""
    if size == len(QUANTILE_RANKS):
        return _RANKS
    return np.linspace(0.0, 1.0, size)


def _numeric_points(
    sketch: ColumnSketch,
) -> tuple[NDArray[np.float64], NDArray[np.float64] | None]:
    """Points standing for a numeric sketch's distribution, and their weights: its exact
    values (equal weights: None), else its quantile grid, each point weighted by the rank
    mass nearest to it (half the rank gap on each side), so a grid that is finer in the
    tails does not over-weight them."""
    if sketch.values is not None:
        points = np.asarray([v for v in sketch.values if not isinstance(v, str)], dtype=np.float64)
        return points[np.isfinite(points)], None
    if sketch.quantiles:
        points = np.asarray(sketch.quantiles, dtype=np.float64)
        if points.size == 1:
            return points[np.isfinite(points)], None
        gaps = np.diff(grid_ranks(points.size))
        weights = np.concatenate([gaps, [0.0]]) / 2 + np.concatenate([[0.0], gaps]) / 2
        keep = np.isfinite(points) & (weights > 0)
        return points[keep], weights[keep]
    if sketch.valid <= 0:
        return np.empty(0, dtype=np.float64), None
    raise InvalidParameter(
        f"sketch of column {sketch.name[:80]!r} has neither values nor quantiles"
    )


def _js_distance(reference: ColumnSketch, chunk: ColumnSketch) -> float:
    ref_counts = _counts(reference)
    cur_counts = _counts(chunk)
    keys = sorted(set(ref_counts) | set(cur_counts))
    p = np.asarray([ref_counts.get(key, 0) for key in keys], dtype=np.float64)
    q = np.asarray([cur_counts.get(key, 0) for key in keys], dtype=np.float64)
    if p.sum() <= 0 or q.sum() <= 0:
        return math.nan
    from scipy.spatial.distance import jensenshannon

    return float(jensenshannon(p / p.sum(), q / q.sum()))


def _counts(sketch: ColumnSketch) -> dict[str, int]:
    if sketch.counts is not None:
        return dict(sketch.counts)
    counts: dict[str, int] = {}
    for value in sketch.values or ():
        counts[str(value)] = counts.get(str(value), 0) + 1
    return counts


def _reference_values(chunk_values: ArrayLike) -> NDArray[np.float64]:
    try:
        array = np.asarray(chunk_values, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        raise InvalidParameter("reference chunk values must be numbers") from None
    if np.isinf(array).any():
        raise InvalidParameter("reference chunk values must not be infinite")
    finite = array[np.isfinite(array)]
    if finite.size == 0:
        raise InvalidParameter("a band needs at least one reference chunk with a defined value")
    return finite


def _mean_std(values: NDArray[np.float64]) -> tuple[float, float]:
    """Mean and population std, computed on values scaled to at most 1 in magnitude so that
    huge values neither overflow the sum nor the squares."""
    scale = float(np.max(np.abs(values)))
    if scale == 0.0:
        return 0.0, 0.0
    scaled = values / scale
    return float(np.mean(scaled) * scale), float(np.std(scaled) * scale)


def _valid_range(valid: tuple[float, float]) -> tuple[float, float]:
    try:
        low, high = (float(v) for v in valid)
    except (TypeError, ValueError):
        raise InvalidParameter("valid must be a pair of numbers (low, high)") from None
    if math.isnan(low) or math.isnan(high) or low > high:
        raise InvalidParameter("valid must be an ordered pair of numbers (low, high)")
    return low, high


def _clip(value: float, low: float, high: float) -> float:
    return min(max(value, low), high)


def _key_seconds(keys: ArrayLike) -> NDArray[np.float64]:
    array = np.asarray(keys)
    if array.ndim != 1:
        raise InvalidParameter("time keys must be one-dimensional")
    if np.issubdtype(array.dtype, np.datetime64):
        if np.isnat(array).any():
            raise InvalidParameter("time keys must not be NaT")
        # in the array's own unit, so far-off dates do not overflow a nanosecond int64
        seconds = np.asarray(
            (array - np.datetime64(0, "s")) / np.timedelta64(1, "s"), dtype=np.float64
        )
    elif np.issubdtype(array.dtype, np.number) and not np.issubdtype(
        array.dtype, np.complexfloating
    ):
        seconds = array.astype(np.float64)
    else:
        raise InvalidParameter("time keys must be numbers or datetime64 values")
    if not np.isfinite(seconds).all():
        raise InvalidParameter("time keys must be finite")
    return seconds


def _json_number(value: Any, what: str) -> float:
    if not _finite_number(value):
        raise InvalidParameter(f"a band's {what} must be a finite number")
    return float(value)


def _finite_number(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond any float
        return False


def _check_int(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise InvalidParameter(f"{name} must be an integer, at least {minimum}")
