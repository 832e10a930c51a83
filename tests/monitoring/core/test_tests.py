"""Drift tests on sketches against the same tests computed exactly, Evidently's way, by scipy
and numpy on the raw arrays (an independent reference written here from Evidently's
definitions: ks_2samp, chisquare of scaled reference counts, the two-proportion Z-test,
normed Wasserstein, Jensen-Shannon and PSI over Sturges bins or per value)."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from scipy.spatial import distance

from shamal.errors import InvalidParameter
from shamal.monitoring.core import (
    ColumnSketch,
    SketchBuilder,
    choose_test,
    distinct_values,
    drifted,
    psi,
    run_test,
)


def sketch(values: Any, kind: str = "numeric", batch: int = 50_000) -> ColumnSketch:
    builder = SketchBuilder({"x": kind})  # type: ignore[dict-item]
    array = np.asarray(values)
    for start in range(0, max(array.size, 1), batch):
        builder.update({"x": array[start : start + batch]})
    return builder.result()["x"]


# ---- an exact reference, from Evidently's definitions, on raw arrays -------------------------


def exact_binned(ref: np.ndarray, cur: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    if kind == "numeric" and np.unique(ref).size > 20:
        edges = np.histogram_bin_edges(np.concatenate([ref, cur]), bins="sturges")
        return np.histogram(ref, edges)[0] / ref.size, np.histogram(cur, edges)[0] / cur.size
    keys = sorted(set(ref.tolist()) | set(cur.tolist()))
    return (
        np.array([np.sum(ref == k) for k in keys]) / ref.size,
        np.array([np.sum(cur == k) for k in keys]) / cur.size,
    )


def exact_ks(ref: np.ndarray, cur: np.ndarray) -> Any:
    with warnings.catch_warnings():  # scipy may fall back from its exact method, and says so
        warnings.simplefilter("ignore", RuntimeWarning)
        return stats.ks_2samp(ref, cur)


def exact_psi(ref: np.ndarray, cur: np.ndarray, kind: str) -> float:
    r, c = exact_binned(ref, cur, kind)
    for shares in (r, c):
        low = shares[shares != 0].min()
        shares[shares == 0] = low / 1e6 if low <= 1e-4 else 1e-4
    return float(np.sum((r - c) * np.log(r / c)))


def exact_chisquare(ref: np.ndarray, cur: np.ndarray) -> float:
    keys = sorted(set(ref.tolist()) | set(cur.tolist()))
    obs = np.array([np.sum(cur == k) for k in keys], dtype=float)
    exp = np.array([np.sum(ref == k) for k in keys], dtype=float) * cur.size / ref.size
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(stats.chisquare(obs, exp).pvalue)


# ---- the chooser and the rules -------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "rows", "distinct", "expected"),
    [
        ("numeric", 1000, 6, "ks"),
        ("numeric", 1000, 5, "chisquare"),
        ("numeric", 1000, 3, "chisquare"),
        ("numeric", 1000, 2, "z"),
        ("categorical", 10, 300, "chisquare"),
        ("categorical", 1000, 2, "z"),
        ("categorical", 1000, 1, "z"),
        ("numeric", 1001, 6, "wasserstein"),
        ("numeric", 1001, 5, "jensenshannon"),
        ("categorical", 1001, 2, "jensenshannon"),
        ("categorical", 10**6, 900, "jensenshannon"),
    ],
)
def test_choose_test_is_evidentlys_rule(kind: str, rows: int, distinct: int, expected: str) -> None:
    assert choose_test(kind, rows, distinct) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("test", "statistic", "threshold", "expected"),
    [
        ("ks", 0.05, 0.05, True),
        ("chisquare", 0.05, 0.05, False),
        ("z", 0.049, 0.05, True),
        ("wasserstein", 0.1, 0.1, True),
        ("jensenshannon", 0.0999, 0.1, False),
        ("psi", 0.2, 0.1, True),
    ],
)
def test_drift_rules(test: str, statistic: float, threshold: float, expected: bool) -> None:
    assert drifted(test, statistic, threshold) is expected


# ---- exact where Evidently's samples are known exactly -------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    st.integers(5, 1000),
    st.integers(5, 1000),
    st.floats(-1.0, 1.0),
    st.integers(0, 2**32 - 1),
)
def test_small_samples_ks_is_scipys_exactly(n: int, m: int, shift: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ref, cur = rng.normal(size=n).round(2), rng.normal(shift, size=m).round(2)
    p, p_value = run_test("ks", sketch(ref), sketch(cur))
    assert p == p_value == pytest.approx(exact_ks(ref, cur).pvalue, rel=1e-12, abs=0)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(20, 3000),
    st.integers(20, 3000),
    st.integers(2, 12),
    st.integers(0, 2**32 - 1),
)
def test_categorical_tests_are_exact(n: int, m: int, k: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ref = rng.choice([f"v{i}" for i in range(k)], n)
    cur = rng.choice([f"v{i}" for i in range(k + int(seed % 2))], m)
    r, c = sketch(ref.astype(object), "categorical"), sketch(cur.astype(object), "categorical")
    assert distinct_values(r, c) == len(set(ref) | set(cur))
    assert run_test("chisquare", r, c)[0] == pytest.approx(exact_chisquare(ref, cur), rel=1e-9)
    js = distance.jensenshannon(*exact_binned(ref, cur, "categorical"))
    assert run_test("jensenshannon", r, c)[0] == pytest.approx(js, rel=1e-9)
    assert psi(r, c) == pytest.approx(exact_psi(ref, cur, "categorical"), rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 1000), st.integers(2, 5000), st.floats(0.05, 0.95), st.integers(0, 2**32 - 1))
def test_z_test_is_the_two_proportion_test(n: int, m: int, share: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ref, cur = rng.random(n) < 0.5, rng.random(m) < share
    r, c = sketch(ref, "categorical"), sketch(cur, "categorical")
    p1, p2 = ref.mean(), cur.mean()
    pooled = (p1 * n + p2 * m) / (n + m)
    if pooled in (0.0, 1.0):
        expected = 1.0
    else:
        z = (p1 - p2) / math.sqrt(pooled * (1 - pooled) * (1 / n + 1 / m))
        expected = 2 * (1 - stats.norm.cdf(abs(z)))
    assert run_test("z", r, c)[0] == pytest.approx(expected, rel=1e-6, abs=1e-12)


# ---- within stated tolerances where a side is a quantile grid ------------------------------


@settings(max_examples=15, deadline=None)
@given(
    st.integers(1001, 200_000),
    st.integers(1001, 200_000),
    st.floats(0.0, 0.3),
    st.sampled_from(["normal", "uniform", "exponential"]),
    st.integers(0, 2**32 - 1),
)
def test_grid_based_distances_agree_with_exact(
    n: int, m: int, shift: float, family: str, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    ref = getattr(rng, family)(size=n)
    cur = getattr(rng, family)(size=m) + shift
    r, c = sketch(ref), sketch(cur)
    exact_w = stats.wasserstein_distance(ref, cur) / max(np.std(ref), 0.001)
    assert run_test("wasserstein", r, c)[0] == pytest.approx(exact_w, rel=0.02, abs=0.002)
    exact_js = distance.jensenshannon(*exact_binned(ref, cur, "numeric"))
    assert run_test("jensenshannon", r, c)[0] == pytest.approx(exact_js, rel=0.05, abs=0.005)
    assert psi(r, c) == pytest.approx(exact_psi(ref, cur, "numeric"), rel=0.1, abs=0.005)


@settings(max_examples=15, deadline=None)
@given(
    st.integers(50, 1000),
    st.integers(1001, 300_000),
    st.floats(0.0, 0.4),
    st.integers(0, 2**32 - 1),
)
def test_ks_against_a_large_current_is_close_to_scipy(
    n: int, m: int, shift: float, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    ref, cur = rng.normal(size=n), rng.normal(shift, size=m)
    exact = exact_ks(ref, cur)
    p, _ = run_test("ks", sketch(ref), sketch(cur))
    # The statistic moves by at most the grid's rank step and the sketch's rank error.
    d = float(exact.statistic)
    en = n * m / (n + m)
    low = stats.kstwo.sf(d + 0.003, round(en))
    high = stats.kstwo.sf(max(d - 0.003, 0.0), round(en))
    assert low - 0.01 <= p <= high + 0.01


def test_ks_on_discrete_values_counts_ties_exactly() -> None:
    rng = np.random.default_rng(7)
    ref, cur = rng.poisson(4, 800).astype(float), rng.poisson(4.6, 60_000).astype(float)
    p, _ = run_test("ks", sketch(ref), sketch(cur))
    assert p == pytest.approx(exact_ks(ref, cur).pvalue, rel=1e-9)


# ---- refusals ------------------------------------------------------------------------------


def test_tests_that_do_not_fit_a_column_are_refused() -> None:
    words = sketch(np.array(["a", "b"], dtype=object), "categorical")
    numbers = sketch(np.random.default_rng(0).normal(size=5000))
    empty = sketch(np.array([np.nan, np.nan]))
    with pytest.raises(InvalidParameter):
        run_test("ks", words, words)
    with pytest.raises(InvalidParameter):
        run_test("wasserstein", words, words)
    with pytest.raises(InvalidParameter):
        run_test("chisquare", numbers, numbers)
    with pytest.raises(InvalidParameter):
        run_test("median", numbers, numbers)
    with pytest.raises(InvalidParameter):
        run_test("ks", empty, numbers)
    with pytest.raises(InvalidParameter):
        psi(numbers, numbers, bins=0)


def test_huge_values_give_finite_statistics() -> None:
    ref = sketch(np.array([1e308, -1e308] * 700))
    cur = sketch(np.array([1e308, 1e308, -1e308] * 500))
    for test in ("wasserstein", "psi", "jensenshannon", "ks"):
        statistic, _ = run_test(test, ref, cur)
        assert math.isfinite(statistic)
