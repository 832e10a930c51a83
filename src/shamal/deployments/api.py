"""Native HTTP API of deployments under ``/api/v1/deployments`` (the CLI, the SDK, serve processes).

Every field a body may carry is stated in its schema (unknown keys are refused); what a schema
cannot state (a URI naming a version that exists, one model per deployment) the service checks.
Reports and samples come from serve processes at a steady rate: they are authenticated data-plane
writes, not one audit entry each; the changes the rollout controller makes from them are audited.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response, status
from pydantic import BaseModel, ConfigDict, Field

from shamal.api import (
    ERROR_RESPONSES,
    ListPage,
    PageBytes,
    PageToken,
    bounded_list,
    decode_cursor,
    encode_cursor,
    keyset_page,
    model_json,
)
from shamal.deployments import _rules
from shamal.deployments._entities import (
    DEFAULT_INTERVAL_S,
    DEFAULT_SAMPLE_RATE,
    DEFAULT_STEPS,
    DEFAULT_STICKY_HEADER,
    Deployment,
    DeploymentEvent,
    DeploymentSpec,
    Label,
    LoadStatus,
    RolloutPlan,
    RouteRole,
    Sample,
    SampledRequest,
    Slo,
    VersionReport,
    VersionStats,
    WeightedUri,
)
from shamal.deployments._service import (
    DEFAULT_KEEP_SAMPLES,
    MAX_EVENTS,
    MAX_LIST,
    DeploymentService,
)
from shamal.security import NAME_PATTERN, AuditContext, Principal
from shamal.security.api import (
    CurrentPrincipal,
    IssuedTokenOut,
    TokenOut,
    audited,
    data_plane_write,
)

logger = logging.getLogger(__name__)


def get_deployments(request: Request) -> DeploymentService:
    service: DeploymentService = request.app.state.deployments
    return service


Deployments = Annotated[DeploymentService, Depends(get_deployments)]
Name = Annotated[str, Path(pattern=_rules.NAME_PATTERN, max_length=64)]
DataPlane = Annotated[Principal, Depends(data_plane_write)]
ModelUriText = Annotated[
    str,
    Field(
        pattern=_rules.MODEL_URI_PATTERN,
        max_length=600,
        examples=["models:/fraud@champion", "models:/fraud/3"],
    ),
]
VersionText = Annotated[str, Field(pattern=r"^[1-9][0-9]{0,8}$")]
_MAX_COUNT = 1_000_000_000
_NO_NUL = r"^[^\x00]*$"
#: Characters of a serve process's reason for a failed load that are kept.
MAX_LOAD_REASON = 300


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WeightedIn(_Model):
    """A primary version and its weight relative to the other primaries."""

    model: ModelUriText
    weight: int = Field(default=100, ge=1, le=_rules.MAX_WEIGHT)

    def weighted(self) -> WeightedUri:
        return WeightedUri(self.model, self.weight)


class CanaryIn(_Model):
    """A canary and the percentage of traffic it starts with."""

    model: ModelUriText
    percent: int = Field(ge=1, le=100)


class ShadowIn(_Model):
    """A shadow and the percentage of requests mirrored to it."""

    model: ModelUriText
    percent: int = Field(default=100, ge=1, le=100)


class PlanIn(_Model):
    """Canary percentages to pass through (taken in increasing order) and the healthy time
    needed at each before the next."""

    steps: list[Annotated[int, Field(ge=1, le=100)]] = Field(
        default=list(DEFAULT_STEPS), min_length=1, max_length=_rules.MAX_STEPS
    )
    interval_s: float = Field(
        default=DEFAULT_INTERVAL_S, gt=0, le=_rules.MAX_INTERVAL_S, allow_inf_nan=False
    )

    def plan(self) -> RolloutPlan:
        return RolloutPlan(tuple(self.steps), self.interval_s)


class SloIn(_Model):
    """What a canary must keep once it has ``min_requests`` requests in a window."""

    max_error_rate: float = Field(default=0.01, ge=0, le=1, allow_inf_nan=False)
    max_p99_ms: float = Field(default=1000.0, gt=0, le=_rules.MAX_P99_MS, allow_inf_nan=False)
    min_requests: int = Field(default=100, ge=1, le=_rules.MAX_MIN_REQUESTS)

    def slo(self) -> Slo:
        return Slo(self.max_error_rate, self.max_p99_ms, self.min_requests)


class DeployIn(_Model):
    """A deployment's whole spec; deploying again replaces it and restarts any rollout."""

    primary: list[WeightedIn] = Field(min_length=1, max_length=_rules.MAX_PRIMARIES)
    canary: CanaryIn | None = None
    shadows: list[ShadowIn] = Field(default=[], max_length=_rules.MAX_SHADOWS)
    rollout: PlanIn = Field(default_factory=PlanIn)
    slo: SloIn = Field(default_factory=SloIn)
    sticky_header: str = Field(default=DEFAULT_STICKY_HEADER, pattern=_rules.HEADER_PATTERN)
    sample_rate: float = Field(default=DEFAULT_SAMPLE_RATE, ge=0, le=1, allow_inf_nan=False)
    team: str | None = Field(default=None, pattern=_rules.NAME_PATTERN, max_length=64)
    feature_service: str | None = Field(
        default=None,
        pattern=r"^[a-z][a-z0-9_]{0,62}$",
        description="a feature service whose online features each request's entities get",
    )

    def spec(self) -> DeploymentSpec:
        return DeploymentSpec(
            primaries=tuple(w.weighted() for w in self.primary),
            canary=WeightedUri(self.canary.model, self.canary.percent) if self.canary else None,
            shadows=tuple(WeightedUri(s.model, s.percent) for s in self.shadows),
            plan=self.rollout.plan(),
            slo=self.slo.slo(),
            sticky_header=self.sticky_header,
            sample_rate=self.sample_rate,
            team=self.team,
            feature_service=self.feature_service,
        )


class CanaryChangeIn(CanaryIn):
    """Start a canary (replacing any); ``rollout`` replaces the plan; ``revision``: only if the
    deployment is still at that revision."""

    rollout: PlanIn | None = None
    revision: int | None = Field(default=None, ge=1, le=2**31 - 1)


class ShadowsIn(_Model):
    shadows: list[ShadowIn] = Field(max_length=_rules.MAX_SHADOWS)


class WeightsIn(_Model):
    primary: list[WeightedIn] = Field(min_length=1, max_length=_rules.MAX_PRIMARIES)


class RevisionIn(_Model):
    """Apply only if the deployment is still at ``revision`` (409 otherwise)."""

    revision: int | None = Field(default=None, ge=1, le=2**31 - 1)


class RollbackIn(RevisionIn):
    reason: str = Field(default="", max_length=500, pattern=_NO_NUL)


class RouteOut(_Model):
    model: str
    version: int
    role: str = Field(examples=["primary", "canary", "shadow"])
    weight: int
    share: float = Field(description="Answered traffic (primary, canary) or mirrored (shadow).")
    uri: str


class StateOut(_Model):
    phase: str = Field(examples=["stable", "progressing", "rolled_back", "promoted"])
    canary_weight: int
    step_index: int
    since: datetime


class DeploymentOut(_Model):
    """A deployment: its routes with their traffic shares, SLO, rollout plan and state."""

    name: str
    team: str
    revision: int
    routes: list[RouteOut]
    slo: SloIn
    rollout: PlanIn
    state: StateOut
    sticky_header: str
    sample_rate: float
    feature_service: str | None = None
    created_by: str
    created_at: datetime | None
    updated_at: datetime | None

    @classmethod
    def of(cls, d: Deployment) -> DeploymentOut:
        shares = d.split.shares()
        return cls(
            name=d.name,
            team=d.team,
            revision=d.revision,
            routes=[
                RouteOut(
                    model=r.model_name,
                    version=r.version,
                    role=r.role.value,
                    weight=r.weight,
                    share=r.weight / 100 if r.role is RouteRole.SHADOW else shares[r.version],
                    uri=r.uri,
                )
                for r in d.split.routes
            ],
            slo=SloIn(
                max_error_rate=d.slo.max_error_rate,
                max_p99_ms=d.slo.max_p99_ms,
                min_requests=d.slo.min_requests,
            ),
            rollout=PlanIn(steps=list(d.plan.steps), interval_s=d.plan.interval_s),
            state=StateOut(
                phase=d.state.phase.value,
                canary_weight=d.state.canary_weight,
                step_index=d.state.step_index,
                since=d.state.since,
            ),
            sticky_header=d.sticky_header,
            sample_rate=d.sample_rate,
            feature_service=d.feature_service,
            created_by=d.created_by,
            created_at=d.created_at,
            updated_at=d.updated_at,
        )


class EventOut(_Model):
    id: int
    at: datetime
    revision: int
    kind: str = Field(examples=["create", "canary", "step", "promote", "rollback"])
    actor: str
    reason: str
    detail: dict[str, Any]

    @classmethod
    def of(cls, e: DeploymentEvent) -> EventOut:
        return cls(
            id=e.id,
            at=e.at,
            revision=e.revision,
            kind=e.kind,
            actor=e.actor,
            reason=e.reason,
            detail=dict(e.detail),
        )


class StatsIn(_Model):
    """One version's calls since the previous report: successes, failures and a latency
    histogram over ``LATENCY_BOUNDS_MS`` (shorter lists are padded with zeros)."""

    version: VersionText
    ok: int = Field(ge=0, le=_MAX_COUNT)
    errors: int = Field(ge=0, le=_MAX_COUNT)
    latency_counts: list[Annotated[int, Field(ge=0, le=_MAX_COUNT)]] = Field(
        default=[], max_length=_rules.LATENCY_SLOTS
    )

    def report(self) -> VersionReport:
        stats = VersionStats(self.ok + self.errors, self.errors, tuple(self.latency_counts))
        return VersionReport(self.version, stats)


class LoadFailureIn(_Model):
    """A version the serve process could not load, and why (the serve process's own words)."""

    version: VersionText
    reason: str = Field(max_length=MAX_LOAD_REASON, pattern=_NO_NUL)


class ReportIn(_Model):
    """A serve process's statistics, gathered under the deployment's ``revision``, and the
    versions of that revision it is still loading or could not load (a canary that failed to
    load is rolled back; one still loading is not judged)."""

    revision: int = Field(ge=1, le=2**31 - 1)
    versions: list[StatsIn] = Field(max_length=64)
    loading: list[VersionText] = Field(default=[], max_length=64)
    failed: list[LoadFailureIn] = Field(default=[], max_length=64)

    def loads(self) -> LoadStatus:
        failed = {f.version: f.reason.strip() or "no reason given" for f in self.failed}
        return LoadStatus(frozenset(self.loading), failed)


class ReportOut(_Model):
    revision: int = Field(description="The deployment's revision after the report.")
    action: str = Field(examples=["hold", "step", "promote", "rollback"])
    reason: str


class StatsOut(_Model):
    version: str
    requests: int
    errors: int
    error_rate: float
    p99_ms: float | None = Field(description="None: no requests, or slower than 2 minutes.")

    @classmethod
    def of(cls, version: str, stats: VersionStats) -> StatsOut:
        p99 = _rules.p99_ms(stats.latency_counts)
        return cls(
            version=version,
            requests=stats.requests,
            errors=stats.errors,
            error_rate=stats.error_rate,
            p99_ms=p99 if stats.requests and math.isfinite(p99) else None,
        )


Scalar = Annotated[float, Field(allow_inf_nan=False)] | int | bool | None
DataItem = Scalar | Annotated[str, Field(max_length=256)]


class TensorIn(_Model):
    """A small excerpt of one tensor: its shape, dtype and the first values (flattened)."""

    shape: list[Annotated[int, Field(ge=0, le=2**40)]] = Field(max_length=16)
    datatype: str = Field(max_length=32, pattern=r"^[A-Za-z0-9<>|=_]*$")
    rows: int | None = Field(
        default=None, ge=0, le=256, description="Whole rows (first axis) held in data."
    )
    data: list[DataItem] = Field(max_length=256)


#: The caller's id of a served request (OIP's request ``id``), as labels name it.
RequestId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[\x21-\x7e]+$")]
LabelValue = Scalar | Annotated[str, Field(max_length=_rules.MAX_LABEL_TEXT)]


class LabelIn(_Model):
    request_id: RequestId
    label: LabelValue | list[LabelValue] = Field(
        description="The true outcome: a value, or a list with one value per row of a "
        "batched request."
    )


class LabelsIn(_Model):
    labels: list[LabelIn] = Field(min_length=1, max_length=_rules.MAX_LABELS)


class LabelsOut(_Model):
    stored: int
    unmatched: list[str] = Field(
        description="Request ids no kept sample has (yet): only a sampled share of requests "
        "is kept, and serve processes ship samples every few seconds. Their labels are "
        "stored and joined if the sample arrives."
    )


#: Tensor name -> excerpt. Names are kept to their first 128 characters.
TensorMap = dict[str, TensorIn]


class SampleIn(_Model):
    revision: int = Field(ge=1, le=2**31 - 1)
    version: VersionText
    shadow: bool = False
    request_id: RequestId | None = None
    inputs: TensorMap = Field(max_length=32)
    outputs: TensorMap = Field(max_length=32)


class SamplesIn(_Model):
    samples: list[SampleIn] = Field(max_length=100)


class SamplesOut(_Model):
    accepted: int = Field(description="Samples kept; larger ones are dropped.")


class SampleOut(_Model):
    id: int
    at: datetime
    revision: int
    version: str
    shadow: bool
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    request_id: str | None = None
    label: Any = None
    labelled_at: datetime | None = None

    @classmethod
    def of(cls, s: Sample) -> SampleOut:
        return cls(
            id=s.id,
            at=s.at,
            revision=s.revision,
            version=s.version,
            shadow=s.shadow,
            inputs=dict(s.inputs),
            outputs=dict(s.outputs),
            request_id=s.request_id,
            label=s.label,
            labelled_at=s.labelled_at,
        )


router = APIRouter(prefix="/api/v1/deployments", tags=["deployments"], responses=ERROR_RESPONSES)


def _deployment_cursor(deployment: DeploymentOut) -> str:
    return encode_cursor(deployment.name)


@router.get(
    "",
    summary="Deployments you can see, by name (a page stops early past max_page_bytes)",
    response_model=list[DeploymentOut],
)
def list_deployments(
    svc: Deployments,
    principal: CurrentPrincipal,
    page_bytes: PageBytes,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = 100,
    page_token: PageToken = None,
) -> Response:
    def fetch(count: int, token: str | None) -> ListPage[DeploymentOut]:
        after = decode_cursor(token, str)
        found = svc.list_deployments(
            principal, limit=count, after=None if after is None else after[0]
        )
        return keyset_page([DeploymentOut.of(d) for d in found], count, _deployment_cursor)

    return bounded_list(
        fetch,
        model_json,
        max_results=limit,
        page_token=page_token,
        max_bytes=page_bytes,
        cursor_of=_deployment_cursor,
    )


@router.put("/{name}", summary="Deploy: create the deployment or replace its spec")
def deploy(
    name: Name,
    body: DeployIn,
    svc: Deployments,
    ctx: Annotated[AuditContext, Depends(audited("deployment.deploy"))],
) -> DeploymentOut:
    return DeploymentOut.of(svc.deploy(ctx, name, body.spec()))


@router.get("/{name}", summary="One deployment")
def get_deployment(name: Name, svc: Deployments, principal: CurrentPrincipal) -> DeploymentOut:
    return DeploymentOut.of(svc.get(principal, name))


class DeploymentTokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, max_length=64, description="A label for the token")
    expires_in_s: int | None = Field(default=None, ge=1, le=366 * 86400)


@router.post(
    "/{name}/tokens",
    status_code=status.HTTP_201_CREATED,
    summary="A token that may call this deployment's models and nothing else (shown once)",
)
def create_deployment_token(
    name: Name,
    body: DeploymentTokenIn,
    svc: Deployments,
    ctx: Annotated[AuditContext, Depends(audited("token.create"))],
) -> IssuedTokenOut:
    expires = None if body.expires_in_s is None else timedelta(seconds=body.expires_in_s)
    issued = svc.issue_token(ctx, name, body.name, expires)
    return IssuedTokenOut(**TokenOut.of(issued.token).model_dump(), secret=issued.secret)


@router.delete(
    "/{name}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    summary="Delete a deployment (maintainer)",
)
def delete_deployment(
    name: Name,
    svc: Deployments,
    ctx: Annotated[AuditContext, Depends(audited("deployment.delete"))],
) -> Response:
    svc.delete(ctx, name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.put("/{name}/canary", summary="Start a canary rollout (replacing any canary)")
def set_canary(
    name: Name,
    body: CanaryChangeIn,
    svc: Deployments,
    ctx: Annotated[AuditContext, Depends(audited("deployment.canary"))],
) -> DeploymentOut:
    plan = body.rollout.plan() if body.rollout else None
    changed = svc.set_canary(
        ctx, name, WeightedUri(body.model, body.percent), plan, expected_revision=body.revision
    )
    return DeploymentOut.of(changed)


@router.put("/{name}/shadows", summary="Replace the shadows (an empty list removes them)")
def set_shadows(
    name: Name,
    body: ShadowsIn,
    svc: Deployments,
    ctx: Annotated[AuditContext, Depends(audited("deployment.shadows"))],
) -> DeploymentOut:
    shadows = [WeightedUri(s.model, s.percent) for s in body.shadows]
    return DeploymentOut.of(svc.set_shadows(ctx, name, shadows))


@router.put("/{name}/weights", summary="Replace the primaries and their weights (A/B)")
def set_weights(
    name: Name,
    body: WeightsIn,
    svc: Deployments,
    ctx: Annotated[AuditContext, Depends(audited("deployment.weights"))],
) -> DeploymentOut:
    return DeploymentOut.of(svc.set_weights(ctx, name, [w.weighted() for w in body.primary]))


@router.post("/{name}/promote", summary="Promote the canary to primary now")
def promote(
    name: Name,
    svc: Deployments,
    ctx: Annotated[AuditContext, Depends(audited("deployment.promote"))],
    body: Annotated[RevisionIn | None, Body()] = None,
) -> DeploymentOut:
    revision = body.revision if body else None
    return DeploymentOut.of(svc.promote(ctx, name, expected_revision=revision))


@router.post("/{name}/rollback", summary="Roll the canary back now")
def rollback(
    name: Name,
    svc: Deployments,
    ctx: Annotated[AuditContext, Depends(audited("deployment.rollback"))],
    body: Annotated[RollbackIn | None, Body()] = None,
) -> DeploymentOut:
    chosen = body or RollbackIn()
    changed = svc.rollback(ctx, name, reason=chosen.reason, expected_revision=chosen.revision)
    return DeploymentOut.of(changed)


@router.get("/{name}/events", summary="The deployment's newest changes, oldest first")
def events(
    name: Name,
    svc: Deployments,
    principal: CurrentPrincipal,
    limit: Annotated[int, Query(ge=1, le=MAX_EVENTS)] = 100,
) -> list[EventOut]:
    return [EventOut.of(e) for e in svc.events(principal, name, limit=limit)]


@router.get("/{name}/stats", summary="Calls per version since the current revision began")
def stats(name: Name, svc: Deployments, principal: CurrentPrincipal) -> list[StatsOut]:
    window = svc.window(principal, name)
    return [StatsOut.of(version, found) for version, found in sorted(window.items())]


@router.post("/{name}/reports", summary="A serve process's statistics (runs the controller)")
def report(name: Name, body: ReportIn, svc: Deployments, principal: DataPlane) -> ReportOut:
    reports = [v.report() for v in body.versions]
    outcome = svc.record_report(principal, name, body.revision, reports, body.loads())
    return ReportOut(
        revision=outcome.revision,
        action=outcome.decision.action.value,
        reason=outcome.decision.reason,
    )


@router.post("/{name}/samples", summary="Sampled requests from a serve process")
def push_samples(name: Name, body: SamplesIn, svc: Deployments, principal: DataPlane) -> SamplesOut:
    rows = [
        SampledRequest(
            revision=s.revision,
            version=s.version,
            shadow=s.shadow,
            inputs={k[:128]: v.model_dump() for k, v in s.inputs.items()},
            outputs={k[:128]: v.model_dump() for k, v in s.outputs.items()},
            request_id=s.request_id,
        )
        for s in body.samples
    ]
    return SamplesOut(accepted=svc.record_samples(principal, name, rows))


@router.post(
    "/{name}/labels",
    summary="The true outcomes of served requests, by the request ids their callers sent",
)
def post_labels(name: Name, body: LabelsIn, svc: Deployments, principal: DataPlane) -> LabelsOut:
    labels = [Label(request_id=item.request_id, value=item.label) for item in body.labels]
    outcome = svc.record_labels(principal, name, labels)
    return LabelsOut(stored=outcome.stored, unmatched=list(outcome.unmatched))


def _sample_cursor(sample: SampleOut) -> str:
    return encode_cursor(sample.id)


@router.get(
    "/{name}/samples",
    summary="The newest sampled requests, newest first (a page stops early past max_page_bytes)",
    response_model=list[SampleOut],
)
def list_samples(
    name: Name,
    svc: Deployments,
    principal: CurrentPrincipal,
    page_bytes: PageBytes,
    limit: Annotated[int, Query(ge=1, le=DEFAULT_KEEP_SAMPLES)] = 100,
    page_token: PageToken = None,
) -> Response:
    def fetch(count: int, token: str | None) -> ListPage[SampleOut]:
        before = decode_cursor(token, int)
        found = svc.samples(
            principal, name, limit=count, before=None if before is None else before[0]
        )
        return keyset_page([SampleOut.of(s) for s in found], count, _sample_cursor)

    return bounded_list(
        fetch,
        model_json,
        max_results=limit,
        page_token=page_token,
        max_bytes=page_bytes,
        cursor_of=_sample_cursor,
    )
