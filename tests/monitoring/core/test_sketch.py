"""Column sketches: what the builder counts, its quantiles against numpy's, streaming in any
batching, JSON round trips and hostile JSON."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shamal.errors import InvalidParameter
from shamal.monitoring.core import (
    CATEGORY_LIMIT,
    DISTINCT_LIMIT,
    EXACT_LIMIT,
    OTHER,
    QUANTILE_RANKS,
    ColumnSketch,
    SketchBuilder,
)

RANKS = np.asarray(QUANTILE_RANKS)


def build(batches: list[Any], kinds: dict[str, Any] | None = None) -> dict[str, ColumnSketch]:
    builder = SketchBuilder(kinds)
    for batch in batches:
        builder.update(batch)
    return builder.result()


def test_numeric_counts_nulls_nan_and_infinities_separately() -> None:
    x = np.array([1.0, np.nan, np.inf, -np.inf, 2.0, 3.0, np.nan])
    batch = pa.record_batch({"x": pa.array([4.0, None], pa.float64())})
    sketch = build([{"x": x}, batch])["x"]
    assert (sketch.count, sketch.nulls, sketch.nonfinite, sketch.invalid) == (9, 3, 2, 0)
    assert sketch.valid == 4
    assert (sketch.min, sketch.max, sketch.mean) == (1.0, 4.0, 2.5)
    assert sketch.std == pytest.approx(np.std([1.0, 2.0, 3.0, 4.0]))
    assert sorted(sketch.values or ()) == [1.0, 2.0, 3.0, 4.0]
    assert sketch.counts == {"1.0": 1, "2.0": 1, "3.0": 1, "4.0": 1}


def test_small_numeric_quantiles_are_numpys() -> None:
    x = np.random.default_rng(3).normal(size=5000)
    sketch = build([{"x": x[:1234]}, {"x": x[1234:]}])["x"]
    np.testing.assert_allclose(sketch.quantiles or (), np.quantile(x, RANKS), rtol=0, atol=1e-12)
    assert sketch.values is None  # 5000 values: more than EXACT_LIMIT
    assert sketch.counts is None  # continuous: more than DISTINCT_LIMIT values


def test_large_numeric_quantiles_are_within_a_small_rank_error() -> None:
    rng = np.random.default_rng(4)
    x = rng.lognormal(size=600_000)
    sketch = build([{"x": x[i : i + 50_000]} for i in range(0, x.size, 50_000)])["x"]
    ranks = np.searchsorted(np.sort(x), np.asarray(sketch.quantiles), side="left") / x.size
    assert np.abs(ranks - RANKS).max() < 0.002
    assert sketch.mean == pytest.approx(x.mean(), rel=1e-12)
    assert sketch.std == pytest.approx(x.std(), rel=1e-10)
    assert (sketch.min, sketch.max) == (x.min(), x.max())


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.floats(-1e6, 1e6) | st.just(math.nan) | st.just(math.inf), min_size=1, max_size=3000
    ),
    st.lists(st.integers(1, 500), min_size=1, max_size=8),
)
def test_streaming_in_many_batches_equals_one_batch(values: list[float], cuts: list[int]) -> None:
    x = np.asarray(values)
    batches, start = [], 0
    for size in cuts:
        batches.append({"x": x[start : start + size]})
        start += size
    batches.append({"x": x[start:]})
    one, many = build([{"x": x}])["x"], build(batches)["x"]
    assert (one.count, one.nulls, one.nonfinite, one.min, one.max, one.counts) == (
        many.count,
        many.nulls,
        many.nonfinite,
        many.min,
        many.max,
        many.counts,
    )
    if one.mean is not None:
        assert many.mean == pytest.approx(one.mean, rel=1e-9, abs=1e-6)
        assert many.std == pytest.approx(one.std, rel=1e-6, abs=1e-6)
        np.testing.assert_allclose(many.quantiles or (), one.quantiles or (), rtol=0, atol=0)
        finite = x[np.isfinite(x)]
        np.testing.assert_allclose(one.quantiles or (), np.quantile(finite, RANKS), atol=1e-6)
    assert sorted(many.values or ()) == sorted(one.values or ())


def test_categorical_from_strings_booleans_dictionaries_and_numbers() -> None:
    batch = pa.record_batch(
        {
            "s": pa.array(["a", "b", None, "a"]),
            "b": pa.array([True, False, True, None]),
            "d": pa.array(["x", "y", "x", "x"]).dictionary_encode(),
            "n": pa.array([1, 2, 2, None]),
        }
    )
    sketches = build(
        [batch], {"s": "categorical", "b": "categorical", "d": "categorical", "n": "categorical"}
    )
    assert sketches["s"].counts == {"a": 2, "b": 1}
    assert sketches["s"].nulls == 1
    assert sketches["b"].counts == {"False": 1, "True": 2}
    assert sketches["d"].counts == {"x": 3, "y": 1}
    assert sketches["n"].counts == {"1": 1, "2": 2}
    assert sketches["s"].values == ("a", "b", "a")


def test_kinds_are_inferred_and_other_types_skipped() -> None:
    batch = pa.record_batch(
        {
            "i": pa.array([1, 2, 3]),
            "s": pa.array(["a", "b", "c"]),
            "t": pa.array([1, 2, 3], pa.timestamp("s")),
        }
    )
    builder = SketchBuilder()
    builder.update(batch)
    kinds = {name: s.kind for name, s in builder.result().items()}
    assert kinds == {"i": "numeric", "s": "categorical"}
    assert builder.skipped == {"t"}


def test_categories_beyond_the_cap_fold_under_other() -> None:
    values = np.array([f"c{i}" for i in range(CATEGORY_LIMIT + 200)] + ["c0"] * 5, dtype=object)
    sketch = build([{"c": values[:700]}, {"c": values[700:]}], {"c": "categorical"})["c"]
    counts = dict(sketch.counts or {})
    assert len(counts) == CATEGORY_LIMIT + 1
    assert counts["c0"] == 6
    assert sum(counts.values()) == values.size
    assert counts[OTHER] >= 200


def test_a_type_changed_column_counts_invalid_values_and_survives() -> None:
    builder = SketchBuilder({"x": "numeric", "c": "categorical"})
    builder.update({"x": np.array([1.0, 2.0]), "c": np.array(["a", "b"])})
    builder.update(
        pa.record_batch({"x": pa.array(["oops", None, "1.5"]), "c": pa.array(["a", "b", "c"])})
    )
    builder.update({"x": [3, "seven", None, True], "c": ["a", {"no": 1}, None, 4]})
    sketch, cat = builder.result()["x"], builder.result()["c"]
    assert (sketch.count, sketch.nulls, sketch.invalid, sketch.valid) == (9, 2, 4, 3)
    assert (sketch.min, sketch.max) == (1.0, 3.0)
    assert (cat.count, cat.nulls, cat.invalid) == (9, 1, 1)
    assert cat.counts == {"4": 1, "a": 3, "b": 2, "c": 1}


def test_a_column_missing_from_a_batch_counts_those_rows_as_nulls() -> None:
    sketches = build([{"x": np.array([1.0, 2.0])}, {"y": np.array(["a"])}])
    assert (sketches["x"].count, sketches["x"].nulls) == (3, 1)
    assert (sketches["y"].count, sketches["y"].nulls) == (3, 2)


def test_exact_values_and_counts_stop_at_their_limits() -> None:
    x = np.arange(EXACT_LIMIT + 1, dtype=np.float64) % (DISTINCT_LIMIT + 1)
    sketch = build([{"x": x}])["x"]
    assert sketch.values is None
    assert sketch.counts is None
    small = build([{"x": x[:EXACT_LIMIT] % 7}])["x"]
    assert len(small.values or ()) == EXACT_LIMIT
    assert len(small.counts or {}) == 7


@pytest.mark.parametrize(
    "batch",
    [[1, 2, 3], {"x": np.zeros(3), "y": np.zeros(2)}, {1: np.zeros(2)}, {"x": np.zeros((2, 2))}],
)
def test_malformed_batches_are_refused(batch: Any) -> None:
    with pytest.raises(InvalidParameter):
        SketchBuilder().update(batch)


def test_bad_kinds_are_refused() -> None:
    with pytest.raises(InvalidParameter):
        SketchBuilder({"x": "text"})  # type: ignore[dict-item]


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64) | st.none(), max_size=1500),
    st.lists(st.sampled_from(["a", "b", "", "é", None]), max_size=1500),
)
def test_json_round_trip(numbers: list[float | None], words: list[str | None]) -> None:
    sketches = build(
        [
            {"x": np.array([math.nan if v is None else v for v in numbers], dtype=np.float64)},
            {"c": np.array(words, dtype=object)},
        ],
        {"x": "numeric", "c": "categorical"},
    )
    for sketch in sketches.values():
        text = json.dumps(sketch.to_json(), allow_nan=False)
        assert ColumnSketch.from_json(json.loads(text)) == sketch


def _valid_json() -> dict[str, Any]:
    return build([{"x": np.arange(50.0)}])["x"].to_json()


HOSTILE: list[tuple[str, Any]] = [
    ("not an object", [1, 2]),
    ("unknown field", {"extra": 1}),
    ("kind", {"kind": "text"}),
    ("name type", {"name": 5}),
    ("huge name", {"name": "x" * 5000}),
    ("negative count", {"count": -1}),
    ("bool count", {"count": True}),
    ("float count", {"count": 1.5}),
    ("more nulls than rows", {"nulls": 51}),
    ("NaN mean", {"mean": math.nan}),
    ("inf max", {"max": math.inf}),
    ("string min", {"min": "0"}),
    ("short quantiles", {"quantiles": [0.0, 1.0]}),
    ("unsorted quantiles", {"quantiles": list(reversed(range(len(QUANTILE_RANKS))))}),
    ("NaN quantile", {"quantiles": [math.nan] * len(QUANTILE_RANKS)}),
    ("huge values", {"values": [1.0] * (EXACT_LIMIT + 1), "count": 10**6}),
    ("values beyond count", {"values": [1.0] * 51}),
    ("null value", {"values": [None]}),
    ("negative category count", {"counts": {"1.0": -3}}),
    ("non-numeric key", {"counts": {"a": 3}}),
    ("counts beyond rows", {"counts": {"1.0": 51}}),
    ("huge counts", {"counts": {str(float(i)): 0 for i in range(5000)}}),
    ("counts not an object", {"counts": [1, 2]}),
    ("min above max", {"min": 100.0}),
    ("negative std", {"std": -1.0}),
    ("partial numeric", {"quantiles": None}),
]


@pytest.mark.parametrize(("why", "change"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_json_is_refused(why: str, change: Any) -> None:
    raw: Any = change if not isinstance(change, dict) else {**_valid_json(), **change}
    with pytest.raises(InvalidParameter):
        ColumnSketch.from_json(raw)


def test_categorical_json_with_numeric_fields_is_refused() -> None:
    raw = build([{"c": np.array(["a"], dtype=object)}], {"c": "categorical"})["c"].to_json()
    with pytest.raises(InvalidParameter):
        ColumnSketch.from_json({**raw, "mean": 1.0})
    assert ColumnSketch.from_json(raw).counts == {"a": 1}


def test_dictionary_arrays_count_by_index_with_nulls_and_repeated_words() -> None:
    dictionary = pa.array(["x", "y", "x", "unused"])
    array = pa.DictionaryArray.from_arrays(pa.array([0, 1, None, 2, 1, 0]), dictionary)
    sketch = build([pa.record_batch({"d": array})])["d"]
    assert sketch.counts == {"x": 3, "y": 2}
    assert (sketch.count, sketch.nulls) == (6, 1)
    assert sorted(sketch.values or ()) == ["x", "x", "x", "y", "y"]


def test_a_large_first_batch_keeps_no_exact_values() -> None:
    words = np.array(["a", "b"] * 1500, dtype=object)
    sketch = build([{"c": words}, {"c": words[:10]}], {"c": "categorical"})["c"]
    assert sketch.values is None
    assert sketch.counts == {"a": 1505, "b": 1505}


def test_exact_values_are_kept_while_the_valid_ones_fit() -> None:
    x = np.concatenate([np.full(500, np.nan), np.arange(EXACT_LIMIT, dtype=np.float64)])
    sketch = build([{"x": x[:700]}, {"x": x[700:]}])["x"]
    assert sketch.count == EXACT_LIMIT + 500
    assert sorted(sketch.values or ()) == list(range(EXACT_LIMIT))
    words = np.array([None] * 300 + ["a"] * EXACT_LIMIT, dtype=object)
    assert len(build([{"c": words}], {"c": "categorical"})["c"].values or ()) == EXACT_LIMIT
