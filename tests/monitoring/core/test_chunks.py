"""Chunked monitoring: chunk splits, bands and flags against slow obvious references, and
the chunk drift distance against scipy on the raw values."""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial.distance import jensenshannon
from scipy.stats import wasserstein_distance

from shamal.errors import InvalidParameter
from shamal.monitoring.core._chunks import (
    MAX_CHUNKS,
    Band,
    TimeChunk,
    chunk_bands,
    chunk_count_ranges,
    chunk_quantile_bands,
    chunk_ranges,
    chunk_statistic,
    chunk_statistics,
    flag,
    grid_ranks,
    time_chunks,
)
from shamal.monitoring.core._sketch import QUANTILE_RANKS, ColumnSketch, SketchBuilder


def numeric_sketch(raw: Sequence[float], *, grid: int = 101, exact: bool = True) -> ColumnSketch:
    values = np.asarray(raw, dtype=float)
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return ColumnSketch("x", "numeric", len(raw), nulls=int(np.isnan(values).sum()))
    return ColumnSketch(
        "x",
        "numeric",
        len(raw),
        nulls=int(np.isnan(values).sum()),
        min=float(finite.min()),
        max=float(finite.max()),
        mean=float(finite.mean()),
        std=float(finite.std()),
        quantiles=tuple(float(q) for q in np.quantile(finite, np.linspace(0, 1, grid))),
        values=tuple(float(v) for v in finite) if exact else None,
    )


def categorical_sketch(raw: Sequence[str]) -> ColumnSketch:
    return ColumnSketch("c", "categorical", len(raw), counts=dict(Counter(raw)))


# --- splitting -----------------------------------------------------------------------------


def slow_size_chunks(n: int, size: int, incomplete: str) -> list[list[int]]:
    """Chunks of row numbers by slicing a list, the obvious way."""
    rows = list(range(n))
    chunks = [rows[i : i + size] for i in range(0, n, size)]
    if chunks and len(chunks[-1]) < size:
        if incomplete == "drop":
            chunks.pop()
        elif incomplete == "append" and len(chunks) > 1:
            last = chunks.pop()
            chunks[-1] = chunks[-1] + last
    return chunks


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 500), st.integers(1, 60), st.sampled_from(["keep", "drop", "append"]))
def test_size_chunks_match_slicing(n: int, size: int, incomplete: str) -> None:
    ranges = chunk_ranges(n, size, incomplete=incomplete)  # type: ignore[arg-type]
    assert [list(range(a, b)) for a, b in ranges] == slow_size_chunks(n, size, incomplete)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 500), st.integers(1, 40), st.sampled_from(["keep", "drop", "append"]))
def test_count_chunks_use_n_floordiv_number_rows(n: int, number: int, incomplete: str) -> None:
    ranges = chunk_count_ranges(n, number, incomplete=incomplete)  # type: ignore[arg-type]
    expected = slow_size_chunks(n, max(1, n // number), incomplete) if n else []
    assert [list(range(a, b)) for a, b in ranges] == expected


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=0, max_size=200),
    st.floats(0.5, 1e5),
    st.floats(-1e3, 1e3),
)
def test_time_chunks_group_rows_by_period(keys: list[float], width: float, origin: float) -> None:
    chunks = time_chunks(np.asarray(keys, dtype=float), width, origin=origin)
    expected: dict[int, list[int]] = defaultdict(list)
    for row, key in enumerate(keys):
        expected[math.floor((key - origin) / width)].append(row)
    assert [chunk.rows.tolist() for chunk in chunks] == [expected[p] for p in sorted(expected)]
    for chunk in chunks:
        assert chunk.stop - chunk.start == pytest.approx(width)
        for row in chunk.rows:
            # float rounding near a boundary may move a key by one ulp; the period is the floor
            assert chunk.start - 1e-6 * width <= keys[row] < chunk.stop + 1e-6 * width


def test_time_chunks_of_datetimes_by_the_hour() -> None:
    keys = np.array(
        [
            "2026-11-27T10:59:59",
            "2026-11-27T10:00:00",
            "2026-11-27T12:30:00",
            "2026-11-27T10:30:00",
        ],
        dtype="datetime64[s]",
    )
    chunks = time_chunks(keys, 3600.0)
    assert [c.rows.tolist() for c in chunks] == [[0, 1, 3], [2]]  # 11:00-12:00 is empty: no chunk
    start = (np.datetime64("2026-11-27T10:00:00") - np.datetime64(0, "s")) / np.timedelta64(1, "s")
    assert chunks[0].start == start
    far = np.array(["2900-01-01T00:00:00.000000001"], dtype="datetime64[ns]")
    assert len(time_chunks(far, 86400.0)) == 1


def test_chunk_statistics_over_ranges_and_time_chunks() -> None:
    values = np.arange(10, dtype=float)
    by_size = chunk_statistics(values, chunk_ranges(10, 4), np.mean)
    assert by_size.tolist() == [1.5, 5.5, 8.5]
    by_time = chunk_statistics(values, time_chunks(values % 2, 1.0), np.sum)
    assert by_time.tolist() == [0 + 2 + 4 + 6 + 8, 1 + 3 + 5 + 7 + 9]
    with pytest.raises(InvalidParameter):
        chunk_statistics(values, [(5, 11)], np.mean)
    with pytest.raises(InvalidParameter):
        chunk_statistics(values, [TimeChunk(0.0, 1.0, np.array([10]))], np.mean)


# --- bands and flags -----------------------------------------------------------------------

chunk_values = st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(chunk_values, st.floats(0, 10), st.floats(-1e6, 1e6), st.floats(0, 1e6))
def test_sigma_band_is_mean_plus_minus_population_std_clipped(
    values: list[float], sigmas: float, low: float, width: float
) -> None:
    band = chunk_bands(values, sigmas=sigmas, valid=(low, low + width))
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    tol = 1e-9 * (1 + abs(mean) + std * sigmas)
    assert band.mean == pytest.approx(mean, abs=tol)
    assert band.std == pytest.approx(std, rel=1e-6, abs=1e-6)
    assert band.lower == pytest.approx(
        min(max(mean - sigmas * std, low), low + width), abs=tol + 1e-6 * sigmas
    )
    assert band.upper == pytest.approx(
        min(max(mean + sigmas * std, low), low + width), abs=tol + 1e-6 * sigmas
    )
    assert low <= band.lower <= band.upper <= low + width


@settings(max_examples=200, deadline=None)
@given(chunk_values, st.floats(0, 0.5), st.floats(0.5, 1))
def test_quantile_band_matches_numpy(values: list[float], low: float, high: float) -> None:
    band = chunk_quantile_bands(values, low=low, high=high)
    expected_low, expected_high = np.quantile(np.asarray(values), [low, high])
    assert (band.lower, band.upper) == (pytest.approx(expected_low), pytest.approx(expected_high))


def test_nan_reference_chunks_are_left_out_of_the_band() -> None:
    assert chunk_bands([1.0, math.nan, 3.0], sigmas=1.0) == chunk_bands([1.0, 3.0], sigmas=1.0)
    assert chunk_bands([1.0, math.nan, 3.0], sigmas=1.0) == Band(
        lower=1.0, upper=3.0, mean=2.0, std=1.0
    )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True)), max_size=50),
    st.floats(-10, 10),
    st.floats(0, 10),
)
def test_flag_is_strictly_outside_and_never_nan(
    values: list[float], lower: float, width: float
) -> None:
    band = Band(lower=lower, upper=lower + width, mean=lower, std=0.0)
    flags = flag(values, band)
    assert flags.tolist() == [
        (not math.isnan(v)) and (v < band.lower or v > band.upper) for v in values
    ]


def test_band_to_json_has_no_infinities() -> None:
    assert Band(-math.inf, math.inf, 0.0, 1.0).to_json() == {
        "lower": None,
        "upper": None,
        "mean": 0.0,
        "std": 1.0,
    }


@settings(max_examples=100, deadline=None)
@given(chunk_values, st.floats(0, 5), st.sampled_from(["both", "upper", "lower"]))
def test_band_json_round_trips(values: list[float], sigmas: float, sides: str) -> None:
    band = chunk_bands(values, sigmas=sigmas, sides=sides)  # type: ignore[arg-type]
    assert Band.from_json(json.loads(json.dumps(band.to_json()))) == band


@pytest.mark.parametrize(
    "raw",
    [
        None,
        [],
        {"lower": 0.0, "upper": 1.0, "mean": 0.5},
        {"lower": 0.0, "upper": 1.0, "mean": 0.5, "std": 0.1, "extra": 1},
        {"lower": "0", "upper": 1.0, "mean": 0.5, "std": 0.1},
        {"lower": 0.0, "upper": 1.0, "mean": math.nan, "std": 0.1},
        {"lower": 0.0, "upper": 1.0, "mean": 0.5, "std": -0.1},
        {"lower": 2.0, "upper": 1.0, "mean": 0.5, "std": 0.1},
        {"lower": True, "upper": 1.0, "mean": 0.5, "std": 0.1},
        {"lower": 0.0, "upper": 1.0, "mean": 10**400, "std": 0.1},
    ],
)
def test_hostile_band_json_is_refused(raw: object) -> None:
    with pytest.raises(InvalidParameter, match="band"):
        Band.from_json(raw)


# --- the chunk drift distance --------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.floats(-1e3, 1e3), min_size=2, max_size=80),
    st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=80),
)
def test_numeric_distance_with_exact_values_is_normed_scipy_wasserstein(
    ref: list[float], cur: list[float]
) -> None:
    expected = wasserstein_distance(ref, cur) / max(float(np.std(ref)), 0.001)
    assert chunk_statistic(numeric_sketch(ref), numeric_sketch(cur)) == pytest.approx(
        expected, rel=1e-9, abs=1e-9
    )


def test_numeric_distance_from_quantile_grids_approximates_the_exact_one() -> None:
    rng = np.random.default_rng(3)
    ref = rng.normal(0, 1, 5000)
    cur = rng.normal(0.3, 1.2, 5000)
    exact = wasserstein_distance(ref, cur) / ref.std()
    grid = chunk_statistic(numeric_sketch(ref, exact=False), numeric_sketch(cur, exact=False))
    assert grid == pytest.approx(exact, rel=0.05)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from("abcde"), min_size=1, max_size=60),
    st.lists(st.sampled_from("abcdef"), min_size=1, max_size=60),
)
def test_categorical_distance_is_scipy_jensen_shannon(ref: list[str], cur: list[str]) -> None:
    keys = sorted(set(ref) | set(cur))
    p = np.array([ref.count(k) for k in keys], dtype=float) / len(ref)
    q = np.array([cur.count(k) for k in keys], dtype=float) / len(cur)
    assert chunk_statistic(categorical_sketch(ref), categorical_sketch(cur)) == pytest.approx(
        jensenshannon(p, q), abs=1e-12
    )


def test_distance_is_nan_without_values_and_refuses_changed_kinds() -> None:
    assert math.isnan(chunk_statistic(numeric_sketch([1.0, 2.0]), numeric_sketch([math.nan])))
    assert math.isnan(
        chunk_statistic(categorical_sketch(["a"]), ColumnSketch("c", "categorical", 3, nulls=3))
    )
    with pytest.raises(InvalidParameter, match="changed kind"):
        chunk_statistic(numeric_sketch([1.0]), categorical_sketch(["a"]))
    with pytest.raises(InvalidParameter, match="neither values nor quantiles"):
        chunk_statistic(numeric_sketch([1.0]), ColumnSketch("x", "numeric", 5))


def test_shifted_chunks_breach_the_band_of_reference_chunks() -> None:
    """The NannyML workflow end to end: reference chunks give the band, a shift breaches it.

    A 3-sigma band is a statistical statement, so it is checked as one: over several
    independent runs every shifted chunk is flagged and unshifted chunks rarely are."""
    false_alarms = unshifted = 0
    for seed in range(8):
        rng = np.random.default_rng(seed)
        reference = rng.normal(0, 1, 20_000)
        whole = numeric_sketch(reference, exact=False)

        def distance(part: np.ndarray, whole: ColumnSketch = whole) -> float:
            return chunk_statistic(whole, numeric_sketch(part))

        ref_stats = chunk_statistics(reference, chunk_ranges(reference.size, 1000), distance)
        band = chunk_bands(ref_stats, sigmas=3.0, valid=(0.0, math.inf), sides="upper")
        assert band.lower == 0.0
        assert band.upper == pytest.approx(ref_stats.mean() + 3 * ref_stats.std())
        monitored = np.concatenate([rng.normal(0, 1, 3000), rng.normal(0.8, 1, 2000)])
        flags = flag(
            chunk_statistics(monitored, chunk_ranges(monitored.size, 1000), distance), band
        )
        assert flags[3:].all()
        false_alarms += int(flags[:3].sum())
        unshifted += 3
    assert false_alarms / unshifted <= 0.1


def test_one_sided_bands_leave_the_other_end_at_the_valid_range() -> None:
    values = [0.8, 0.9, 1.0]
    both = chunk_bands(values, sigmas=1.0)
    upper = chunk_bands(values, sigmas=1.0, valid=(0.0, 1.0), sides="upper")
    lower = chunk_bands(values, sigmas=1.0, valid=(0.0, 1.0), sides="lower")
    assert (upper.lower, upper.upper) == (0.0, pytest.approx(both.upper))
    assert (lower.lower, lower.upper) == (pytest.approx(both.lower), 1.0)
    assert chunk_bands(values, sides="upper").lower == -math.inf
    with pytest.raises(InvalidParameter, match="sides"):
        chunk_bands(values, sides="middle")  # type: ignore[arg-type]


# --- hostile input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "size", "incomplete"),
    [
        (10, 0, "keep"),
        (10, -1, "keep"),
        (-1, 3, "keep"),
        (10, 3, "merge"),
        (10, True, "keep"),
        (10.0, 3, "keep"),
    ],
)
def test_bad_chunk_sizes_are_refused(n: int, size: int, incomplete: str) -> None:
    with pytest.raises(InvalidParameter):
        chunk_ranges(n, size, incomplete=incomplete)  # type: ignore[arg-type]


def test_too_many_chunks_are_refused_before_allocating() -> None:
    with pytest.raises(InvalidParameter, match="more than"):
        chunk_ranges(10**15, 1)
    assert len(chunk_ranges(10**15, 10**15 // 3)) == 4
    with pytest.raises(InvalidParameter):
        chunk_count_ranges(10, 0)
    with pytest.raises(InvalidParameter, match="more than"):
        time_chunks(np.arange(MAX_CHUNKS + 1, dtype=float), 1.0)


@pytest.mark.parametrize(
    "keys",
    [
        np.array([1.0, math.nan]),
        np.array([1.0, math.inf]),
        np.array(["2026-01-01", "NaT"], dtype="datetime64[s]"),
        np.array(["a", "b"]),
        np.array([[1.0, 2.0]]),
        np.array([1 + 1j]),
    ],
)
def test_hostile_time_keys_are_refused(keys: np.ndarray) -> None:
    with pytest.raises(InvalidParameter, match="time keys"):
        time_chunks(keys, 1.0)


@pytest.mark.parametrize("width", [0.0, -1.0, math.nan, math.inf, True])
def test_bad_widths_are_refused(width: float) -> None:
    with pytest.raises(InvalidParameter, match="width"):
        time_chunks(np.array([1.0]), width)


@pytest.mark.parametrize(
    ("values", "kwargs", "match"),
    [
        ([], {}, "at least one"),
        ([math.nan, math.nan], {}, "at least one"),
        ([1.0, math.inf], {}, "infinite"),
        (["a", "b"], {}, "numbers"),
        ([1.0], {"sigmas": -1.0}, "sigmas"),
        ([1.0], {"sigmas": math.nan}, "sigmas"),
        ([1.0], {"valid": (1.0, 0.0)}, "ordered"),
        ([1.0], {"valid": (math.nan, 1.0)}, "ordered"),
        ([1.0], {"valid": ("a", 1.0)}, "pair"),
    ],
)
def test_hostile_band_inputs_are_refused(
    values: list[object], kwargs: dict[str, object], match: str
) -> None:
    with pytest.raises(InvalidParameter, match=match):
        chunk_bands(values, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("low", "high"), [(0.6, 0.4), (-0.1, 0.5), (0.5, 1.1), (math.nan, 0.5)])
def test_bad_quantiles_are_refused(low: float, high: float) -> None:
    with pytest.raises(InvalidParameter, match="quantiles"):
        chunk_quantile_bands([1.0, 2.0], low=low, high=high)


def test_huge_reference_values_keep_a_finite_band() -> None:
    band = chunk_bands([1e300, -1e300, 1e300], sigmas=0.5)
    assert band.mean == pytest.approx(1e300 / 3)
    assert band.std == pytest.approx(math.sqrt(8 / 9) * 1e300)
    assert math.isfinite(band.lower)
    assert math.isfinite(band.upper)
    wide = chunk_bands([1.7e308, -1.7e308], sigmas=3.0)  # the band itself overflows: unbounded
    assert (wide.lower, wide.upper) == (-math.inf, math.inf)
    assert chunk_bands([0.0, 0.0]) == Band(0.0, 0.0, 0.0, 0.0)


# --- with the sketch builder's grid (finer in the tails) -----------------------------------


def built(values: np.ndarray, kind: str = "numeric") -> ColumnSketch:
    builder = SketchBuilder({"x": kind})  # type: ignore[dict-item]
    builder.update({"x": values})
    return builder.result()["x"]


def test_grid_ranks_are_the_builders_ranks_for_its_grids() -> None:
    assert grid_ranks(len(QUANTILE_RANKS)).tolist() == list(QUANTILE_RANKS)
    assert grid_ranks(5).tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]


@pytest.mark.parametrize(
    ("make_ref", "make_cur"),
    [
        (lambda rng: rng.normal(0, 1, 50_000), lambda rng: rng.normal(0.2, 1, 50_000)),
        (lambda rng: rng.exponential(1, 50_000), lambda rng: rng.exponential(1.3, 50_000)),
        (lambda rng: rng.lognormal(0, 0.5, 50_000), lambda rng: rng.lognormal(0.1, 0.5, 50_000)),
    ],
)
def test_distance_of_built_sketches_is_close_to_the_exact_distance(
    make_ref: object, make_cur: object
) -> None:
    rng = np.random.default_rng(4)
    ref, cur = make_ref(rng), make_cur(rng)  # type: ignore[operator]
    reference, current = built(ref), built(cur)
    assert reference.values is None  # the grids, not exact values, are compared
    exact = wasserstein_distance(ref, cur) / ref.std()
    assert chunk_statistic(reference, current) == pytest.approx(exact, rel=0.05)


def test_distance_of_a_sketch_against_itself_is_zero() -> None:
    sketch = built(np.random.default_rng(6).lognormal(0, 2, 20_000))
    assert chunk_statistic(sketch, sketch) == 0.0
    categories = built(np.array(["a", "b", "b", None], dtype=object), "categorical")
    assert chunk_statistic(categories, categories) == 0.0


def test_grid_points_are_weighted_by_their_rank_mass() -> None:
    """On a grid of exact quantiles at the builder's ranks (finer in the tails), the distance
    matches the exact one closely; weighting the 16 tail points like the others would not."""
    rng = np.random.default_rng(8)
    ref, cur = rng.exponential(1, 100_000), rng.exponential(1.5, 100_000)

    def grid_sketch(values: np.ndarray) -> ColumnSketch:
        quantiles = np.quantile(values, QUANTILE_RANKS)
        return ColumnSketch(
            "x",
            "numeric",
            values.size,
            min=float(values.min()),
            max=float(values.max()),
            mean=float(values.mean()),
            std=float(values.std()),
            quantiles=tuple(float(q) for q in quantiles),
        )

    exact = wasserstein_distance(ref, cur) / ref.std()
    assert chunk_statistic(grid_sketch(ref), grid_sketch(cur)) == pytest.approx(exact, rel=0.005)
    unweighted = wasserstein_distance(
        np.quantile(ref, QUANTILE_RANKS), np.quantile(cur, QUANTILE_RANKS)
    )
    assert abs(unweighted / ref.std() - exact) > 0.005 * exact
