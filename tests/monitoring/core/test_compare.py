"""compare and column_drift: the default tests, the dataset rule, multiple-testing
corrections, and the report's JSON."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from shamal.errors import InvalidParameter
from shamal.monitoring.core import (
    ColumnSketch,
    DriftReport,
    SketchBuilder,
    column_drift,
    compare,
    corrected,
)


def sketches(columns: dict[str, Any]) -> dict[str, ColumnSketch]:
    builder = SketchBuilder(
        {
            k: "categorical" if np.asarray(v).dtype == object else "numeric"
            for k, v in columns.items()
        }
    )
    builder.update({k: np.asarray(v) for k, v in columns.items()})
    return builder.result()


def frames(rows: int, shift: float, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "num": rng.normal(shift, 1.0, rows),
        "few": rng.integers(0, 4 + int(shift > 0), rows).astype(float),
        "cat": rng.choice(
            np.array(["a", "b", "c", "d"], dtype=object), rows, p=[0.4, 0.3, 0.2, 0.1]
        )
        if shift == 0
        else rng.choice(np.array(["a", "b", "c", "d"], dtype=object), rows),
        "flag": (rng.random(rows) < 0.3 + shift / 4).astype(object),
    }


def test_small_reference_gets_p_value_tests() -> None:
    ref, cur = sketches(frames(600, 0.0, 1)), sketches(frames(900, 0.0, 2))
    report = compare(ref, cur)
    assert {c.column: c.test for c in report.columns} == {
        "num": "ks",
        "few": "chisquare",
        "cat": "chisquare",
        "flag": "z",
    }
    assert all(c.p_value is not None and 0 <= c.p_value <= 1 for c in report.columns)


def test_large_reference_gets_distances() -> None:
    ref, cur = sketches(frames(5000, 0.0, 1)), sketches(frames(5000, 0.0, 2))
    tests = {c.column: (c.test, c.p_value) for c in compare(ref, cur).columns}
    assert tests == {
        "num": ("wasserstein", None),
        "few": ("jensenshannon", None),
        "cat": ("jensenshannon", None),
        "flag": ("jensenshannon", None),
    }


def test_the_dataset_drifts_when_the_share_reaches_drift_share() -> None:
    ref = sketches(frames(5000, 0.0, 1))
    same, moved = sketches(frames(5000, 0.0, 2)), sketches(frames(5000, 1.0, 3))
    calm, shifted = compare(ref, same), compare(ref, moved)
    assert (calm.share, calm.drifted) == (0.0, False)
    assert shifted.share == sum(c.drifted for c in shifted.columns) / 4
    assert shifted.share >= 0.5
    assert shifted.drifted
    assert compare(ref, moved, drift_share=1.0).drifted is (shifted.share == 1.0)


def test_named_tests_and_thresholds_are_used() -> None:
    ref, cur = sketches(frames(5000, 0.0, 1)), sketches(frames(5000, 0.3, 2))
    report = compare(ref, cur, tests={"num": "psi", "cat": "chisquare"}, thresholds={"num": 0.5})
    by = {c.column: c for c in report.columns}
    assert (by["num"].test, by["num"].threshold) == ("psi", 0.5)
    assert by["num"].drifted is (by["num"].statistic >= 0.5)
    assert by["cat"].test == "chisquare"


def test_columns_without_values_or_missing_are_not_tested() -> None:
    ref = sketches({"a": np.arange(50.0), "b": np.arange(50.0), "c": np.arange(50.0)})
    cur = sketches({"a": np.arange(50.0), "b": np.full(50, np.nan)})
    assert [c.column for c in compare(ref, cur).columns] == ["a"]
    assert compare({}, {}).drifted is False


@pytest.mark.parametrize(
    "kwargs",
    [
        {"correction": "sidak"},
        {"drift_share": 1.5},
        {"drift_share": math.nan},
        {"tests": {"nope": "ks"}},
        {"tests": {"a": "median"}},
        {"thresholds": {"a": -1.0}},
        {"thresholds": {"a": math.inf}},
        {"tests": {"a": "ks"}, "thresholds": {"a": 2.0}},
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any]) -> None:
    ref = sketches({"a": np.arange(50.0)})
    with pytest.raises(InvalidParameter):
        compare(ref, ref, **kwargs)


def test_a_changed_kind_is_refused() -> None:
    numbers = sketches({"a": np.arange(50.0)})["a"]
    words = sketches({"a": np.array(["x"] * 50, dtype=object)})["a"]
    with pytest.raises(InvalidParameter):
        column_drift(numbers, words)


def holm_reference(ps: list[float]) -> list[float]:
    """Holm's step-down adjustment, written out as the textbook states it."""
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    out = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        out[i] = running
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=40))
def test_corrections(ps: list[float]) -> None:
    assert corrected(ps, "none") == ps
    assert corrected(ps, "bonferroni") == pytest.approx([min(1.0, p * len(ps)) for p in ps])
    assert corrected(ps, "holm") == pytest.approx(holm_reference(ps))
    assert corrected(ps, "bh") == pytest.approx(list(stats.false_discovery_control(ps)))


def test_a_correction_changes_p_value_verdicts_only() -> None:
    ref, cur = sketches(frames(600, 0.0, 1)), sketches(frames(900, 0.15, 2))
    plain, strict = compare(ref, cur), compare(ref, cur, correction="bonferroni")
    for a, b in zip(plain.columns, strict.columns, strict=True):
        assert a.statistic == b.statistic
        assert b.p_value == pytest.approx(min(1.0, (a.p_value or 0) * 4))
        assert b.drifted == (b.p_value <= 0.05 if b.test == "ks" else (b.p_value or 0) < 0.05)
    assert strict.correction == "bonferroni"


def test_report_json_round_trip() -> None:
    ref, cur = sketches(frames(800, 0.0, 1)), sketches(frames(3000, 0.2, 2))
    for report in (compare(ref, cur, correction="bh"), compare(cur, ref)):
        text = json.dumps(report.to_json(), allow_nan=False)
        assert DriftReport.from_json(json.loads(text)) == report


def _report_json() -> dict[str, Any]:
    ref, cur = sketches(frames(800, 0.0, 1)), sketches(frames(900, 0.2, 2))
    return compare(ref, cur).to_json()


HOSTILE: list[tuple[str, Any]] = [
    ("not an object", "report"),
    ("extra field", {"extra": 1}),
    ("share above one", {"share": 1.5}),
    ("share NaN", {"share": math.nan}),
    ("drifted not bool", {"drifted": "yes"}),
    ("correction", {"correction": "sidak"}),
    ("columns not a list", {"columns": {"a": 1}}),
    ("huge columns", {"columns": [{}] * 100_001}),
    ("column not an object", {"columns": [1]}),
    ("unknown test", {"columns": [{**_report_json()["columns"][0], "test": "median"}]}),
    ("p-value on a distance", {"columns": [{**_report_json()["columns"][0], "test": "psi"}]}),
    ("p-value above one", {"columns": [{**_report_json()["columns"][0], "p_value": 2.0}]}),
    ("infinite statistic", {"columns": [{**_report_json()["columns"][0], "statistic": math.inf}]}),
    ("bool threshold", {"columns": [{**_report_json()["columns"][0], "threshold": True}]}),
]


@pytest.mark.parametrize(("why", "change"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_report_json_is_refused(why: str, change: Any) -> None:
    raw = change if not isinstance(change, dict) else {**_report_json(), **change}
    with pytest.raises(InvalidParameter):
        DriftReport.from_json(raw)
