"""Pipelines in Python: ``@step`` and ``@pipeline``.

A ``@pipeline`` function is never run for real: Shamal calls it once with stand-ins for its
parameters (tracing), and each call of a ``@step`` inside it adds a step to the DAG and
returns a stand-in for that step's output. Outside a pipeline a step is its plain
function, so it can be tested as one::

    from shamal.pipelines import dataset, pipeline, step

    @step(cpus=0.5, memory_mib=512)
    def validate(data: str, min_rows: int) -> dict:
        ...

    @step(retries=1)
    def train(data: str) -> dict:
        ...

    @pipeline(on="dataset_version_created where dataset = 'wine'")
    def retrain(min_rows: int = 100) -> None:
        checked = validate(dataset("wine"), min_rows)
        model = train(checked["data"])
        register.options(when="steps.train.output.f1 >= 0.8")(model)

``noop.map(items)`` fans ``noop`` out over the list ``items`` (its first parameter), one job
per element. Steps, their file and their function name must be importable from the
pipeline's folder: the code snapshot the server runs them from.
"""

from __future__ import annotations

import contextvars
import hashlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

from shamal.errors import InvalidParameter
from shamal.pipelines._definitions import (
    PipelineSpec,
    Ref,
    StepSpec,
    Trigger,
    check_name,
    check_value,
)

__all__ = [
    "DatasetInput",
    "Output",
    "Param",
    "Pipeline",
    "Step",
    "dataset",
    "load_pipeline",
    "pipeline",
    "step",
]

R = TypeVar("R")
MAX_YAML_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Output:
    """A stand-in for a step's output inside a pipeline; ``output["key"]`` or
    ``output[0]`` picks a part of it."""

    step: str
    path: tuple[str | int, ...] = ()

    def __getitem__(self, key: str | int) -> Output:
        return Output(self.step, (*self.path, key))


@dataclass(frozen=True, slots=True)
class Param:
    """A stand-in for a pipeline parameter."""

    name: str


@dataclass(frozen=True, slots=True)
class DatasetInput:
    """A dataset version a step reads (``wine``: the latest; ``wine@prod``; ``wine/3``)."""

    ref: str


def dataset(ref: str) -> DatasetInput:
    """A dataset version as a step's argument; the step gets ``NAME/NUMBER``, the version it
    was resolved to when it started (which is what its cache key holds)."""
    return DatasetInput(ref)


@dataclass
class _Trace:
    root: Path
    steps: list[StepSpec] = field(default_factory=list)

    def unique(self, name: str) -> str:
        taken = {s.name for s in self.steps}
        if name not in taken:
            return name
        n = 2
        while f"{name}-{n}" in taken:
            n += 1
        return f"{name}-{n}"


_TRACE: contextvars.ContextVar[_Trace | None] = contextvars.ContextVar("_TRACE", default=None)


def _ref(what: str, value: object) -> Ref:
    if isinstance(value, Output):
        return Ref("step", name=value.step, path=value.path)
    if isinstance(value, Param):
        return Ref("param", name=value.name)
    if isinstance(value, DatasetInput):
        return Ref.from_json(what, {"dataset": value.ref})
    if isinstance(value, Step):
        raise InvalidParameter(f"{what} is the step {value.name!r} itself: call it")
    if _holds_stand_in(value):
        raise InvalidParameter(
            f"{what} puts a step's output inside a list or dict; pass outputs as arguments "
            "of their own (a mapped step's output is already the list of its items' outputs)"
        )
    return Ref("value", value=check_value(what, value))


def _holds_stand_in(value: object) -> bool:
    if isinstance(value, Output | Param | DatasetInput):
        return True
    if isinstance(value, Mapping):
        return any(_holds_stand_in(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_holds_stand_in(v) for v in value)
    return False


class Step(Generic[R]):
    """A function that a pipeline runs as a job of its own."""

    def __init__(self, fn: Callable[..., R], **options: Any) -> None:
        if "<locals>" in fn.__qualname__:
            raise InvalidParameter(
                f"@step {fn.__qualname__}: steps must be defined at module level, where the "
                "job that runs them can import them"
            )
        self.fn = fn
        self.name = check_name("step", options.pop("name", None) or fn.__name__.replace("_", "-"))
        self._options = options
        StepSpec(name=self.name, function="x.py:x", **options)  # unknown options fail here
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def options(self, **overrides: Any) -> Step[R]:
        """The same step with other settings (``name``, ``cpus``, ``memory_mib``, ``gpus``,
        ``time_limit_s``, ``retries``, ``team``, ``pool``, ``cache``, ``env``, ``when``,
        ``after``, ``executor``: ``"local"`` or ``"ray"``)."""
        name = overrides.pop("name", self.name)
        return Step(self.fn, name=name, **{**self._options, **overrides})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        trace = _TRACE.get()
        if trace is None:
            return self.fn(*args, **kwargs)
        return self._add(trace, args, kwargs, mapped=False)

    def map(self, *args: Any, **kwargs: Any) -> Output:
        """Inside a pipeline: one job per element of the first argument's list."""
        trace = _TRACE.get()
        if trace is None:
            raise InvalidParameter(f"{self.name}.map(...) is only for use inside a @pipeline")
        return self._add(trace, args, kwargs, mapped=True)

    def _add(
        self, trace: _Trace, args: tuple[Any, ...], kwargs: dict[str, Any], *, mapped: bool
    ) -> Output:
        name = trace.unique(self.name)
        try:
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
        except TypeError as exc:
            raise InvalidParameter(f"step {name!r}: {exc}") from None
        refs = {k: _ref(f"step {name!r}, argument {k!r}", v) for k, v in bound.arguments.items()}
        first = next(iter(inspect.signature(self.fn).parameters), None)
        if mapped and (first is None or first not in refs):
            raise InvalidParameter(f"step {name!r}: .map(...) needs its first argument")
        after = tuple(
            a.name if isinstance(a, Step) else a.step if isinstance(a, Output) else str(a)
            for a in self._options.get("after", ())
        )
        options = {k: v for k, v in self._options.items() if k != "after"}
        trace.steps.append(
            StepSpec(
                name=name,
                function=_function_ref(self.fn, trace.root),
                args=refs,
                map=first if mapped else None,
                after=after,
                **options,
            )
        )
        return Output(name)

    def __repr__(self) -> str:
        return f"<step {self.name}>"


def _function_ref(fn: Callable[..., Any], root: Path) -> str:
    source = inspect.getsourcefile(fn)
    if source is None:
        raise InvalidParameter(f"step {fn.__qualname__}: its source file is unknown")
    try:
        relative = Path(source).resolve().relative_to(root.resolve())
    except ValueError:
        raise InvalidParameter(
            f"step {fn.__qualname__} is defined in {source}, outside the pipeline's folder "
            f"{root}: the job runs only what that folder holds"
        ) from None
    return f"{relative.as_posix()}:{fn.__qualname__}"


@overload
def step(fn: Callable[..., R]) -> Step[R]: ...
@overload
def step(**options: Any) -> Callable[[Callable[..., R]], Step[R]]: ...
def step(fn: Callable[..., R] | None = None, **options: Any) -> Any:
    """Make a function a pipeline step; options as :meth:`Step.options`."""
    if fn is not None:
        return Step(fn, **options)
    return lambda f: Step(f, **options)


class Pipeline:
    """A traced DAG of steps, with its parameters (the function's, with their defaults)
    and its triggers."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        team: str | None = None,
        description: str | None = None,
        triggers: tuple[Trigger, ...] = (),
    ) -> None:
        self.fn = fn
        self.name = check_name("pipeline", name or fn.__name__.replace("_", "-"))
        self.team = team
        self.description = description or inspect.getdoc(fn) or ""
        self.triggers = triggers

    def spec(self, root: Path | None = None) -> PipelineSpec:
        """Trace the pipeline into its definition; ``root`` is its code folder (default:
        the folder of the file that defines it)."""
        source = inspect.getsourcefile(self.fn)
        folder = root or (Path(source).parent if source else Path.cwd())
        params: dict[str, Any] = {}
        stand_ins: dict[str, Param] = {}
        for p in inspect.signature(self.fn).parameters.values():
            check_name("parameter", p.name)
            params[p.name] = (
                None
                if p.default is inspect.Parameter.empty
                else check_value(f"parameter {p.name!r}", p.default)
            )
            stand_ins[p.name] = Param(p.name)
        with _tracing(folder) as trace:
            self.fn(**stand_ins)
        spec = PipelineSpec(
            name=self.name,
            team=self.team,
            description=self.description[:4096],
            params=params,
            steps=tuple(trace.steps),
            triggers=self.triggers,
        )
        return spec.validated()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise InvalidParameter(
            f"pipeline {self.name!r} runs on the server: `shamal pipeline run FILE.py:"
            f"{self.fn.__name__}`, or shamal.Client().pipelines.run(...)"
        )


@contextmanager
def _tracing(root: Path) -> Iterator[_Trace]:
    if _TRACE.get() is not None:
        raise InvalidParameter("a pipeline cannot be traced inside another one")
    trace = _Trace(root)
    token = _TRACE.set(trace)
    try:
        yield trace
    finally:
        _TRACE.reset(token)


def pipeline(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    team: str | None = None,
    description: str | None = None,
    on: str | list[str] | None = None,
    schedule: str | None = None,
    timezone: str = "UTC",
    catch_up: str = "latest",
) -> Any:
    """Make a function a pipeline. ``on``: event filters that start a run (see
    :class:`shamal.events.EventKind`); ``schedule``: a cron expression in ``timezone``,
    ``catch_up`` deciding what a server that was down fires (all, latest, none)."""
    triggers: list[Trigger] = []
    for filter_text in [on] if isinstance(on, str) else (on or []):
        triggers.append(Trigger.from_json("trigger", {"on": filter_text}))
    if schedule is not None:
        triggers.append(
            Trigger.from_json(
                "trigger", {"schedule": schedule, "timezone": timezone, "catch_up": catch_up}
            )
        )

    def wrap(f: Callable[..., Any]) -> Pipeline:
        return Pipeline(f, name=name, team=team, description=description, triggers=tuple(triggers))

    return wrap(fn) if fn is not None else wrap


def import_file(path: Path, root: Path) -> Any:
    """Run the Python file ``path`` as a module named after its place under ``root`` (the
    pipeline's folder, put first on ``sys.path`` so its own imports work)."""
    relative = path.resolve().relative_to(root.resolve())
    # Named after the file's place, so two pipelines' flow.py are two modules.
    where = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    module_name = f"_shamal_pipeline_{where}_" + "_".join(relative.with_suffix("").parts)
    if module_name in sys.modules:
        return sys.modules[module_name]
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    found = importlib.util.spec_from_file_location(module_name, path)
    if found is None or found.loader is None:
        raise InvalidParameter(f"{path} cannot be imported as Python")
    module = importlib.util.module_from_spec(found)
    sys.modules[module_name] = module
    found.loader.exec_module(module)
    return module


def load_pipeline(target: str) -> tuple[PipelineSpec, Path]:
    """The pipeline ``FILE.py:NAME`` (traced) or ``FILE.yaml`` (read), and its folder.

    Raises:
        InvalidParameter: no such file or pipeline, or an invalid one (what is wrong).
    """
    file_part, _, attr = target.partition(":")
    path = Path(file_part)
    if not path.is_file():
        raise InvalidParameter(f"{file_part}: no such file")
    root = path.resolve().parent
    if path.suffix in (".yaml", ".yml"):
        import yaml  # type: ignore[import-untyped,unused-ignore]

        if path.stat().st_size > MAX_YAML_BYTES:
            raise InvalidParameter(f"{file_part} is over {MAX_YAML_BYTES >> 20} MiB")
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise InvalidParameter(f"{file_part} is not valid YAML: {exc}"[:400]) from None
        return PipelineSpec.from_json(data, yaml_refs=True), root
    module = import_file(path.resolve(), root)
    found = _pick_pipeline(module, attr, file_part)
    return found.spec(root), root


def _pick_pipeline(module: Any, attr: str, file_part: str) -> Pipeline:
    if attr:
        found = getattr(module, attr, None)
        if not isinstance(found, Pipeline):
            raise InvalidParameter(f"{file_part} has no @pipeline named {attr!r}")
        return found
    pipelines = [v for v in vars(module).values() if isinstance(v, Pipeline)]
    if len(pipelines) != 1:
        names = ", ".join(sorted(p.fn.__name__ for p in pipelines)) or "none"
        raise InvalidParameter(
            f"{file_part} defines {len(pipelines)} pipelines ({names}): say which, FILE.py:NAME"
        )
    return pipelines[0]
