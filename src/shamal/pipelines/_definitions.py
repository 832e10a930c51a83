"""Pipelines as data: steps, where each argument comes from, triggers, and the rules a DAG
obeys (pure: no database, web framework or job code).

A :class:`PipelineSpec` is what the SDK's tracing and the YAML reader both produce, what the
server stores (its canonical JSON, so equal pipelines have equal digests) and what the engine
walks. YAML form::

    name: retrain
    team: risk
    params: {min_rows: 1000}
    steps:
      - name: validate
        function: steps.py:validate          # or command: [python, validate.py]
        args: {data: "${data.wine@latest}", min_rows: "${params.min_rows}"}
      - name: train
        function: steps.py:train
        args: {data: "${steps.validate.output.data}"}
        cpus: 1
        memory_mib: 1024
        retries: 1
      - name: score
        function: steps.py:score
        args: {item: "${steps.train.output.folds}"}
        map: item                            # one job per element of that list
      - name: register
        function: steps.py:register
        args: {scores: "${steps.score.output}"}
        when: steps.train.output.f1 >= 0.8   # a rule (see shamal.pipelines.Rule)
    triggers:
      - on: dataset_version_created where dataset = 'wine'
      - schedule: "0 3 * * *"
        timezone: Asia/Dubai
        catch_up: latest
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from shamal.errors import InvalidParameter

__all__ = [
    "MAX_MAP_ITEMS",
    "MAX_STEPS",
    "MAX_VALUE_BYTES",
    "PipelineSpec",
    "Ref",
    "StepSpec",
    "Trigger",
    "check_name",
    "check_value",
    "parse_reference",
]

#: Steps one pipeline may declare; a mapped step counts once however wide it fans out.
MAX_STEPS = 500
#: The widest fan-out a mapped step may make (an operator may lower it); more is refused
#: before any of its jobs starts.
MAX_MAP_ITEMS = 5_000
#: The largest small value (a parameter, an argument, a step's output) as JSON: bigger
#: things travel as dataset versions or artifacts.
MAX_VALUE_BYTES = 16 * 1024
MAX_DEPTH = 32
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_TEAM = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_FUNCTION = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./-]{0,254}\.py:[A-Za-z_][A-Za-z0-9_.]{0,127}$")
_REF = re.compile(r"^\$\{([^{}]{1,512})\}$")
_PATH_PART = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_-]{0,127}|[0-9]{1,6})$")
_DATASET = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,127}(?:@[A-Za-z0-9_.-]{1,64}|/[0-9]{1,9})?$")
RefKind = Literal["value", "param", "step", "dataset"]
CatchUp = Literal["all", "latest", "none"]


def check_name(what: str, name: object) -> str:
    """``name`` if it can name a pipeline, a step or a parameter; else InvalidParameter."""
    if not isinstance(name, str) or not _NAME.match(name):
        shown = repr(name)[:70]
        raise InvalidParameter(
            f"{what} {shown} is not a valid name: use 1-63 lower-case letters, digits, '_' "
            "and '-', starting with a letter or digit"
        )
    return name


def check_value(what: str, value: object) -> Any:
    """``value`` if it is a small JSON value (at most MAX_VALUE_BYTES, MAX_DEPTH deep)."""
    _check_depth(what, value, 0)
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError):
        raise InvalidParameter(
            f"{what} is not a JSON value (numbers, strings, booleans, null, lists, objects with "
            "string keys); pass data as a dataset version and files as artifacts"
        ) from None
    if len(text.encode()) > MAX_VALUE_BYTES:
        raise InvalidParameter(
            f"{what} is {len(text.encode())} bytes as JSON; small values stop at "
            f"{MAX_VALUE_BYTES}: pass data as a dataset version and files as artifacts"
        )
    return value


def _check_depth(what: str, value: object, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise InvalidParameter(f"{what} nests deeper than {MAX_DEPTH} levels")
    if isinstance(value, Mapping):
        for item in value.values():
            _check_depth(what, item, depth + 1)
    elif isinstance(value, list | tuple):
        for item in value:
            _check_depth(what, item, depth + 1)


@dataclass(frozen=True, slots=True)
class Ref:
    """Where one argument of a step comes from.

    ``value``: a literal (``value``); ``param``: the run's parameter ``name``; ``step``:
    the output of step ``name``, indexed by ``path`` (keys and list positions); ``dataset``:
    a dataset version (``customers@prod``, ``customers/3``, ``customers``: the latest),
    resolved to its number when the step starts, which is what the cache key holds.
    """

    kind: RefKind
    name: str = ""
    path: tuple[str | int, ...] = ()
    value: Any = None

    def to_json(self) -> dict[str, Any]:
        if self.kind == "value":
            return {"value": self.value}
        out: dict[str, Any] = {self.kind: self.name}
        if self.path:
            out["path"] = list(self.path)
        return out

    @classmethod
    def from_json(cls, what: str, data: object) -> Ref:
        if not isinstance(data, Mapping) or len(set(data) - {"path"}) != 1:
            raise InvalidParameter(
                f"{what} must be one of {{value: ...}}, {{param: NAME}}, {{step: NAME, path: "
                "[...]}} or {dataset: NAME@ALIAS}"
            )
        kind = next(k for k in data if k != "path")
        if kind == "value":
            return cls("value", value=check_value(what, data["value"]))
        if kind not in ("param", "step", "dataset"):
            raise InvalidParameter(f"{what}: unknown reference kind {str(kind)[:40]!r}")
        path = data.get("path", [])
        if not isinstance(path, list) or len(path) > MAX_DEPTH:
            raise InvalidParameter(f"{what}: path must be a list of at most {MAX_DEPTH} keys")
        return cls(kind, name=_ref_name(what, kind, data[kind]), path=_path(what, path))

    def __str__(self) -> str:
        if self.kind == "value":
            return json.dumps(self.value)
        head = {"param": "params", "step": "steps", "dataset": "data"}[self.kind]
        tail = "".join(f".{p}" for p in self.path)
        return f"${{{head}.{self.name}{'.output' if self.kind == 'step' else ''}{tail}}}"


def _ref_name(what: str, kind: str, name: object) -> str:
    if kind == "dataset":
        if not isinstance(name, str) or not _DATASET.match(name):
            raise InvalidParameter(
                f"{what}: {str(name)[:70]!r} is not a dataset reference (NAME, NAME@ALIAS or "
                "NAME/VERSION)"
            )
        return name
    return check_name(f"{what}: the {kind}", name)


def _path(what: str, parts: Sequence[object]) -> tuple[str | int, ...]:
    out: list[str | int] = []
    for part in parts:
        if isinstance(part, bool) or not isinstance(part, str | int):
            raise InvalidParameter(f"{what}: a path holds keys and list positions")
        text = str(part)
        if not _PATH_PART.match(text):
            raise InvalidParameter(f"{what}: {text[:40]!r} cannot be part of a path")
        out.append(int(text) if isinstance(part, int) or text.isdigit() else text)
    return tuple(out)


def parse_reference(what: str, text: str) -> Ref:
    """A YAML argument: ``${params.n}``, ``${steps.train.output.f1}``, ``${data.wine@3}``;
    anything else is a literal."""
    found = _REF.match(text.strip())
    if found is None:
        return Ref("value", value=check_value(what, text))
    parts = found.group(1).strip().split(".")
    head = parts[0]
    if head == "params" and len(parts) == 2:
        return Ref("param", name=check_name(f"{what}: the parameter", parts[1]))
    if head == "steps" and len(parts) >= 3 and parts[2] == "output":
        name = check_name(f"{what}: the step", parts[1])
        return Ref("step", name=name, path=_path(what, parts[3:]))
    if head == "data" and len(parts) >= 2:
        return Ref("dataset", name=_ref_name(what, "dataset", ".".join(parts[1:])))
    raise InvalidParameter(
        f"{what}: {text[:80]!r} refers to nothing; use ${{params.NAME}}, "
        "${steps.NAME.output[.KEY...]} or ${data.DATASET[@ALIAS]}"
    )


@dataclass(frozen=True, slots=True)
class Trigger:
    """What starts a run by itself: an event filter (``on``) or a cron ``schedule``."""

    on: str | None = None
    schedule: str | None = None
    timezone: str = "UTC"
    catch_up: CatchUp = "latest"
    params: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"params": dict(self.params)}
        if self.on is not None:
            out["on"] = self.on
        else:
            out.update(schedule=self.schedule, timezone=self.timezone, catch_up=self.catch_up)
        return out

    @classmethod
    def from_json(cls, what: str, data: object) -> Trigger:
        if isinstance(data, Mapping) and True in data:  # YAML 1.1 reads the key `on` as true
            data = {("on" if k is True else k): v for k, v in data.items()}
        if not isinstance(data, Mapping) or ("on" in data) == ("schedule" in data):
            raise InvalidParameter(
                f"{what} needs exactly one of 'on' (an event filter) or "
                "'schedule' (a cron expression)"
            )
        params, catch_up = _trigger_fields(what, data)
        return cls(
            on=data.get("on"),
            schedule=data.get("schedule"),
            timezone=str(data.get("timezone", "UTC")),
            catch_up=catch_up,
            params={
                check_name(f"{what}: parameter", k): check_value(what, v) for k, v in params.items()
            },
        )


def _trigger_fields(what: str, data: Mapping[str, Any]) -> tuple[Mapping[str, Any], CatchUp]:
    """A trigger's parameters and catch-up policy, once its keys and texts are checked."""
    unknown = set(data) - {"on", "schedule", "timezone", "catch_up", "params"}
    if unknown:
        raise InvalidParameter(f"{what}: unknown keys {sorted(map(str, unknown))[:5]}")
    params = data.get("params") or {}
    if not isinstance(params, Mapping):
        raise InvalidParameter(f"{what}: params must be a mapping")
    catch_up = data.get("catch_up", "latest")
    if catch_up not in ("all", "latest", "none"):
        raise InvalidParameter(f"{what}: catch_up is one of all, latest, none")
    for key in ("on", "schedule", "timezone"):
        if key in data and (not isinstance(data[key], str) or len(data[key]) > 4096):
            raise InvalidParameter(f"{what}: {key} must be text of at most 4096 characters")
    return params, catch_up


@dataclass(frozen=True, slots=True)
class StepSpec:
    """One step: a Python function (``file.py:name`` in the pipeline's code folder) or a
    command, run as a job with its own resources, team, time limit, retries and executor.

    ``map``: the argument whose list value fans the step out, one job per element (the
    step's output is then the list of their outputs, in order). ``when``: a rule over the
    outputs of earlier steps and the parameters; false skips the step and what depends on
    it. ``after``: steps it waits for without taking their output. ``cache``: False never
    reuses an earlier result. ``executor``: what runs its job (``local``, ``ray``; None: the
    server's default), which the server must run.
    """

    name: str
    function: str | None = None
    command: tuple[str, ...] | None = None
    args: Mapping[str, Ref] = field(default_factory=dict)
    map: str | None = None
    when: str | None = None
    after: tuple[str, ...] = ()
    cpus: float = 1.0
    memory_mib: int = 1024
    gpus: int = 0
    time_limit_s: float | None = None
    retries: int = 0
    team: str | None = None
    pool: str | None = None
    cache: bool = True
    env: Mapping[str, str] = field(default_factory=dict)
    executor: Literal["local", "ray"] | None = None

    @property
    def upstream(self) -> tuple[str, ...]:
        """The steps this one waits for, each once, in a stable order."""
        named = [r.name for r in self.args.values() if r.kind == "step"]
        return tuple(dict.fromkeys([*named, *self.after, *_when_steps(self.when)]))

    def to_json(self) -> dict[str, Any]:
        data = {
            "name": self.name,
            "function": self.function,
            "command": list(self.command) if self.command is not None else None,
            "args": {k: self.args[k].to_json() for k in sorted(self.args)},
            "map": self.map,
            "when": self.when,
            "after": list(self.after),
            "cpus": self.cpus,
            "memory_mib": self.memory_mib,
            "gpus": self.gpus,
            "time_limit_s": self.time_limit_s,
            "retries": self.retries,
            "team": self.team,
            "pool": self.pool,
            "cache": self.cache,
            "env": dict(sorted(self.env.items())),
        }
        # Only when set: a pipeline that names no executor keeps the digest it had before
        # steps could name one (and so its version on a second registration).
        if self.executor is not None:
            data["executor"] = self.executor
        return data


_STEP_KEYS = frozenset(StepSpec.__dataclass_fields__)
_WHEN_STEP = re.compile(r"\bsteps\.([a-z0-9][a-z0-9_-]{0,62})\.")


def _when_steps(when: str | None) -> list[str]:
    return _WHEN_STEP.findall(when) if when else []


def step_from_json(data: object, *, yaml_refs: bool = False) -> StepSpec:
    """A step from its JSON (``yaml_refs``: arguments in the YAML ``${...}`` form)."""
    if not isinstance(data, Mapping):
        raise InvalidParameter("each step must be a mapping with at least a name")
    name = check_name("step", data.get("name"))
    what = f"step {name!r}"
    unknown = set(data) - _STEP_KEYS
    if unknown:
        raise InvalidParameter(f"{what}: unknown keys {sorted(map(str, unknown))[:5]}")
    args = data.get("args") or {}
    if not isinstance(args, Mapping):
        raise InvalidParameter(f"{what}: args must be a mapping")
    refs = {
        check_name(f"{what}: argument", k): _arg(f"{what}, argument {k!r}", v, yaml_refs)
        for k, v in args.items()
    }
    return StepSpec(
        name=name,
        function=_function(what, data.get("function")),
        command=_command(what, data.get("command")),
        args=refs,
        map=None if data.get("map") is None else check_name(f"{what}: map", data["map"]),
        when=_text(what, "when", data.get("when"), 4096),
        after=tuple(check_name(f"{what}: after", a) for a in _list(what, data.get("after"))),
        cpus=_number(what, "cpus", data.get("cpus", 1.0), 0.01, 512),
        memory_mib=int(_number(what, "memory_mib", data.get("memory_mib", 1024), 16, 4 << 20)),
        gpus=int(_number(what, "gpus", data.get("gpus", 0), 0, 64)),
        time_limit_s=None
        if data.get("time_limit_s") is None
        else _number(what, "time_limit_s", data["time_limit_s"], 1, 30 * 86400),
        retries=int(_number(what, "retries", data.get("retries", 0), 0, 20)),
        team=None if data.get("team") is None else _team(what, data["team"]),
        pool=_text(what, "pool", data.get("pool"), 64),
        cache=_flag(what, "cache", data.get("cache", True)),
        env=_env(what, data.get("env")),
        executor=_executor(what, data.get("executor")),
    )


def _arg(what: str, value: object, yaml_refs: bool) -> Ref:
    if yaml_refs:
        if isinstance(value, str):
            return parse_reference(what, value)
        return Ref("value", value=check_value(what, value))
    return Ref.from_json(what, value)


def _executor(what: str, value: object) -> Literal["local", "ray"] | None:
    if value is None:
        return None
    if value == "local":
        return "local"
    if value == "ray":
        return "ray"
    raise InvalidParameter(f"{what}: executor is local or ray (or left out: the server's)")


def _function(what: str, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _FUNCTION.match(value) or ".." in value:
        raise InvalidParameter(
            f"{what}: function must be FILE.py:NAME, the file relative to the pipeline's "
            "folder (no '..')"
        )
    return value


def _command(what: str, value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or not value
        or len(value) > 256
        or not all(isinstance(p, str) and 0 < len(p) <= 4096 and "\0" not in p for p in value)
    ):
        raise InvalidParameter(f"{what}: command must be a list of 1-256 non-empty strings")
    return tuple(value)


def _list(what: str, value: object) -> list[object]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidParameter(f"{what}: expected a list")
    if len(value) > MAX_STEPS:
        raise InvalidParameter(f"{what}: at most {MAX_STEPS} steps")
    return value


def _text(what: str, key: str, value: object, limit: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > limit or "\0" in value:
        raise InvalidParameter(f"{what}: {key} must be text of 1-{limit} characters")
    return value


def _number(what: str, key: str, value: object, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise InvalidParameter(f"{what}: {key} must be a number from {low:g} to {high:g}")
    return float(value)


def _flag(what: str, key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidParameter(f"{what}: {key} must be true or false")
    return value


def _team(what: str, value: object) -> str:
    if not isinstance(value, str) or not _TEAM.match(value):
        raise InvalidParameter(f"{what}: {str(value)[:70]!r} is not a team name")
    return value


def _env(what: str, value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise InvalidParameter(f"{what}: env must map names to strings")
    return dict(value)


@dataclass(frozen=True, slots=True)
class PipelineSpec:
    """A whole pipeline: its steps in a valid order, parameters with defaults, triggers."""

    name: str
    steps: tuple[StepSpec, ...]
    params: Mapping[str, Any] = field(default_factory=dict)
    team: str | None = None
    description: str = ""
    triggers: tuple[Trigger, ...] = ()

    def step(self, name: str) -> StepSpec:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "team": self.team,
            "description": self.description,
            "params": dict(sorted(self.params.items())),
            "steps": [s.to_json() for s in self.steps],
            "triggers": [t.to_json() for t in self.triggers],
        }

    @property
    def digest(self) -> str:
        """sha256 of the canonical JSON: equal pipelines, equal digests."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    @classmethod
    def from_json(cls, data: object, *, yaml_refs: bool = False) -> PipelineSpec:
        """A pipeline from its JSON (or, ``yaml_refs``, its YAML form), validated.

        Raises:
            InvalidParameter: what is wrong, naming the step.
        """
        if not isinstance(data, Mapping):
            raise InvalidParameter("a pipeline must be a mapping with a name and steps")
        unknown = set(data) - {"name", "team", "description", "params", "steps", "triggers"}
        if unknown:
            raise InvalidParameter(f"unknown pipeline keys {sorted(map(str, unknown))[:5]}")
        steps = _list("the pipeline", data.get("steps"))
        if len(steps) > MAX_STEPS:
            raise InvalidParameter(f"a pipeline holds at most {MAX_STEPS} steps")
        params = data.get("params") or {}
        if not isinstance(params, Mapping):
            raise InvalidParameter("params must map names to default values")
        triggers = _list("triggers", data.get("triggers"))
        spec = cls(
            name=check_name("pipeline", data.get("name")),
            team=None if data.get("team") is None else _team("the pipeline", data["team"]),
            description=_text("the pipeline", "description", data.get("description") or None, 4096)
            or "",
            params={
                check_name("parameter", k): check_value(f"parameter {k!r}", v)
                for k, v in params.items()
            },
            steps=tuple(step_from_json(s, yaml_refs=yaml_refs) for s in steps),
            triggers=tuple(
                Trigger.from_json(f"trigger {i + 1}", t) for i, t in enumerate(triggers)
            ),
        )
        return spec.validated()

    def validated(self) -> PipelineSpec:
        """This pipeline with its steps in dependency order, once every rule holds.

        Raises:
            InvalidParameter: no steps, a repeated name, a step with neither or both of a
                function and a command, a reference to an unknown step or parameter, a map
                over an argument the step lacks, or a cycle (named, step by step).
        """
        if not self.steps:
            raise InvalidParameter(f"pipeline {self.name!r} has no steps")
        names = [s.name for s in self.steps]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise InvalidParameter(f"step names must be unique: {', '.join(repeated[:5])}")
        for step in self.steps:
            _check_step(step, set(names), set(self.params))
        return replace(self, steps=tuple(_in_order(self.steps)))


def _check_step(step: StepSpec, steps: set[str], params: set[str]) -> None:
    what = f"step {step.name!r}"
    if (step.function is None) == (step.command is None):
        raise InvalidParameter(f"{what} needs exactly one of function or command")
    for arg, ref in step.args.items():
        if ref.kind == "param" and ref.name not in params:
            raise InvalidParameter(
                f"{what}, argument {arg!r}: the pipeline has no parameter {ref.name!r}"
            )
    for name in step.upstream:
        if name not in steps:
            raise InvalidParameter(f"{what} refers to the unknown step {name!r}")
        if name == step.name:
            raise InvalidParameter(f"{what} depends on itself")
    if step.map is not None and step.map not in step.args:
        raise InvalidParameter(f"{what} maps over {step.map!r}, which is not one of its args")


def _in_order(steps: Iterable[StepSpec]) -> list[StepSpec]:
    """Kahn's order, stable in declaration order; a cycle is named step by step."""
    by_name = {s.name: s for s in steps}
    waiting = {name: set(s.upstream) for name, s in by_name.items()}
    order: list[StepSpec] = []
    while waiting:
        ready = [n for n, deps in waiting.items() if not deps]
        if not ready:
            raise InvalidParameter(f"the steps form a cycle: {' -> '.join(_cycle(waiting))}")
        for name in ready:
            order.append(by_name[name])
            del waiting[name]
        for deps in waiting.values():
            deps.difference_update(ready)
    return order


def _cycle(waiting: Mapping[str, set[str]]) -> list[str]:
    """One cycle among steps that all still wait: walk upstream until a step repeats."""
    path: list[str] = []
    name = min(waiting)
    while name not in path:
        path.append(name)
        name = min(waiting[name])
    return [*path[path.index(name) :], name]
