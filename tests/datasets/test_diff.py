"""Comparing profiles: schema changes and per-column shifts."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from shamal.datasets import Profile, Profiler, diff


def _profile(columns: dict[str, object], **settings: object) -> Profile:
    profiler = Profiler(**settings)  # type: ignore[arg-type]
    profiler.update(pa.table(columns))
    return profiler.result()


N = 200_000


def test_the_same_distribution_barely_moves() -> None:
    rng = np.random.default_rng(0)
    a = _profile({"x": rng.normal(0, 1, N), "c": rng.choice(["a", "b", "c"], N)})
    b = _profile({"x": rng.normal(0, 1, N), "c": rng.choice(["a", "b", "c"], N)})
    shift = diff(a, b)
    assert not shift.schema_changed
    x = shift.column("x")
    assert x.ks is not None
    assert x.ks < 0.03
    assert x.psi is not None
    assert x.psi < 0.01
    assert abs(x.mean_change or 0.0) < 0.02
    c = shift.column("c")
    assert c.ks is None
    assert c.psi is not None
    assert c.psi < 0.01


def test_a_shifted_distribution_shows_in_ks_psi_and_mean() -> None:
    rng = np.random.default_rng(1)
    a = _profile({"x": rng.normal(0, 1, N)})
    b = _profile({"x": rng.normal(0.5, 1, N)})
    x = diff(a, b).column("x")
    # The true KS statistic between N(0,1) and N(0.5,1) is 2*Phi(0.25)-1 = 0.197.
    assert x.ks == pytest.approx(0.197, abs=0.02)
    assert x.psi is not None
    assert x.psi > 0.2
    assert x.mean_change == pytest.approx(0.5, abs=0.02)
    far = diff(a, _profile({"x": rng.normal(10, 1, N)})).column("x")
    assert far.ks == 1.0


def test_categorical_shift_and_null_rate_change() -> None:
    rng = np.random.default_rng(2)
    before = rng.choice(["a", "b", "c"], N, p=[0.6, 0.3, 0.1])
    after = rng.choice(["a", "b", "c"], N, p=[0.2, 0.3, 0.5])
    mask = rng.random(N) < 0.2
    a = _profile({"c": pa.array(before)})
    b = _profile({"c": pa.array(after, mask=mask)})
    c = diff(a, b).column("c")
    assert c.psi is not None
    assert c.psi > 0.5
    assert c.null_rate_change == pytest.approx(0.2, abs=0.01)


def test_schema_differences() -> None:
    a = _profile({"id": [1, 2], "gone": ["x", "y"], "v": [1.0, 2.0]})
    b = _profile({"id": ["1", "2"], "v": [1.0, 2.0], "new": [True, False]})
    shift = diff(a, b)
    assert shift.schema_changed
    assert (shift.added, shift.removed) == (("new",), ("gone",))
    assert [(t.name, t.before, t.after) for t in shift.type_changes] == [("id", "int64", "string")]
    assert shift.column("id").ks is None
    assert shift.column("id").mean_change is None
    assert [c.name for c in shift.columns] == ["id", "v"]
    with pytest.raises(KeyError):
        shift.column("new")
    assert json.loads(json.dumps(shift.to_json()))["added"] == ["new"]


def test_personal_columns_compare_by_counts_only() -> None:
    rng = np.random.default_rng(3)
    a = _profile({"p": rng.normal(0, 1, 1000)}, personal={"p"})
    b = _profile({"p": rng.normal(5, 1, 1000)}, personal={"p"})
    p = diff(a, b).column("p")
    assert (p.ks, p.psi, p.mean_change) == (None, None, None)
    assert p.distinct_change is not None
