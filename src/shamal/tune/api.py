"""Native HTTP API of hyperparameter search: studies, trials, suggestions and reports.

Creating a study, asking for a trial, attaching its job and telling its result are
audited; suggestions, reports and user attributes are data-plane writes into a trial
whose creation was audited.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request, Response
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
from shamal.errors import NotImplementedFeature
from shamal.security import AuditContext, Principal
from shamal.security.api import CurrentPrincipal, audited, data_plane_write
from shamal.tune._entities import (
    MAX_STEP,
    PARAM_NAME_PATTERN,
    STUDY_NAME_PATTERN,
    Direction,
    StudyInfo,
    StudySpec,
    TrialInfo,
    TrialState,
)
from shamal.tune._service import NEEDS_EXTRA, TuneService

logger = logging.getLogger(__name__)

MAX_TRIALS_PAGE = 1000
"""The most trials one page of a study's list holds."""


def get_tune(request: Request) -> TuneService:
    service: TuneService = request.app.state.tune
    if not service.available:
        raise NotImplementedFeature(NEEDS_EXTRA)
    return service


Tune = Annotated[TuneService, Depends(get_tune)]
TeamPath = Annotated[str, Path(pattern=r"^(-|[a-z0-9][a-z0-9._-]{0,63})$")]
StudyPath = Annotated[str, Path(pattern=STUDY_NAME_PATTERN, max_length=100)]
TrialId = Annotated[int, Path(ge=0, le=2**31 - 1)]
DataPlane = Annotated[Principal, Depends(data_plane_write)]
Scalar = None | bool | int | Annotated[float, Field(allow_inf_nan=False)] | str


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StudyIn(_Model):
    """A study to create, or to load when it exists (with the same direction)."""

    name: str = Field(pattern=STUDY_NAME_PATTERN, max_length=100)
    team: str | None = Field(default=None, max_length=64)
    direction: Direction = Direction.MINIMIZE
    sampler: Literal["tpe", "random", "cmaes", "qmc", "gp", "nsga2"] = "tpe"
    pruner: Literal["median", "asha", "hyperband", "none"] = "median"
    seed: int | None = Field(default=None, ge=0, le=2**32 - 1)


class TrialOut(_Model):
    id: int
    number: int
    study: str
    team: str
    state: str
    value: float | None
    params: dict[str, Any]
    intermediate: dict[int, float]
    user_attrs: dict[str, Any]
    job_id: str | None
    reason: str
    started_at: datetime | None
    finished_at: datetime | None

    @classmethod
    def of(cls, trial: TrialInfo) -> TrialOut:
        return cls(
            id=trial.id,
            number=trial.number,
            study=trial.study,
            team=trial.team,
            state=trial.state.value,
            value=trial.value,
            params=trial.params,
            intermediate=trial.intermediate,
            user_attrs=trial.user_attrs,
            job_id=trial.job_id,
            reason=trial.reason,
            started_at=trial.started_at,
            finished_at=trial.finished_at,
        )


class StudyOut(_Model):
    name: str
    team: str
    user: str
    direction: str
    sampler: str
    pruner: str
    counts: dict[str, int]
    best: TrialOut | None

    @classmethod
    def of(cls, study: StudyInfo) -> StudyOut:
        return cls(
            name=study.name,
            team=study.team,
            user=study.user,
            direction=study.direction.value,
            sampler=study.sampler,
            pruner=study.pruner,
            counts=study.counts,
            best=TrialOut.of(study.best) if study.best else None,
        )


class SuggestIn(_Model):
    """A parameter and its distribution: ``{"type": "float", "low": 1e-4, "high": 1,
    "log": true}``, ``{"type": "int", "low": 1, "high": 8, "step": 1}`` or
    ``{"type": "categorical", "choices": ["a", "b"]}``."""

    name: str = Field(pattern=PARAM_NAME_PATTERN, max_length=128)
    distribution: dict[str, Any]


class ValueOut(_Model):
    value: Any


class ReportIn(_Model):
    step: int = Field(ge=0, le=MAX_STEP)
    value: float = Field(allow_inf_nan=False)


class PruneOut(_Model):
    prune: bool


class AttrIn(_Model):
    key: str = Field(pattern=PARAM_NAME_PATTERN, max_length=128)
    value: Scalar = Field(union_mode="left_to_right")


class JobIn(_Model):
    job_id: str = Field(min_length=6, max_length=32, pattern=r"^[0-9a-f]+$")


class TellIn(_Model):
    state: Literal["complete", "pruned", "fail"]
    value: float | None = Field(default=None, allow_inf_nan=False)


router = APIRouter(prefix="/api/v1/tune", tags=["tune"], responses=ERROR_RESPONSES)


@router.post("/studies")
def create_study(
    body: StudyIn, svc: Tune, ctx: Annotated[AuditContext, Depends(audited("tune.study.create"))]
) -> StudyOut:
    """Create a study, or load it when it exists."""
    spec = StudySpec(
        name=body.name,
        team=body.team,
        direction=body.direction,
        sampler=body.sampler,
        pruner=body.pruner,
        seed=body.seed,
    )
    return StudyOut.of(svc.create_study(ctx, spec))


@router.get("/studies")
def list_studies(
    svc: Tune,
    principal: CurrentPrincipal,
    team: Annotated[
        str, Query(max_length=64, description="only this team's (`-`: no team; empty: all)")
    ] = "",
) -> list[StudyOut]:
    """Studies the caller may see, by team and name (without trial counts)."""
    return [StudyOut.of(s) for s in svc.list_studies(principal, team or None)]


@router.get("/studies/{team}/{name}")
def get_study(team: TeamPath, name: StudyPath, svc: Tune, principal: CurrentPrincipal) -> StudyOut:
    """A study (team ``-``: no team), with trial counts and the best trial."""
    return StudyOut.of(svc.get_study(principal, team, name))


@router.get(
    "/studies/{team}/{name}/trials",
    response_model=list[TrialOut],
    summary="The study's trials by number (a page stops early past max_page_bytes)",
)
def list_trials(
    team: TeamPath,
    name: StudyPath,
    svc: Tune,
    principal: CurrentPrincipal,
    page_bytes: PageBytes,
    limit: Annotated[int, Query(ge=1, le=MAX_TRIALS_PAGE)] = MAX_TRIALS_PAGE,
    page_token: PageToken = None,
) -> Response:
    """A trial holds what its code reported (parameters, intermediate values, attributes),
    so a page stops past the byte bound as well as at ``limit``; the next page's token is in
    the ``X-Shamal-Next-Page-Token`` header."""
    trials = [TrialOut.of(t) for t in svc.list_trials(principal, team, name)]

    def cursor(trial: TrialOut) -> str:
        return encode_cursor(trial.number)

    def fetch(count: int, token: str | None) -> ListPage[TrialOut]:
        after = decode_cursor(token, int)
        rest = [t for t in trials if after is None or t.number > after[0]]
        return keyset_page(rest[:count], count, cursor)

    return bounded_list(
        fetch,
        model_json,
        max_results=limit,
        page_token=page_token,
        max_bytes=page_bytes,
        cursor_of=cursor,
    )


@router.post("/studies/{team}/{name}/trials")
def ask(
    team: TeamPath,
    name: StudyPath,
    svc: Tune,
    ctx: Annotated[AuditContext, Depends(audited("tune.trial.ask"))],
) -> TrialOut:
    """Start a new trial; its id goes to the trial's job (env ``TUNE_TRIAL_ID``)."""
    return TrialOut.of(svc.ask(ctx, team, name))


@router.get("/trials/{trial_id}")
def get_trial(trial_id: TrialId, svc: Tune, principal: CurrentPrincipal) -> TrialOut:
    return TrialOut.of(svc.get_trial(principal, trial_id))


@router.post("/trials/{trial_id}/job")
def attach_job(
    trial_id: TrialId,
    body: JobIn,
    svc: Tune,
    ctx: Annotated[AuditContext, Depends(audited("tune.trial.attach"))],
) -> TrialOut:
    """Record the job that runs the trial."""
    return TrialOut.of(svc.attach_job(ctx, trial_id, body.job_id))


@router.post("/trials/{trial_id}/suggest")
def suggest(trial_id: TrialId, body: SuggestIn, svc: Tune, principal: DataPlane) -> ValueOut:
    """The parameter's value for this trial (the same on every later call)."""
    return ValueOut(value=svc.suggest(principal, trial_id, body.name, body.distribution))


@router.post("/trials/{trial_id}/report")
def report(trial_id: TrialId, body: ReportIn, svc: Tune, principal: DataPlane) -> PruneOut:
    """Report an intermediate value; the answer says whether to stop (prune) the trial."""
    return PruneOut(prune=svc.report(principal, trial_id, body.step, body.value))


@router.get("/trials/{trial_id}/should-prune")
def should_prune(trial_id: TrialId, svc: Tune, principal: CurrentPrincipal) -> PruneOut:
    return PruneOut(prune=svc.should_prune(principal, trial_id))


@router.post("/trials/{trial_id}/attrs", status_code=204)
def set_attr(trial_id: TrialId, body: AttrIn, svc: Tune, principal: DataPlane) -> None:
    """Set a user attribute of a running trial (e.g. ``run_id``)."""
    svc.set_user_attr(principal, trial_id, body.key, body.value)


@router.post("/trials/{trial_id}/tell")
def tell(
    trial_id: TrialId,
    body: TellIn,
    svc: Tune,
    ctx: Annotated[AuditContext, Depends(audited("tune.trial.tell"))],
) -> TrialOut:
    """Finish the trial: complete (with its value), pruned or fail."""
    return TrialOut.of(svc.tell(ctx, trial_id, TrialState(body.state), body.value))
