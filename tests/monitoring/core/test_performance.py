"""Performance metrics against sklearn.metrics, per chunk and with bands; prediction columns."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn import metrics as skm

from shamal.errors import InvalidParameter
from shamal.monitoring.core._chunks import chunk_bands, chunk_ranges, flag, time_chunks
from shamal.monitoring.core._performance import (
    METRIC_RANGES,
    PREDICTION_PREFIX,
    performance,
    performance_bands,
    performance_chunks,
    prediction_column,
    prediction_columns,
)


def sklearn_classification(y_true: list[object], y_pred: list[object]) -> dict[str, float]:
    return {
        "accuracy": skm.accuracy_score(y_true, y_pred),
        "f1": skm.f1_score(y_true, y_pred, average="macro", zero_division=0),
        "precision": skm.precision_score(y_true, y_pred, average="macro", zero_division=0),
        "recall": skm.recall_score(y_true, y_pred, average="macro", zero_division=0),
    }


def sklearn_regression(y_true: list[float], y_pred: list[float]) -> dict[str, float]:
    return {
        "mae": skm.mean_absolute_error(y_true, y_pred),
        "rmse": skm.root_mean_squared_error(y_true, y_pred),
        "r2": skm.r2_score(y_true, y_pred),
    }


def assert_metrics(got: dict[str, float], expected: dict[str, float]) -> None:
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, rel=1e-9, abs=1e-9), name


int_labels = st.integers(0, 4)
str_labels = st.sampled_from(["cat", "dog", "eel", "yak"])
# values below 1e-100 square to 0 in sklearn (underflow) and not here (scaled squares):
# see test_tiny_errors_do_not_underflow_into_a_perfect_fit
numbers = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False).filter(
    lambda v: v == 0 or abs(v) > 1e-100
)


# --- classification ------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(int_labels, int_labels), min_size=1, max_size=80))
def test_classification_matches_sklearn_on_int_labels(pairs: list[tuple[int, int]]) -> None:
    y_true, y_pred = [t for t, _ in pairs], [p for _, p in pairs]
    got = performance("classification", np.array(y_true), np.array(y_pred))
    assert_metrics(got, sklearn_classification(y_true, y_pred))
    assert (got["rows"], got["skipped"]) == (len(pairs), 0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(str_labels, str_labels), min_size=1, max_size=80))
def test_classification_matches_sklearn_on_string_labels(pairs: list[tuple[str, str]]) -> None:
    y_true, y_pred = [t for t, _ in pairs], [p for _, p in pairs]
    assert_metrics(
        performance("classification", y_true, y_pred), sklearn_classification(y_true, y_pred)
    )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), str_labels), st.one_of(st.none(), st.just(math.nan), str_labels)
        ),
        min_size=1,
        max_size=60,
    )
)
def test_missing_labels_or_predictions_are_skipped(pairs: list[tuple[str | None, object]]) -> None:
    complete = [(t, p) for t, p in pairs if t is not None and isinstance(p, str)]
    y_true = np.array([t for t, _ in pairs], dtype=object)
    y_pred = np.array([p for _, p in pairs], dtype=object)
    if not complete:
        with pytest.raises(InvalidParameter, match="both a label and a prediction"):
            performance("classification", y_true, y_pred)
        return
    got = performance("classification", y_true, y_pred)
    assert_metrics(got, sklearn_classification([t for t, _ in complete], [p for _, p in complete]))
    assert (got["rows"], got["skipped"]) == (len(complete), len(pairs) - len(complete))


def test_float_labels_with_nan_are_skipped() -> None:
    got = performance(
        "classification", np.array([1.0, 0.0, math.nan, 1.0]), np.array([1.0, 1.0, 0.0, math.nan])
    )
    assert_metrics(got, sklearn_classification([1, 0], [1, 1]))
    assert got["skipped"] == 2


def test_bool_labels() -> None:
    y_true, y_pred = [True, False, True, True], [True, True, False, True]
    assert_metrics(
        performance("classification", y_true, y_pred), sklearn_classification(y_true, y_pred)
    )


# --- regression ----------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(numbers, numbers), min_size=2, max_size=80))
def test_regression_matches_sklearn(pairs: list[tuple[float, float]]) -> None:
    y_true, y_pred = [t for t, _ in pairs], [p for _, p in pairs]
    got = performance("regression", np.array(y_true), np.array(y_pred))
    expected = sklearn_regression(y_true, y_pred)
    assert got["mae"] == pytest.approx(expected["mae"], rel=1e-9, abs=1e-9)
    assert got["rmse"] == pytest.approx(expected["rmse"], rel=1e-9, abs=1e-9)
    # r2 divides by the spread of y_true: compare with a tolerance relative to its scale
    assert got["r2"] == pytest.approx(expected["r2"], rel=1e-6, abs=1e-6)


def test_regression_with_a_constant_truth_follows_sklearn() -> None:
    for y_pred in ([2.0, 2.0, 2.0], [2.0, 3.0, 2.0]):
        assert performance("regression", [2.0, 2.0, 2.0], y_pred)["r2"] == skm.r2_score(
            [2.0] * 3, y_pred
        )


def test_tiny_errors_do_not_underflow_into_a_perfect_fit() -> None:
    got = performance("regression", [0.0, 0.0], [0.0, 4.4e-281])
    assert (
        got["r2"] == 0.0
    )  # constant truth, imperfect prediction (sklearn's squares underflow to 1.0)
    assert got["rmse"] == pytest.approx(4.4e-281 / math.sqrt(2))


def test_regression_skips_nan_and_inf_and_one_row_has_no_r2() -> None:
    got = performance(
        "regression", [1.0, math.nan, 3.0, math.inf, 5.0], [1.5, 2.0, math.nan, 4.0, 4.0]
    )
    assert_metrics(got, sklearn_regression([1.0, 5.0], [1.5, 4.0]))
    assert (got["rows"], got["skipped"]) == (2, 3)
    single = performance("regression", [1.0], [3.0])
    assert (single["mae"], single["rmse"]) == (2.0, 2.0)
    assert math.isnan(single["r2"])


def test_regression_accepts_object_arrays_with_none() -> None:
    got = performance("regression", np.array([1, None, 3, 4], dtype=object), [1.0, 2.0, 2.0, 5.0])
    assert_metrics(got, sklearn_regression([1, 3, 4], [1.0, 2.0, 5.0]))


# --- chunks and bands ----------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(int_labels, int_labels), min_size=1, max_size=60), st.integers(1, 20))
def test_performance_per_chunk_is_performance_of_each_slice(
    pairs: list[tuple[int, int]], size: int
) -> None:
    y_true, y_pred = np.array([t for t, _ in pairs]), np.array([p for _, p in pairs])
    ranges = chunk_ranges(len(pairs), size)
    per_chunk = performance_chunks("classification", y_true, y_pred, ranges)
    for i, (start, stop) in enumerate(ranges):
        whole = performance("classification", y_true[start:stop], y_pred[start:stop])
        for name, value in whole.items():
            assert per_chunk[name][i] == value


def test_a_chunk_without_labels_gets_nan_metrics() -> None:
    y_true = np.array([1.0, 2.0, math.nan, math.nan, 5.0])
    y_pred = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    per_chunk = performance_chunks("regression", y_true, y_pred, [(0, 2), (2, 4), (4, 5)])
    assert math.isnan(per_chunk["mae"][1])
    assert per_chunk["rows"].tolist() == [2, 0, 1]
    assert per_chunk["mae"][0] == 0.0
    by_time = performance_chunks(
        "regression", y_true, y_pred, time_chunks(np.array([0, 0, 1, 1, 0]), 1.0)
    )
    assert by_time["rows"].tolist() == [3, 0]


def test_performance_drift_once_labels_arrive() -> None:
    """Reference chunks give each metric a band; a monitored period whose model got worse
    breaches the accuracy band, one where it did not stays inside."""
    rng = np.random.default_rng(5)
    truth = rng.integers(0, 3, 10_000)
    good = np.where(rng.random(10_000) < 0.9, truth, rng.integers(0, 3, 10_000))
    reference = performance_chunks("classification", truth, good, chunk_ranges(10_000, 1000))
    bands = performance_bands(reference, sigmas=3.0)
    assert set(bands) == {"accuracy", "f1", "precision", "recall"}
    assert bands["accuracy"].upper <= 1.0
    later_truth = rng.integers(0, 3, 2000)
    fine = np.where(rng.random(2000) < 0.9, later_truth, rng.integers(0, 3, 2000))
    worse = np.where(rng.random(2000) < 0.6, later_truth, rng.integers(0, 3, 2000))
    monitored = performance_chunks(
        "classification",
        np.concatenate([later_truth, later_truth]),
        np.concatenate([fine, worse]),
        chunk_ranges(4000, 1000),
    )
    assert flag(monitored["accuracy"], bands["accuracy"]).tolist() == [False, False, True, True]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=30), st.floats(0, 10))
def test_bands_of_shares_are_clipped_to_zero_one(values: list[float], sigmas: float) -> None:
    band = performance_bands({"accuracy": values, "rows": [1.0] * len(values)}, sigmas=sigmas)[
        "accuracy"
    ]
    assert band == chunk_bands(values, sigmas=sigmas, valid=(0.0, 1.0))
    assert 0.0 <= band.lower <= band.upper <= 1.0


def test_metric_ranges_bound_every_metric() -> None:
    assert set(METRIC_RANGES) == {"accuracy", "f1", "precision", "recall", "mae", "rmse", "r2"}
    r2_band = performance_bands({"r2": [0.99, 1.0, 0.98]})["r2"]
    assert r2_band.upper == 1.0
    assert r2_band.lower < 0.98


# --- prediction columns --------------------------------------------------------------------


def test_prediction_columns_are_named_apart_from_features() -> None:
    assert prediction_column("score") == PREDICTION_PREFIX + "score"
    columns = ["age", prediction_column("score"), "city", prediction_column("label")]
    assert prediction_columns(columns) == (prediction_column("score"), prediction_column("label"))
    for bad in ("", None, 3):
        with pytest.raises(InvalidParameter):
            prediction_column(bad)  # type: ignore[arg-type]


# --- hostile input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("task", "y_true", "y_pred", "match"),
    [
        ("classification", [1, 2, 3], [1, 2], "3 rows and y_pred 2"),
        ("regression", [1.0], [], "1 rows and y_pred 0"),
        ("classification", [], [], "at least one row"),
        ("regression", np.array([]), np.array([]), "at least one row"),
        ("regression", [math.nan, 1.0], [1.0, math.nan], "both a label and a prediction"),
        ("classification", [[1, 2]], [[1, 2]], "one-dimensional"),
        ("classification", np.array([1, "a"], dtype=object), np.array([1, 1], dtype=object), "mix"),
        ("regression", ["1.0", "2.0"], [1.0, 2.0], "numbers"),
        ("regression", np.array(["1", 2.0], dtype=object), [1.0, 2.0], "numbers"),
        ("ranking", [1], [1], "task"),
    ],
)
def test_hostile_inputs_are_refused(task: str, y_true: object, y_pred: object, match: str) -> None:
    with pytest.raises(InvalidParameter, match=match):
        performance(task, y_true, y_pred)  # type: ignore[arg-type]


def test_chunks_outside_the_labels_are_refused() -> None:
    with pytest.raises(InvalidParameter, match="outside"):
        performance_chunks("regression", [1.0, 2.0], [1.0, 2.0], [(0, 3)])


def test_huge_inputs_are_handled_in_linear_time() -> None:
    n = 2_000_000
    rng = np.random.default_rng(0)
    y_true = rng.integers(0, n // 2, n)  # about a million distinct labels
    y_pred = np.where(rng.random(n) < 0.5, y_true, rng.integers(0, n // 2, n))
    started = time.perf_counter()
    got = performance("classification", y_true, y_pred)
    assert time.perf_counter() - started < 30
    assert got["accuracy"] == pytest.approx(float(np.mean(y_true == y_pred)))
    regression = performance("regression", rng.normal(0, 1e150, n), rng.normal(0, 1e150, n))
    assert math.isfinite(regression["mae"])


def test_huge_values_keep_finite_metrics() -> None:
    y_true, y_pred = [1e300, -1e300, 5e299], [-1e300, 1e300, 5e299]
    got = performance("regression", y_true, y_pred)
    scaled = sklearn_regression([1.0, -1.0, 0.5], [-1.0, 1.0, 0.5])
    assert got["rmse"] == pytest.approx(scaled["rmse"] * 1e300)
    assert got["r2"] == pytest.approx(scaled["r2"])
    assert got["mae"] == pytest.approx(scaled["mae"] * 1e300)
