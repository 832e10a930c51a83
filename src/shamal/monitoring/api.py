"""Native HTTP API of monitoring: ``/api/v1/monitors`` (monitors, their runs, results and
series) and ``/api/v1/monitor-references`` (reference profiles of model versions).

Every change is an audited POST or DELETE; what a schema cannot state (a deployment or
reference that exists, sketch JSON that parses, columns the reference holds) the services
check and answer 400 or 404.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response, status
from pydantic import BaseModel, ConfigDict, Field

from shamal.api import ERROR_RESPONSES
from shamal.monitoring._entities import ColumnRole, MonitorSpec
from shamal.monitoring._references import MAX_LIST as MAX_REFERENCES
from shamal.monitoring._references import ReferenceService
from shamal.monitoring._rules import (
    CORRECTIONS,
    MAX_COLUMNS,
    MAX_SCHEDULE_S,
    MAX_THRESHOLD,
    MAX_WINDOW,
    MIN_SCHEDULE_S,
    NAME_PATTERN,
    TESTS,
    parse_on_drift,
)
from shamal.monitoring._service import MAX_LIST, MonitorService
from shamal.security import AuditContext
from shamal.security.api import CurrentPrincipal, audited

_DEPLOYMENT = r"^[a-z0-9][a-z0-9-]{0,62}$"
_COLUMN = r"^[^\x00-\x1f\x7f]{1,256}$"
_ON_DRIFT = r"^(none|rollback|retrain:[a-z0-9][a-z0-9_-]{0,62})$"
_MODEL_NAME = 256
TestName = Literal["ks", "chisquare", "z", "wasserstein", "jensenshannon", "psi"]
CorrectionName = Literal["none", "bonferroni", "holm", "bh"]
assert set(get_args(TestName)) == TESTS
assert get_args(CorrectionName) == CORRECTIONS


def get_monitors(request: Request) -> MonitorService:
    service: MonitorService = request.app.state.monitors
    return service


def get_references(request: Request) -> ReferenceService:
    service: ReferenceService = request.app.state.references
    return service


Monitors = Annotated[MonitorService, Depends(get_monitors)]
References = Annotated[ReferenceService, Depends(get_references)]
Name = Annotated[str, Path(pattern=NAME_PATTERN, max_length=63)]
ModelName = Annotated[str, Path(min_length=1, max_length=_MODEL_NAME)]
Version = Annotated[int, Path(ge=1, le=2**31 - 1)]
Column = Annotated[str, Field(pattern=_COLUMN, max_length=256)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReferenceIn(_Model):
    """A model version and the version of its training dataset."""

    model: str = Field(min_length=1, max_length=_MODEL_NAME)
    version: int = Field(ge=1, le=2**31 - 1)


class MonitorIn(_Model):
    """A monitor on a deployment."""

    deployment: str = Field(pattern=_DEPLOYMENT, max_length=63)
    schedule_s: int = Field(ge=MIN_SCHEDULE_S, le=MAX_SCHEDULE_S)
    name: str | None = Field(default=None, pattern=NAME_PATTERN, max_length=63)
    reference: ReferenceIn | None = None
    columns: list[Column] = Field(default_factory=list, max_length=MAX_COLUMNS)
    tests: dict[Column, TestName] = Field(default_factory=dict, max_length=MAX_COLUMNS)
    threshold: float | None = Field(default=None, gt=0, le=MAX_THRESHOLD, allow_inf_nan=False)
    correction: CorrectionName = "none"
    drift_share: float = Field(default=0.5, gt=0, le=1, allow_inf_nan=False)
    window: int = Field(default=1000, ge=1, le=MAX_WINDOW)
    on_drift: str = Field(default="none", pattern=_ON_DRIFT, max_length=72)
    alert_url: str | None = Field(default=None, min_length=1, max_length=2048)
    retrain_params: dict[str, Any] = Field(
        default_factory=dict, max_length=200, description="the retraining run's parameters"
    )

    def spec(self) -> MonitorSpec:
        return MonitorSpec(
            deployment=self.deployment,
            schedule_s=self.schedule_s,
            name=self.name,
            reference=(self.reference.model, self.reference.version) if self.reference else None,
            columns=tuple(self.columns),
            tests=dict(self.tests),
            threshold=self.threshold,
            correction=self.correction,
            drift_share=self.drift_share,
            window=self.window,
            on_drift=parse_on_drift(self.on_drift),
            alert_url=self.alert_url,
            retrain_params=dict(self.retrain_params),
        )


class BuildIn(_Model):
    """Profile a dataset version as the model version's reference."""

    dataset: str = Field(min_length=1, max_length=200, description="NAME, NAME/3 or NAME@alias")
    label: Column | None = None
    columns: list[Column] | None = Field(default=None, max_length=MAX_COLUMNS)


class SketchesIn(_Model):
    """Sketches a client computed (a training job's predictions on the training set)."""

    role: Literal["feature", "prediction", "label"] = "prediction"
    sketches: dict[Column, dict[str, Any]] = Field(min_length=1, max_length=MAX_COLUMNS)


router = APIRouter(prefix="/api/v1", tags=["monitoring"], responses=ERROR_RESPONSES)


# ---------------------------------------------------------------------- references
@router.get(
    "/monitor-references/{model}/versions/{version}",
    summary="The reference profile of a model version",
)
def get_reference(
    references: References, principal: CurrentPrincipal, model: ModelName, version: Version
) -> dict[str, Any]:
    return references.get(principal, model, version).to_json()


@router.get("/monitor-references/{model}", summary="The reference profiles of a model's versions")
def list_references(
    references: References,
    principal: CurrentPrincipal,
    model: ModelName,
    limit: Annotated[int, Query(ge=1, le=MAX_REFERENCES)] = 100,
) -> dict[str, Any]:
    found = references.list_references(principal, model, limit=limit)
    return {"references": [r.to_json() for r in found]}


@router.post(
    "/monitor-references/{model}/versions/{version}/build",
    summary="Profile a dataset version as the model version's reference",
)
def build_reference(
    references: References,
    ctx: Annotated[AuditContext, Depends(audited("monitor.reference.build"))],
    model: ModelName,
    version: Version,
    body: Annotated[BuildIn, Body()],
) -> dict[str, Any]:
    profile = references.build(
        ctx, model, version, body.dataset, label=body.label, columns=body.columns
    )
    return profile.to_json()


@router.post(
    "/monitor-references/{model}/versions/{version}/sketches",
    summary="Add column sketches (e.g. predictions) to the model version's reference",
)
def upload_sketches(
    references: References,
    ctx: Annotated[AuditContext, Depends(audited("monitor.reference.upload"))],
    model: ModelName,
    version: Version,
    body: Annotated[SketchesIn, Body()],
) -> dict[str, Any]:
    profile = references.upload(ctx, model, version, body.sketches, role=ColumnRole(body.role))
    return profile.to_json()


@router.delete(
    "/monitor-references/{model}/versions/{version}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    summary="Delete the reference profile of a model version",
)
def delete_reference(
    references: References,
    ctx: Annotated[AuditContext, Depends(audited("monitor.reference.delete"))],
    model: ModelName,
    version: Version,
) -> Response:
    references.delete(ctx, model, version)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


# ---------------------------------------------------------------------- monitors
@router.post("/monitors", summary="Attach a monitor to a deployment")
def create_monitor(
    monitors: Monitors,
    ctx: Annotated[AuditContext, Depends(audited("monitor.create"))],
    body: Annotated[MonitorIn, Body()],
) -> dict[str, Any]:
    return monitors.create(ctx, body.spec()).to_json()


@router.get("/monitors", summary="Monitors the caller may see, by name")
def list_monitors(
    monitors: Monitors,
    principal: CurrentPrincipal,
    deployment: Annotated[str | None, Query(pattern=_DEPLOYMENT, max_length=63)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = 100,
    after: Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=63)] = None,
) -> dict[str, Any]:
    found = monitors.list_monitors(principal, deployment=deployment, limit=limit, after=after)
    return {"monitors": [m.to_json() for m in found]}


@router.get("/monitors/{name}", summary="A monitor")
def get_monitor(monitors: Monitors, principal: CurrentPrincipal, name: Name) -> dict[str, Any]:
    return monitors.get(principal, name).to_json()


@router.get("/monitors/{name}/results", summary="A monitor's newest results, newest first")
def monitor_results(
    monitors: Monitors,
    principal: CurrentPrincipal,
    name: Name,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = 20,
) -> dict[str, Any]:
    return {"results": [r.to_json() for r in monitors.results(principal, name, limit=limit)]}


@router.get(
    "/monitors/{name}/series",
    summary="Each column's drift over the newest results, oldest first",
)
def monitor_series(
    monitors: Monitors,
    principal: CurrentPrincipal,
    name: Name,
    column: Annotated[str | None, Query(pattern=_COLUMN, max_length=256)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = 50,
) -> dict[str, Any]:
    points = monitors.series(principal, name, column=column, limit=limit)
    return {"points": [p.to_json() for p in points]}


@router.post("/monitors/{name}/run", summary="Run a monitor now")
def run_monitor(
    monitors: Monitors,
    ctx: Annotated[AuditContext, Depends(audited("monitor.run"))],
    name: Name,
) -> dict[str, Any]:
    return monitors.run_now(ctx, name).to_json()


@router.post("/monitors/{name}/pause", summary="Stop a monitor's scheduled runs")
def pause_monitor(
    monitors: Monitors,
    ctx: Annotated[AuditContext, Depends(audited("monitor.pause"))],
    name: Name,
) -> dict[str, Any]:
    return monitors.pause(ctx, name).to_json()


@router.post("/monitors/{name}/resume", summary="Run a monitor on schedule again")
def resume_monitor(
    monitors: Monitors,
    ctx: Annotated[AuditContext, Depends(audited("monitor.resume"))],
    name: Name,
) -> dict[str, Any]:
    return monitors.resume(ctx, name).to_json()


@router.delete(
    "/monitors/{name}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    summary="Delete a monitor, its results and its alert webhook (maintainer)",
)
def delete_monitor(
    monitors: Monitors,
    ctx: Annotated[AuditContext, Depends(audited("monitor.delete"))],
    name: Name,
) -> Response:
    monitors.delete(ctx, name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
