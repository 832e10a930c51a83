"""The engine against a simulation: random DAGs (fan-outs, failures, conditions) run to the
end with every step's decision checked against what its upstream steps did."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shamal.errors import InvalidParameter
from shamal.pipelines import PipelineSpec, Ref, StepSpec, step_condition
from shamal.pipelines._engine import (  # the engine is internal: tested where it lives
    DONE,
    RunState,
    Settle,
    Start,
    StepRecord,
    StepState,
    advance,
    check_condition,
    run_state,
)


@st.composite
def dags(draw: st.DrawFn) -> tuple[PipelineSpec, set[str]]:
    count = draw(st.integers(1, 7))
    steps = []
    for i in range(count):
        ups = draw(st.sets(st.integers(0, i - 1), max_size=2)) if i else set()
        args = {f"u{u}": Ref("step", name=f"s{u}") for u in sorted(ups)}
        mapped = draw(st.booleans())
        if mapped:
            args["items"] = Ref("value", value=list(range(draw(st.integers(0, 4)))))
        when = "params.go == true" if draw(st.integers(0, 5)) == 0 else None
        steps.append(
            StepSpec(
                name=f"s{i}", command=("x",), args=args, map="items" if mapped else None, when=when
            )
        )
    failing = {f"s{i}" for i in range(count) if draw(st.integers(0, 4)) == 0}
    spec = PipelineSpec(name="p", steps=tuple(steps), params={"go": False}).validated()
    return spec, failing


def _simulate(spec: PipelineSpec, failing: set[str]) -> dict[str, StepRecord]:
    records: dict[str, StepRecord] = {}
    started: list[str] = []
    for _ in range(200):
        decisions = advance(spec, {"go": False}, records)
        if not decisions:
            break
        for d in decisions:
            if isinstance(d, Start):
                assert d.key not in started, f"{d.key} started twice"
                started.append(d.key)
                ok = d.name not in failing
                output = {"key": d.key, "args": dict(d.args)}
                records[d.key] = StepRecord(
                    d.key,
                    d.name,
                    d.index,
                    StepState.SUCCEEDED if ok else StepState.FAILED,
                    output if ok else None,
                )
            else:
                assert isinstance(d, Settle)
                records[d.key] = StepRecord(d.key, d.name, None, d.state, d.output, d.reason)
    else:
        raise AssertionError("the run never settled")
    return records


@settings(max_examples=300, deadline=None)
@given(dags())
def test_every_step_ends_as_its_upstream_steps_decide(case: tuple[PipelineSpec, set[str]]) -> None:
    spec, failing = case
    records = _simulate(spec, failing)
    for s in spec.steps:
        record = records[s.name]
        ups = [records[u].state for u in s.upstream]
        if any(u in (StepState.FAILED, StepState.UPSTREAM_FAILED) for u in ups):
            assert record.state is StepState.UPSTREAM_FAILED
        elif any(u is StepState.SKIPPED for u in ups) or s.when is not None:
            assert record.state is StepState.SKIPPED  # params.go is false
        elif s.map is not None:
            width = len(s.args["items"].value)
            items = [records.get(f"{s.name}[{i}]") for i in range(width)]
            if s.name in failing and width:
                assert record.state is StepState.FAILED
            else:
                assert record.state is StepState.SUCCEEDED
                assert [o["key"] for o in record.output] == [f"{s.name}[{i}]" for i in range(width)]
                assert all(i is not None and i.state in DONE for i in items)
        else:
            assert record.state is (StepState.FAILED if s.name in failing else StepState.SUCCEEDED)
            for u in s.upstream if record.output is not None else ():
                # it got its upstream step's output as its argument
                assert record.output["args"][f"u{u[1:]}"] == records[u].output
    expected = (
        RunState.FAILED
        if any(r.state in (StepState.FAILED, StepState.UPSTREAM_FAILED) for r in records.values())
        else RunState.SUCCEEDED
    )
    assert run_state(spec, records) is expected


def _spec(width: int) -> PipelineSpec:
    return PipelineSpec(
        name="p",
        steps=(
            StepSpec(name="fan", command=("x",), args={"i": Ref("param", name="items")}, map="i"),
        ),
        params={"items": []},
    ).validated()


def test_a_fan_out_past_the_limit_fails_before_any_item_starts() -> None:
    decisions = advance(_spec(0), {"items": list(range(10_000))}, {})
    assert len(decisions) == 1
    assert isinstance(decisions[0], Settle)
    assert decisions[0].state is StepState.FAILED
    assert "holds 10000 items; a mapped step fans out to at most 5000" in decisions[0].reason
    assert isinstance(advance(_spec(0), {"items": 3}, {})[0], Settle)


def test_a_fan_out_cut_short_by_a_restart_starts_only_the_missing_items() -> None:
    spec = _spec(3)
    opened = advance(spec, {"items": [1, 2, 3]}, {})
    assert [type(d).__name__ for d in opened] == ["Settle", "Start", "Start", "Start"]
    records = {
        "fan": StepRecord("fan", "fan", None, StepState.RUNNING),
        "fan[0]": StepRecord("fan[0]", "fan", 0, StepState.SUCCEEDED, 10),
    }
    again = advance(spec, {"items": [1, 2, 3]}, records)
    assert [d.key for d in again] == ["fan[1]", "fan[2]"]


def test_conditions_read_params_and_outputs_and_nothing_else() -> None:
    context: Mapping[str, Any] = {"params": {"n": 3}, "steps": {"a": {"output": {"f1": 0.9}}}}
    assert step_condition("steps.a.output.f1 >= 0.8 and params.n == 3", context)
    assert not step_condition("steps.b.output.f1 >= 0.8", context)  # missing: false
    for hostile in ("metrics.f1 > 1", "__import__('os')", "steps.a.__class__", "x" * 5000):
        try:
            check_condition(hostile)
        except InvalidParameter:
            continue
        raise AssertionError(f"{hostile[:40]!r} was accepted")
