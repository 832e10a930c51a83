"""What a pipeline run does next (pure): a function of its spec, parameters and the steps'
records, so the server's loop, a restarted server and the tests all decide the same way.

A step's record is keyed by its name; a mapped step also has one record per item
(``score[0]``, ``score[1]``...), the step's own record then standing for the whole fan-out.
The engine never starts anything: it returns :class:`Start` and :class:`Settle` decisions
that the service carries out, each with a compare-and-set on the record, so a decision
carried out twice (two servers, a restart) changes nothing the second time.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shamal.errors import InvalidParameter
from shamal.pipelines._definitions import MAX_MAP_ITEMS, PipelineSpec, Ref, StepSpec
from shamal.pipelines._gate import Rule, check_step_name

__all__ = [
    "ACTIVE",
    "DONE",
    "FAILED",
    "RunState",
    "Settle",
    "Start",
    "StepRecord",
    "StepState",
    "advance",
    "check_condition",
    "item_key",
    "run_state",
    "step_condition",
]


class StepState(enum.StrEnum):
    """A step's life. ``cached``: its result came from an earlier run with the same key;
    ``upstream_failed``: a step it needs failed, so it never started."""

    PENDING = "pending"
    SUBMITTING = "submitting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    CACHED = "cached"
    FAILED = "failed"
    SKIPPED = "skipped"
    UPSTREAM_FAILED = "upstream_failed"
    CANCELLED = "cancelled"


class RunState(enum.StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


ACTIVE = frozenset({StepState.PENDING, StepState.SUBMITTING, StepState.RUNNING})
DONE = frozenset({StepState.SUCCEEDED, StepState.CACHED})
FAILED = frozenset({StepState.FAILED, StepState.UPSTREAM_FAILED, StepState.CANCELLED})


def check_condition(rule: str) -> Rule:
    """A step's ``when`` parsed: a rule in the gates' language over ``params.*`` and
    ``steps.STEP.output...``.

    Raises:
        InvalidParameter: a rule that does not parse, or reads other names.
    """
    return Rule.parse(rule, names=check_step_name)


def step_condition(rule: str, context: Mapping[str, Any]) -> bool:
    """Whether a step's ``when`` holds in ``context`` (``{"params": ..., "steps": {name:
    {"output": ...}}}``); a name that is not there makes it false.

    Raises:
        InvalidParameter: as :func:`check_condition`.
    """
    return check_condition(rule).evaluate(context).passed


def item_key(name: str, index: int) -> str:
    return f"{name}[{index}]"


@dataclass(frozen=True, slots=True)
class StepRecord:
    """Where one step (or one item of a mapped step) stands."""

    key: str
    name: str
    index: int | None
    state: StepState
    output: Any = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Start:
    """Start ``key`` with these arguments (a mapped step's items come together, the step's
    own record first opened as running: ``fan_out`` is their number)."""

    key: str
    name: str
    index: int | None
    args: Mapping[str, Any]
    #: Arguments that name a dataset version to resolve to its number first.
    datasets: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Settle:
    """Put ``key`` in a final state (or open a mapped step as running)."""

    key: str
    name: str
    state: StepState
    output: Any = None
    reason: str = ""
    fan_out: int | None = None


Decision = Start | Settle


def advance(
    spec: PipelineSpec,
    params: Mapping[str, Any],
    records: Mapping[str, StepRecord],
    *,
    max_map_items: int = MAX_MAP_ITEMS,
) -> list[Decision]:
    """The decisions that move the run on, given where its steps stand now."""
    decisions: list[Decision] = []
    for step in spec.steps:
        own = records.get(step.name)
        if own is not None and own.state not in ACTIVE:
            continue
        if own is not None and step.map is not None:
            decisions.extend(_continue_fan_out(step, params, records))
            continue
        if own is not None:
            continue  # started, and its job decides the rest
        decisions.extend(_first_decisions(step, params, records, max_map_items))
    return decisions


def _first_decisions(
    step: StepSpec,
    params: Mapping[str, Any],
    records: Mapping[str, StepRecord],
    max_map_items: int,
) -> list[Decision]:
    blocked = _blocked(step, records)
    if blocked is not None:
        return [blocked] if isinstance(blocked, Settle) else []
    if step.when is not None:
        try:
            go = step_condition(step.when, _context(params, records))
        except InvalidParameter as exc:
            return [Settle(step.name, step.name, StepState.FAILED, reason=f"when: {exc}")]
        if not go:
            reason = f"skipped: {step.when} is false"
            return [Settle(step.name, step.name, StepState.SKIPPED, reason=reason)]
    try:
        args, datasets = _arguments(step, params, records)
    except LookupError as exc:
        return [Settle(step.name, step.name, StepState.FAILED, reason=str(exc))]
    if step.map is None:
        return [Start(step.name, step.name, None, args, datasets)]
    return _fan_out(step, args, datasets, max_map_items)


def _blocked(step: StepSpec, records: Mapping[str, StepRecord]) -> Settle | bool | None:
    """None: every step it needs is done; True: some are still on their way; a Settle: it
    can never run (one failed, or was skipped)."""
    waiting = False
    skipped: str | None = None
    for name in step.upstream:
        record = records.get(name)
        if record is None or record.state in ACTIVE:
            waiting = True
        elif record.state in FAILED:  # a failure wins over a skip: the run failed
            reason = f"{name} {record.state.value.replace('_', ' ')}"
            return Settle(step.name, step.name, StepState.UPSTREAM_FAILED, reason=reason)
        elif record.state == StepState.SKIPPED:
            skipped = skipped or name
    if skipped is not None and not waiting:
        reason = f"skipped: {skipped} was skipped"
        return Settle(step.name, step.name, StepState.SKIPPED, reason=reason)
    return True if waiting else None


def _fan_out(
    step: StepSpec, args: Mapping[str, Any], datasets: Mapping[str, str], max_items: int
) -> list[Decision]:
    assert step.map is not None
    items = args[step.map]
    if not isinstance(items, list):
        reason = f"map over {step.map!r} needs a list; it is {type(items).__name__}"
        return [Settle(step.name, step.name, StepState.FAILED, reason=reason)]
    if len(items) > max_items:
        reason = (
            f"{step.map!r} holds {len(items)} items; a mapped step fans out to at most "
            f"{max_items}: batch the items, or ask the operator for a wider limit"
        )
        return [Settle(step.name, step.name, StepState.FAILED, reason=reason)]
    if not items:
        return [Settle(step.name, step.name, StepState.SUCCEEDED, output=[])]
    opened: list[Decision] = [Settle(step.name, step.name, StepState.RUNNING, fan_out=len(items))]
    opened.extend(
        Start(item_key(step.name, i), step.name, i, {**args, step.map: item}, datasets)
        for i, item in enumerate(items)
    )
    return opened


def _continue_fan_out(
    step: StepSpec, params: Mapping[str, Any], records: Mapping[str, StepRecord]
) -> list[Decision]:
    """A mapped step whose items are under way: start any item not started yet (a server
    that stopped while fanning out), and end the step when its last item ends, with the
    items' outputs in order, or failed when any item failed."""
    assert step.map is not None
    args, datasets = _arguments(step, params, records)
    items: list[Any] = args[step.map]
    missing = [
        Start(item_key(step.name, i), step.name, i, {**args, step.map: item}, datasets)
        for i, item in enumerate(items)
        if item_key(step.name, i) not in records
    ]
    if missing:
        return list(missing)
    done = [records[item_key(step.name, i)] for i in range(len(items))]
    if any(r.state in ACTIVE for r in done):
        return []
    failed = [r for r in done if r.state not in DONE]
    if failed:
        reason = f"{len(failed)} of {len(done)} items did not succeed (first: {failed[0].key})"
        return [Settle(step.name, step.name, StepState.FAILED, reason=reason)]
    return [Settle(step.name, step.name, StepState.SUCCEEDED, output=[r.output for r in done])]


def _context(params: Mapping[str, Any], records: Mapping[str, StepRecord]) -> dict[str, Any]:
    steps = {r.name: {"output": r.output} for r in records.values() if r.index is None}
    return {"params": dict(params), "steps": steps}


def _arguments(
    step: StepSpec, params: Mapping[str, Any], records: Mapping[str, StepRecord]
) -> tuple[dict[str, Any], dict[str, str]]:
    args: dict[str, Any] = {}
    datasets: dict[str, str] = {}
    for name, ref in step.args.items():
        if ref.kind == "dataset":
            datasets[name] = ref.name
            args[name] = ref.name
        else:
            args[name] = _resolve(ref, params, records)
    return args, datasets


def _resolve(ref: Ref, params: Mapping[str, Any], records: Mapping[str, StepRecord]) -> Any:
    if ref.kind == "value":
        return ref.value
    if ref.kind == "param":
        if ref.name not in params:
            raise LookupError(f"the run has no value for the parameter {ref.name!r}")
        return params[ref.name]
    value = records[ref.name].output
    for part in ref.path:
        value = _index(ref, value, part)
    return value


def _index(ref: Ref, value: Any, part: str | int) -> Any:
    try:
        if isinstance(value, Mapping) and isinstance(part, str):
            return value[part]
        if isinstance(value, list) and isinstance(part, int):
            return value[part]
    except (KeyError, IndexError):
        pass
    raise LookupError(f"{ref} is not there: the output of {ref.name!r} has no {part!r}")


def run_state(spec: PipelineSpec, records: Mapping[str, StepRecord]) -> RunState:
    """Where the run stands: running while any step may still move."""
    states = []
    for step in spec.steps:
        record = records.get(step.name)
        if record is None or record.state in ACTIVE:
            return RunState.RUNNING
        states.append(record.state)
    if any(r.state in ACTIVE for r in records.values()):
        return RunState.RUNNING
    if StepState.CANCELLED in states:
        return RunState.CANCELLED
    if any(s in (StepState.FAILED, StepState.UPSTREAM_FAILED) for s in states):
        return RunState.FAILED
    return RunState.SUCCEEDED


def downstream(spec: PipelineSpec, start: str) -> list[str]:
    """``start`` and every step that depends on it, in the pipeline's order."""
    reached = {start}
    for step in spec.steps:
        if reached.intersection(step.upstream):
            reached.add(step.name)
    return [s.name for s in spec.steps if s.name in reached]
