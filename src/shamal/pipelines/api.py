"""Native HTTP API of pipelines: ``/api/v1/pipelines`` (definitions, starting runs) and
``/api/v1/pipeline-runs`` (runs, their steps, logs, cancel, retry).

A step's job hands its output back through ``POST /api/v1/pipeline-runs/{id}/steps/{key}/output``
with its own token: a data-plane write into a step whose start was audited.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from shamal.api import ERROR_RESPONSES
from shamal.pipelines._definitions import MAX_VALUE_BYTES, PipelineSpec
from shamal.pipelines._service import MAX_LIST, PipelineService
from shamal.security import AuditContext, Principal
from shamal.security.api import CurrentPrincipal, audited, data_plane_write

_NAME = r"^[a-z0-9][a-z0-9_-]{0,62}$"
_RUN = r"^[0-9a-f]{32}$"
_KEY = r"^[a-z0-9][a-z0-9_-]{0,62}(\[[0-9]{1,6}\])?$"


def get_pipelines(request: Request) -> PipelineService:
    service: PipelineService = request.app.state.pipelines
    return service


Pipelines = Annotated[PipelineService, Depends(get_pipelines)]
Name = Annotated[str, Path(pattern=_NAME, max_length=63)]
RunId = Annotated[str, Path(pattern=_RUN, min_length=32, max_length=32)]
StepKey = Annotated[str, Path(pattern=_KEY, max_length=72)]
DataPlane = Annotated[Principal, Depends(data_plane_write)]
RunStateName = Literal["running", "succeeded", "failed", "cancelled"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RegisterIn(_Model):
    spec: dict[str, Any] = Field(description="the pipeline's definition (its JSON form)")
    snapshot: str | None = Field(
        default=None, pattern=r"^[0-9a-f]{64}$", description="the code snapshot its steps run"
    )


class RunIn(_Model):
    params: dict[str, Any] = Field(default_factory=dict, max_length=200)


class RetryIn(_Model):
    from_step: str | None = Field(default=None, pattern=_NAME, max_length=63)


class OutputIn(_Model):
    job_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    output: str = Field(max_length=MAX_VALUE_BYTES * 2, description="the output as JSON text")


router = APIRouter(prefix="/api/v1", tags=["pipelines"], responses=ERROR_RESPONSES)


@router.post("/pipelines", summary="Register a pipeline (its next version)")
def register(
    pipelines: Pipelines,
    ctx: Annotated[AuditContext, Depends(audited("pipeline.register"))],
    body: Annotated[RegisterIn, Body()],
) -> dict[str, Any]:
    info, created = pipelines.register(ctx, PipelineSpec.from_json(body.spec), body.snapshot)
    return {"pipeline": info.to_json(), "created": created}


@router.get("/pipelines", summary="Pipelines the caller may see")
def list_pipelines(pipelines: Pipelines, principal: CurrentPrincipal) -> dict[str, Any]:
    return {"pipelines": [p.to_json() for p in pipelines.list_pipelines(principal)]}


@router.get("/pipelines/{name}", summary="A pipeline (its newest version, or ?version=N)")
def get_pipeline(
    pipelines: Pipelines,
    principal: CurrentPrincipal,
    name: Name,
    version: Annotated[int | None, Query(ge=1, le=1_000_000)] = None,
) -> dict[str, Any]:
    return pipelines.get(principal, name, version).to_json()


@router.post("/pipelines/{name}/runs", summary="Start a run")
def start_run(
    pipelines: Pipelines,
    ctx: Annotated[AuditContext, Depends(audited("pipeline.run"))],
    name: Name,
    body: Annotated[RunIn, Body()],
) -> dict[str, Any]:
    run = pipelines.start(ctx, name, body.params)
    assert run is not None  # only a trigger key can make start() return None
    return run.to_json()


@router.get("/pipeline-runs", summary="Runs, newest first")
def list_runs(
    pipelines: Pipelines,
    principal: CurrentPrincipal,
    pipeline: Annotated[str | None, Query(pattern=_NAME, max_length=63)] = None,
    state: Annotated[list[RunStateName] | None, Query(max_length=4)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = 100,
) -> dict[str, Any]:
    runs = pipelines.list_runs(principal, pipeline=pipeline, states=state or (), limit=limit)
    return {"runs": [r.to_json() for r in runs]}


@router.get("/pipeline-runs/{run_id}", summary="A run and its steps")
def get_run(pipelines: Pipelines, principal: CurrentPrincipal, run_id: RunId) -> dict[str, Any]:
    return pipelines.get_run(principal, run_id).to_json()


@router.post("/pipeline-runs/{run_id}/cancel", summary="Cancel a run")
def cancel_run(
    pipelines: Pipelines,
    ctx: Annotated[AuditContext, Depends(audited("pipeline.cancel"))],
    run_id: RunId,
) -> dict[str, Any]:
    return pipelines.cancel(ctx, run_id).to_json()


@router.post("/pipeline-runs/{run_id}/retry", summary="Run again from a step")
def retry_run(
    pipelines: Pipelines,
    ctx: Annotated[AuditContext, Depends(audited("pipeline.retry"))],
    run_id: RunId,
    body: Annotated[RetryIn, Body()],
) -> dict[str, Any]:
    return pipelines.retry(ctx, run_id, body.from_step).to_json()


@router.get("/pipeline-runs/{run_id}/steps/{key}/logs", summary="A step's job log")
def step_logs(
    pipelines: Pipelines,
    principal: CurrentPrincipal,
    run_id: RunId,
    key: StepKey,
    offset: Annotated[int, Query(ge=0, le=1 << 50)] = 0,
) -> dict[str, Any]:
    chunk = pipelines.logs(principal, run_id, key, offset)
    return {
        "text": chunk.data.decode(errors="replace"),
        "offset": chunk.offset,
        "next_offset": chunk.next_offset,
        "attempt": chunk.attempt,
        "complete": chunk.complete,
    }


@router.post("/pipeline-runs/{run_id}/steps/{key}/output", summary="A step hands back its output")
def step_output(
    pipelines: Pipelines,
    principal: DataPlane,
    run_id: RunId,
    key: StepKey,
    body: Annotated[OutputIn, Body()],
) -> dict[str, str]:
    pipelines.record_output(principal, run_id, key, body.job_id, body.output)
    return {"status": "recorded"}
