"""Data quality checks over sketches, against brute force over the raw values.

Sketches are built here by hand from raw arrays (numpy quantiles, exact counts), so each
check can be compared with the obvious computation on the rows themselves.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shamal.errors import InvalidParameter
from shamal.monitoring.core._quality import (
    QualityIssue,
    new_category_fraction,
    out_of_range_fraction,
    quality,
)
from shamal.monitoring.core._sketch import OTHER, ColumnSketch, SketchBuilder


def numeric_sketch(
    name: str,
    raw: Sequence[float | None],
    *,
    grid: int = 101,
    exact: bool = False,
) -> ColumnSketch:
    """A numeric sketch of ``raw``: None and NaN are nulls, +-inf non-finite; ``grid``
    quantiles at evenly spaced ranks; exact values only when ``exact``."""
    values = np.asarray([math.nan if v is None else v for v in raw], dtype=float)
    nulls = int(np.isnan(values).sum())
    nonfinite = int(np.isinf(values).sum())
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return ColumnSketch(name, "numeric", len(raw), nulls=nulls, nonfinite=nonfinite)
    return ColumnSketch(
        name,
        "numeric",
        len(raw),
        nulls=nulls,
        nonfinite=nonfinite,
        min=float(finite.min()),
        max=float(finite.max()),
        mean=float(finite.mean()),
        std=float(finite.std()),
        quantiles=tuple(float(q) for q in np.quantile(finite, np.linspace(0, 1, grid))),
        values=tuple(float(v) for v in finite) if exact else None,
    )


def categorical_sketch(name: str, raw: Sequence[str | None]) -> ColumnSketch:
    present = [v for v in raw if v is not None]
    return ColumnSketch(
        name, "categorical", len(raw), nulls=len(raw) - len(present), counts=dict(Counter(present))
    )


def kinds_of(issues: Sequence[QualityIssue], column: str) -> list[str]:
    return [issue.kind for issue in issues if issue.column == column]


finite_floats = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


# --- out of range --------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    st.lists(finite_floats, min_size=1, max_size=60),
    st.lists(finite_floats, min_size=1, max_size=60),
)
def test_out_of_range_with_exact_values_is_the_brute_force_share(
    ref: list[float], cur: list[float]
) -> None:
    reference = numeric_sketch("x", ref)
    current = numeric_sketch("x", cur, exact=True)
    lo, hi = min(ref), max(ref)
    expected = sum(1 for v in cur if v < lo or v > hi) / len(cur)
    assert out_of_range_fraction(reference, current) == pytest.approx(expected)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(finite_floats, min_size=1, max_size=300),
    st.lists(finite_floats, min_size=2, max_size=300),
    st.sampled_from([5, 11, 101]),
)
def test_out_of_range_from_the_grid_stays_within_its_documented_error(
    ref: list[float], cur: list[float], grid: int
) -> None:
    reference = numeric_sketch("x", ref)
    current = numeric_sketch("x", cur, grid=grid)  # no exact values: the grid estimate
    lo, hi = min(ref), max(ref)
    true = sum(1 for v in cur if v < lo or v > hi) / len(cur)
    # documented: 1/(m-1) per end; numpy's linear quantiles add up to 1/(n-1) per end.
    bound = 2 / (grid - 1) + 2 / (len(cur) - 1)
    estimate = out_of_range_fraction(reference, current)
    assert 0.0 <= estimate <= 1.0
    assert abs(estimate - true) <= bound + 1e-12


def test_out_of_range_grid_estimate_on_a_shift() -> None:
    rng = np.random.default_rng(7)
    ref = rng.uniform(0, 1, 20_000).tolist()
    cur = rng.uniform(0.55, 1.55, 20_000).tolist()  # 55% above the reference max
    lo, hi = min(ref), max(ref)
    true = sum(1 for v in cur if v > hi or v < lo) / len(cur)
    estimate = out_of_range_fraction(numeric_sketch("x", ref), numeric_sketch("x", cur, grid=101))
    assert abs(estimate - true) <= 2 / 100
    assert 0.4 < estimate < 0.6
    # on a smooth distribution the interpolation is far better than its worst case:
    # with 11 grid points (worst case 0.1 per end) it is still within 0.01
    coarse = out_of_range_fraction(numeric_sketch("x", ref), numeric_sketch("x", cur, grid=11))
    assert abs(coarse - true) <= 0.01


def test_out_of_range_from_exact_counts_of_a_few_distinct_values() -> None:
    reference = numeric_sketch("x", [1.0, 2.0, 3.0])
    current = ColumnSketch(
        "x", "numeric", 10, min=0.0, max=3.0, counts={"0.0": 3, "1.0": 2, "3.0": 5}
    )
    assert out_of_range_fraction(reference, current) == pytest.approx(0.3)
    capped = ColumnSketch("x", "numeric", 10, min=0.0, max=3.0, counts={"0.0": 3, OTHER: 7})
    assert math.isnan(out_of_range_fraction(reference, capped))  # no grid, counts capped


def test_out_of_range_is_zero_inside_the_range_and_nan_without_a_reference_range() -> None:
    reference = numeric_sketch("x", [0.0, 10.0])
    assert out_of_range_fraction(reference, numeric_sketch("x", [1.0, 9.0], grid=3)) == 0.0
    assert out_of_range_fraction(reference, numeric_sketch("x", [None, None])) == 0.0
    all_null = numeric_sketch("x", [None, math.nan])
    assert math.isnan(out_of_range_fraction(all_null, numeric_sketch("x", [1.0, 2.0])))


def test_out_of_range_issue_appears_only_above_its_limit() -> None:
    reference = {"x": numeric_sketch("x", list(range(100)))}
    current = {"x": numeric_sketch("x", [*range(95), 500, 501, 502, 503, 504], exact=True)}
    issues = quality(reference, current, out_of_range_share=0.04)
    (issue,) = [i for i in issues if i.kind == "out_of_range"]
    assert issue.value == pytest.approx(0.05)
    assert issue.limit == 0.04
    assert not [
        i for i in quality(reference, current, out_of_range_share=0.05) if i.kind == "out_of_range"
    ]


# --- nulls and non-finite values -----------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(st.none(), finite_floats), min_size=1, max_size=50),
    st.lists(st.one_of(st.none(), finite_floats), min_size=1, max_size=50),
    st.floats(0, 1),
)
def test_null_rate_issue_iff_the_rate_rises_above_the_allowed_increase(
    ref: list[float | None], cur: list[float | None], increase: float
) -> None:
    issues = quality(
        {"x": numeric_sketch("x", ref)},
        {"x": numeric_sketch("x", cur)},
        null_rate_increase=increase,
        out_of_range_share=1.0,
    )
    ref_rate = ref.count(None) / len(ref)
    cur_rate = cur.count(None) / len(cur)
    assert ("null_rate" in kinds_of(issues, "x")) == (cur_rate > ref_rate + increase)


def test_null_rate_issue_reports_its_measure_and_limit() -> None:
    reference = {"c": categorical_sketch("c", ["a"] * 9 + [None])}
    current = {"c": categorical_sketch("c", ["a"] * 7 + [None] * 3)}
    (issue,) = quality(reference, current, null_rate_increase=0.1)
    assert (issue.kind, issue.value, issue.limit) == (
        "null_rate",
        pytest.approx(0.3),
        pytest.approx(0.2),
    )
    assert "3 of 10" in issue.detail


def test_nonfinite_values_are_their_own_issue() -> None:
    reference = {"x": numeric_sketch("x", [1.0, 2.0, 3.0, 4.0])}
    current = {"x": numeric_sketch("x", [1.0, math.inf, -math.inf, 2.0])}
    issues = quality(reference, current)
    assert kinds_of(issues, "x") == ["nonfinite"]
    assert issues[0].value == pytest.approx(0.5)
    # the same share of inf as the reference had is no issue; allowed increase is honoured
    same = {"x": numeric_sketch("x", [1.0, math.inf, 2.0, 3.0])}
    assert quality(same, same) == ()
    assert quality(reference, current, nonfinite_increase=0.5) == ()


# --- categories ----------------------------------------------------------------------------


labels = st.sampled_from(["a", "b", "c", "d", "e", "f"])


@settings(max_examples=200, deadline=None)
@given(st.lists(labels, min_size=1, max_size=50), st.lists(labels, min_size=1, max_size=50))
def test_new_category_share_is_the_brute_force_share(ref: list[str], cur: list[str]) -> None:
    share, names = new_category_fraction(categorical_sketch("c", ref), categorical_sketch("c", cur))
    new = [v for v in cur if v not in set(ref)]
    assert share == pytest.approx(len(new) / len(cur))
    assert set(names) == set(new)
    counts = Counter(new)
    assert [counts[n] for n in names] == sorted(counts.values(), reverse=True)


def test_new_category_issue_names_the_categories() -> None:
    reference = {"c": categorical_sketch("c", ["a"] * 50 + ["b"] * 50)}
    current = {"c": categorical_sketch("c", ["a"] * 40 + ["zz"] * 6 + ["yy"] * 4)}
    (issue,) = quality(reference, current)
    assert issue.kind == "new_category"
    assert issue.value == pytest.approx(0.2)
    assert issue.detail.index("'zz'") < issue.detail.index("'yy'")


def test_capped_counts_other_bucket_is_never_new_and_widens_the_limit() -> None:
    # current's OTHER bucket: members unknown, not counted
    reference = categorical_sketch("c", ["a", "b"])
    current = ColumnSketch("c", "categorical", 10, counts={"a": 5, OTHER: 5})
    assert new_category_fraction(reference, current) == (0.0, [])
    # a capped reference (10% in its tail): 8% unseen categories may be from that tail
    capped_ref = {"c": ColumnSketch("c", "categorical", 100, counts={"a": 90, OTHER: 10})}
    cur = {"c": ColumnSketch("c", "categorical", 100, counts={"a": 92, "q": 8})}
    assert quality(capped_ref, cur) == ()
    cur_more = {"c": ColumnSketch("c", "categorical", 100, counts={"a": 80, "q": 20})}
    (issue,) = quality(capped_ref, cur_more)
    assert issue.limit == pytest.approx(0.11)


# --- structure -----------------------------------------------------------------------------


def test_missing_new_and_type_changed_columns() -> None:
    reference = {
        "gone": numeric_sketch("gone", [1.0]),
        "kind": numeric_sketch("kind", [1.0, 2.0]),
        "ok": numeric_sketch("ok", [1.0, 2.0]),
    }
    current = {
        "kind": categorical_sketch("kind", [None, None, "x"]),  # would be a null issue too
        "ok": numeric_sketch("ok", [1.0, 2.0]),
        "new": categorical_sketch("new", ["a"]),
    }
    issues = quality(reference, current)
    assert [(i.column, i.kind) for i in issues] == [
        ("gone", "missing_column"),
        ("kind", "type_changed"),
        ("new", "new_column"),
    ]
    assert all(i.value == 1.0 and i.limit == 0.0 for i in issues)


def test_issues_are_ordered_by_column_then_from_structural_to_values() -> None:
    reference = {"b": numeric_sketch("b", [0.0, 1.0] * 10), "a": numeric_sketch("a", [0.0, 1.0])}
    current = {
        "b": numeric_sketch("b", [None, math.inf, 5.0, 6.0], exact=True),
        "a": numeric_sketch("a", [0.0, 1.0]),
    }
    issues = quality(reference, current)
    assert [(i.column, i.kind) for i in issues] == [
        ("b", "null_rate"),
        ("b", "nonfinite"),
        ("b", "out_of_range"),
    ]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.none(), finite_floats, st.just(math.inf)), min_size=1, max_size=80))
def test_data_against_itself_has_no_issues(raw: list[float | None]) -> None:
    sketches = {"x": numeric_sketch("x", raw), "c": categorical_sketch("c", [str(v) for v in raw])}
    assert (
        quality(
            sketches,
            sketches,
            null_rate_increase=0.0,
            out_of_range_share=0.0,
            new_category_share=0.0,
        )
        == ()
    )


def test_empty_inputs_and_empty_current_columns() -> None:
    assert quality({}, {}) == ()
    reference = {"x": numeric_sketch("x", [1.0, None])}
    assert quality(reference, {"x": ColumnSketch("x", "numeric", 0)}) == ()


# --- hostile input -------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, -0.01, 1.01, math.inf, True, "0.1", None])
@pytest.mark.parametrize(
    "name",
    [
        "null_rate_increase",
        "out_of_range_share",
        "new_category_share",
        "nonfinite_increase",
        "invalid_increase",
    ],
)
def test_limits_outside_zero_one_are_refused(name: str, bad: object) -> None:
    with pytest.raises(InvalidParameter, match=name):
        quality({}, {}, **{name: bad})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "sketch",
    [
        ColumnSketch("x", "numeric", 3, nulls=4),
        ColumnSketch("x", "numeric", 3, nulls=2, nonfinite=2),
        ColumnSketch("x", "numeric", -1),
        ColumnSketch("x", "numeric", 3, nulls=-1),
        ColumnSketch("x", "numeric", 3.5),  # type: ignore[arg-type]
    ],
)
def test_inconsistent_sketches_are_refused(sketch: ColumnSketch) -> None:
    fine = numeric_sketch("x", [1.0, 2.0, 3.0])
    with pytest.raises(InvalidParameter, match="sketch of column"):
        quality({"x": fine}, {"x": sketch})
    with pytest.raises(InvalidParameter, match="sketch of column"):
        quality({"x": sketch}, {"x": fine})


def test_hostile_category_names_are_shortened_in_the_detail() -> None:
    huge = "x" * 100_000
    reference = {"c": categorical_sketch("c", ["a"])}
    current = {"c": categorical_sketch("c", [huge, "\x00\n<script>"])}
    (issue,) = quality(reference, current)
    assert issue.value == 1.0
    assert len(issue.detail) < 400
    assert issue.to_json()["kind"] == "new_category"


def test_huge_counts_do_not_overflow() -> None:
    big = 10**18
    reference = {"c": ColumnSketch("c", "categorical", big, nulls=0, counts={"a": big})}
    current = {"c": ColumnSketch("c", "categorical", big, nulls=big // 2, counts={"a": big // 2})}
    (issue,) = quality(reference, current)
    assert issue.kind == "null_rate"
    assert issue.value == pytest.approx(0.5)


# --- with the sketch builder (the sketches a monitor really compares) ----------------------


def built(values: np.ndarray, kind: str = "numeric") -> ColumnSketch:
    builder = SketchBuilder({"x": kind})  # type: ignore[dict-item]
    builder.update({"x": values})
    return builder.result()["x"]


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.floats(-3, 3),
    st.floats(0.2, 3),
    st.sampled_from([1500, 20_000]),
)
def test_out_of_range_of_built_sketches_is_within_the_grid_error(
    seed: int, shift: float, scale: float, n: int
) -> None:
    rng = np.random.default_rng(seed)
    ref = rng.normal(0, 1, n)
    cur = rng.normal(shift, scale, n)
    true = float(np.mean((cur < ref.min()) | (cur > ref.max())))
    estimate = out_of_range_fraction(built(ref), built(cur))
    # the builder's grid is 0.001 apart: 0.001 per end, plus its quantiles' own rank error
    assert abs(estimate - true) <= 0.002 + 0.002


def test_out_of_range_from_built_tails_is_exact() -> None:
    rng = np.random.default_rng(1)
    ref = rng.uniform(0, 1, 5000)
    cur = np.concatenate([rng.uniform(0, 1, 4990), [1.5, 2.0, 7.0], [-1.0] * 7])
    current = built(cur)
    assert current.values is None  # beyond EXACT_LIMIT: only the tails can be exact
    true = np.count_nonzero((cur < ref.min()) | (cur > ref.max()))
    assert true >= 10
    assert out_of_range_fraction(built(ref), current) == true / 5000


def test_wrong_type_values_are_an_issue() -> None:
    reference = {"x": built(np.array([1.0, 2.0, 3.0, 4.0]))}
    current = {"x": built(np.array([1.0, "2", "three", 4.0], dtype=object))}
    assert current["x"].invalid == 2
    issues = quality(reference, current)
    assert [i.kind for i in issues] == ["invalid_value"]
    assert issues[0].value == pytest.approx(0.5)
    assert quality(reference, current, invalid_increase=0.5) == ()
    with pytest.raises(InvalidParameter, match="invalid values than rows"):
        quality(reference, {"x": ColumnSketch("x", "numeric", 2, nulls=1, invalid=2)})


def test_built_sketches_of_the_same_data_have_no_issues_and_a_shift_has() -> None:
    rng = np.random.default_rng(2)
    ref = rng.normal(0, 1, 30_000)
    same = quality({"x": built(ref)}, {"x": built(ref)}, out_of_range_share=0.0)
    assert same == ()
    shifted = quality({"x": built(ref)}, {"x": built(ref + 3.0)})
    assert [i.kind for i in shifted] == ["out_of_range"]
    assert shifted[0].value == pytest.approx(float(np.mean(ref + 3.0 > ref.max())), abs=0.004)


def test_tails_that_do_not_reach_back_fall_back_to_the_grid() -> None:
    rng = np.random.default_rng(3)
    ref = rng.uniform(0, 1, 5000)
    cur = np.concatenate([rng.uniform(0, 1, 4800), rng.uniform(2, 3, 200)])  # 200 > 64 tail values
    current = built(cur)
    assert min(current.tails[1]) > ref.max()  # type: ignore[index]
    true = float(np.mean((cur < ref.min()) | (cur > ref.max())))
    estimate = out_of_range_fraction(built(ref), current)
    assert abs(estimate - true) <= 0.004


def test_tails_holding_every_value_give_the_exact_share() -> None:
    # a hand-made sketch: a two-point grid (its estimate would be 0.6), tails with all five values
    reference = numeric_sketch("x", [0.0, 10.0])
    current = ColumnSketch(
        "x",
        "numeric",
        6,
        nulls=1,
        min=-5.0,
        max=20.0,
        mean=0.0,
        std=1.0,
        quantiles=(-5.0, 20.0),
        tails=((-5.0, 1.0, 2.0, 3.0, 20.0), (-5.0, 1.0, 2.0, 3.0, 20.0)),
    )
    assert out_of_range_fraction(reference, current) == pytest.approx(2 / 5)


# --- JSON ----------------------------------------------------------------------------------


def test_issues_round_trip_through_json() -> None:
    reference = {"x": numeric_sketch("x", [0.0, 1.0]), "gone": categorical_sketch("gone", ["a"])}
    current = {"x": numeric_sketch("x", [None, math.inf, 5.0, 0.5], exact=True)}
    issues = quality(reference, current)
    assert len(issues) == 4
    for issue in issues:
        assert QualityIssue.from_json(json.loads(json.dumps(issue.to_json()))) == issue


@pytest.mark.parametrize(
    "raw",
    [
        None,
        [],
        {"column": "x", "kind": "null_rate", "value": 0.5, "limit": 0.1},
        {"column": "x", "kind": "null_rate", "value": 0.5, "limit": 0.1, "detail": "", "more": 1},
        {"column": "x", "kind": "bogus", "value": 0.5, "limit": 0.1, "detail": ""},
        {"column": 3, "kind": "null_rate", "value": 0.5, "limit": 0.1, "detail": ""},
        {"column": "x" * 10_001, "kind": "null_rate", "value": 0.5, "limit": 0.1, "detail": ""},
        {"column": "x", "kind": "null_rate", "value": "0.5", "limit": 0.1, "detail": ""},
        {"column": "x", "kind": "null_rate", "value": math.nan, "limit": 0.1, "detail": ""},
        {"column": "x", "kind": "null_rate", "value": 0.5, "limit": 10**400, "detail": ""},
        {"column": "x", "kind": "null_rate", "value": True, "limit": 0.1, "detail": ""},
        {"column": "x", "kind": "null_rate", "value": 0.5, "limit": 0.1, "detail": None},
    ],
)
def test_hostile_issue_json_is_refused(raw: object) -> None:
    with pytest.raises(InvalidParameter, match="quality issue"):
        QualityIssue.from_json(raw)
