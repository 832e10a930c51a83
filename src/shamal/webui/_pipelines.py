"""The pipelines pages: the pipelines, a pipeline's runs, and a run drawn as its DAG with
each step's state, job and cache decision, followed while the run goes on.

Each page calls the pipelines service as the API's routes do, with the signed-in
principal: another team's pipeline or run answers 404, as it does through the API.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from fastapi import Path, Query, Request
from markupsafe import Markup
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from shamal.pipelines import PipelineInfo, PipelineRun, PipelineService, PipelineSpec, StepRun
from shamal.security import Principal
from shamal.webui._common import Route, context, service_of
from shamal.webui._jobs_common import TIME_TEXT, full_job_id
from shamal.webui._render import fragment, page
from shamal.webui._session import SessionPrincipal
from shamal.webui._svg import Node, dag

RUNS_PER_PAGE = 100
#: Pipelines whose last run is looked up one by one when the newest runs do not hold one.
MAX_LOOKUPS = 100

PipelineName = Annotated[str, Path(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$", max_length=63)]
RunId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$", min_length=32, max_length=32)]
RunStateName = Annotated[str, Query(pattern=r"^(|running|succeeded|failed|cancelled)$")]

#: A step's state as its box in the DAG shows it (the table keeps the exact state).
_PICTURED = {
    "pending": "waiting",
    "submitting": "waiting",
    "running": "running",
    "succeeded": "succeeded",
    "cached": "cached",
    "failed": "failed",
    "skipped": "skipped",
    "upstream_failed": "skipped",
    "cancelled": "cancelled",
}


def _pipelines(request: Request) -> PipelineService:
    return service_of(request, "pipelines", PipelineService)


def triggers_text(spec: Mapping[str, Any]) -> list[str]:
    """A pipeline's triggers in words: ``on: <event filter>`` or ``cron: <schedule> (zone)``."""
    out = []
    for trigger in spec.get("triggers") or []:
        if trigger.get("on") is not None:
            out.append(f"on: {trigger['on']}")
        else:
            out.append(f"cron: {trigger.get('schedule')} ({trigger.get('timezone', 'UTC')})")
    return out


# ---------------------------------------------------------------------------- the list
async def pipelines_page(request: Request, principal: SessionPrincipal) -> Response:
    """``/ui/pipelines``: the pipelines the principal may see, with their triggers and how
    their last run went."""
    svc = _pipelines(request)

    def read() -> tuple[list[PipelineInfo], dict[str, PipelineRun]]:
        pipelines = svc.list_pipelines(principal)
        last: dict[str, PipelineRun] = {}
        for run in svc.list_runs(principal, limit=1000):
            last.setdefault(run.pipeline, run)
        missing = [p.name for p in pipelines if p.name not in last][:MAX_LOOKUPS]
        for name in missing:
            found = svc.list_runs(principal, pipeline=name, limit=1)
            if found:
                last[name] = found[0]
        return pipelines, last

    pipelines, last = await run_in_threadpool(read)
    values = context(
        request,
        principal,
        "Pipelines",
        pipelines=sorted(pipelines, key=lambda p: p.name),
        last=last,
        triggers=triggers_text,
        **TIME_TEXT,
    )
    return page("pipelines.html", values)


# ---------------------------------------------------------------------------- a pipeline
def _edges(spec: PipelineSpec) -> list[tuple[str, str]]:
    return [(up, step.name) for step in spec.steps for up in step.upstream]


async def pipeline_page(
    request: Request,
    principal: SessionPrincipal,
    name: PipelineName,
    state: RunStateName = "",
) -> Response:
    """``/ui/pipelines/{name}``: its definition drawn as a DAG and its runs, newest first."""
    svc = _pipelines(request)

    def read() -> tuple[PipelineInfo, list[PipelineRun]]:
        info = svc.get(principal, name)
        runs = svc.list_runs(
            principal, pipeline=name, states=[state] if state else (), limit=RUNS_PER_PAGE
        )
        return info, runs

    info, runs = await run_in_threadpool(read)
    spec = PipelineSpec.from_json(info.spec)
    nodes = [Node(s.name, s.name, detail=_step_kind(s.command, s.function)) for s in spec.steps]
    values = context(
        request,
        principal,
        info.name,
        info=info,
        spec=spec,
        runs=runs,
        state=state,
        graph=dag(nodes, _edges(spec), f"Steps of pipeline {info.name}"),
        triggers=triggers_text(info.spec),
        **TIME_TEXT,
    )
    return page("pipeline.html", values)


def _step_kind(command: Sequence[str] | None, function: str | None) -> str:
    return " ".join(command) if command is not None else f"function {function}"


# ---------------------------------------------------------------------------- a run
def _step_node(name: str, record: StepRun | None, items: Sequence[StepRun]) -> Node:
    """The box of step ``name``: its own record's state (a mapped step's items summed up
    in its tooltip), linked to its job when it ran one."""
    if record is None:
        return Node(name, name, "waiting", "", "not started")
    state = _PICTURED.get(record.state, "waiting")
    detail = record.state.replace("_", " ")
    if detail == state:
        detail = record.reason[:80]
    if items:
        done = sum(1 for s in items if s.state in ("succeeded", "cached"))
        detail = f"{detail}, {done} of {len(items)} items done".lstrip(", ")
    job_id = record.job_id
    href = f"/ui/jobs/{job_id}" if job_id and full_job_id(job_id) else ""
    return Node(name, name, state, href, detail)


def _step_nodes(spec: PipelineSpec, steps: Sequence[StepRun]) -> list[Node]:
    """One box per step of the definition."""
    by_key = {s.key: s for s in steps}
    return [
        _step_node(
            step.name,
            by_key.get(step.name),
            [s for s in steps if s.name == step.name and s.index is not None],
        )
        for step in spec.steps
    ]


def cache_text(step: StepRun) -> str:
    """Whether a step's result was reused, and why (not)."""
    if step.state == "cached" or step.cached_from:
        return f"hit: {step.cache_note or 'reused ' + str(step.cached_from)}"
    if step.cache_note:
        return f"miss: {step.cache_note}"
    return ""


async def _run_state(request: Request, principal: Principal, run_id: str) -> dict[str, Any]:
    svc = _pipelines(request)

    def read() -> tuple[PipelineRun, PipelineInfo]:
        run = svc.get_run(principal, run_id)
        return run, svc.get(principal, run.pipeline, run.version)

    run, info = await run_in_threadpool(read)
    spec = PipelineSpec.from_json(info.spec)
    graph: Markup = dag(
        _step_nodes(spec, run.steps), _edges(spec), f"Run {run.id[:12]} of {run.pipeline}"
    )
    return {
        "run": run,
        "graph": graph,
        "steps": run.steps,
        "ended": run.state != "running",
        "cache_text": cache_text,
        "job_link": full_job_id,
    }


async def run_page(request: Request, principal: SessionPrincipal, run_id: RunId) -> Response:
    """``/ui/pipelines/runs/{id}``: the run's DAG (each step in its state, linked to its
    job) and its steps table, followed until the run ends."""
    state = await _run_state(request, principal, run_id)
    run: PipelineRun = state["run"]
    values = context(request, principal, f"{run.pipeline} run", **state, **TIME_TEXT)
    return page("pipeline_run.html", values)


async def run_fragment(request: Request, principal: SessionPrincipal, run_id: RunId) -> Response:
    """The DAG and steps table alone, for ``live.js``: final once the run has ended."""
    state = await _run_state(request, principal, run_id)
    values = context(request, principal, "Pipeline run", **state, **TIME_TEXT)
    return fragment("pipeline_run_state.html", values, final=state["ended"])


ROUTES = [
    Route("/ui/pipelines", pipelines_page),
    Route("/ui/pipelines/runs/{run_id}", run_page),
    Route("/ui/pipelines/runs/{run_id}/fragment", run_fragment),
    Route("/ui/pipelines/{name}", pipeline_page),
]
