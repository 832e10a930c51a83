"""Native `/api/v1` view of tracking, for the CLI and the SDK (same service as the MLflow one)."""

from __future__ import annotations

import math
from typing import Annotated, Generic, TypeVar

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from pydantic import BaseModel

from shamal.api import ERROR_RESPONSES, PageBytes, bounded_listing, model_json, special_value
from shamal.artifacts import search_slot
from shamal.security import Principal
from shamal.security.api import CurrentPrincipal
from shamal.tracking._entities import Experiment, HistoryRow, Run
from shamal.tracking._paging import encode_history_token, resume_token
from shamal.tracking._service import MAX_SEARCH, TrackingService, view_type


def _tracking(request: Request) -> TrackingService:
    service: TrackingService = request.app.state.tracking
    return service


T = TypeVar("T")
#: Lists and searches hold one of the caller's ``max_searches_per_principal`` slots.
SEARCH_SLOT = [Depends(search_slot)]
Tracking = Annotated[TrackingService, Depends(_tracking)]
ExperimentId = Annotated[str, Path(pattern=r"^[0-9]{1,18}$")]
RunId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$")]
#: The shortest run id prefix looked up, as git's short ids: shorter ones match too much.
MIN_RUN_ID_PREFIX = 8
RunIdPrefix = Annotated[
    str,
    Query(
        pattern=rf"^[0-9a-f]{{{MIN_RUN_ID_PREFIX},32}}$",
        description=f"The first {MIN_RUN_ID_PREFIX} to 32 characters of a run id (lower-case hex).",
    ),
]
#: Experiments per run search when every visible experiment is searched: keeps the
#: ``IN (...)`` list far below the bound-parameter limits of SQLite and PostgreSQL.
_EXPERIMENT_BATCH = 500
View = Annotated[str, Query(pattern=r"^(ACTIVE_ONLY|DELETED_ONLY|ALL)$")]


class ExperimentOut(BaseModel):
    experiment_id: str
    name: str
    lifecycle_stage: str
    artifact_location: str
    creation_time: int
    last_update_time: int
    tags: dict[str, str]

    @classmethod
    def of(cls, e: Experiment) -> ExperimentOut:
        return cls(
            experiment_id=e.experiment_id,
            name=e.name,
            lifecycle_stage=e.lifecycle_stage,
            artifact_location=e.artifact_location,
            creation_time=e.creation_time,
            last_update_time=e.last_update_time,
            tags=dict(e.tags),
        )


class MetricPoint(BaseModel):
    step: int
    timestamp: int
    value: float | None  # NaN and infinities have no JSON number: None, with `special`
    special: str | None = None

    @classmethod
    def of(cls, row: HistoryRow) -> MetricPoint:
        step, timestamp, value, nan = row
        if not nan and math.isfinite(value):
            return cls(step=step, timestamp=timestamp, value=value)
        return cls(step=step, timestamp=timestamp, value=None, special=special_value(value, nan))


class RunOut(BaseModel):
    run_id: str
    run_name: str
    experiment_id: str
    status: str
    user_id: str
    start_time: int
    end_time: int | None
    lifecycle_stage: str
    params: dict[str, str]
    metrics: dict[str, MetricPoint]
    tags: dict[str, str]

    @classmethod
    def of(cls, r: Run) -> RunOut:
        i = r.info
        return cls(
            run_id=i.run_id,
            run_name=i.run_name,
            experiment_id=i.experiment_id,
            status=i.status,
            user_id=i.user_id,
            start_time=i.start_time,
            end_time=i.end_time,
            lifecycle_stage=i.lifecycle_stage,
            params=dict(r.params),
            metrics={
                m.key: MetricPoint.of((m.step, m.timestamp, m.value, False)) for m in r.metrics
            },
            tags=dict(r.tags),
        )


class Listing(BaseModel, Generic[T]):
    items: list[T]
    next_page_token: str | None = None


router = APIRouter(prefix="/api/v1", tags=["tracking"], responses=ERROR_RESPONSES)


@router.get(
    "/experiments",
    summary="Experiments visible to the caller (a page stops early past max_page_bytes)",
    response_model=Listing[ExperimentOut],
    dependencies=SEARCH_SLOT,
)
def list_experiments(
    svc: Tracking,
    principal: CurrentPrincipal,
    page_bytes: PageBytes,
    filter: Annotated[str | None, Query(max_length=20_000)] = None,  # noqa: A002
    view: View = "ACTIVE_ONLY",
    max_results: Annotated[int, Query(ge=1, le=1000)] = 100,
    page_token: Annotated[str | None, Query(max_length=200)] = None,
) -> Response:
    return bounded_listing(
        lambda limit, token: svc.search_experiments(
            principal,
            filter_string=filter,
            order_by=["name"],
            view=view_type(view),
            max_results=limit,
            page_token=token,
        ),
        lambda e: model_json(ExperimentOut.of(e)),
        max_results=max_results,
        page_token=page_token,
        max_bytes=page_bytes,
        resume_at=resume_token,
    )


@router.get("/experiments/{experiment_id}", summary="One experiment")
def get_experiment(
    experiment_id: ExperimentId, svc: Tracking, principal: CurrentPrincipal
) -> ExperimentOut:
    return ExperimentOut.of(svc.experiment(principal, experiment_id))


@router.get(
    "/experiments/{experiment_id}/runs",
    summary="Runs of an experiment, searched (a page stops early past max_page_bytes)",
    response_model=Listing[RunOut],
    dependencies=SEARCH_SLOT,
)
def list_runs(  # noqa: PLR0913, PLR0917 - FastAPI: each a query field or a dependency
    experiment_id: ExperimentId,
    svc: Tracking,
    principal: CurrentPrincipal,
    page_bytes: PageBytes,
    filter: Annotated[str | None, Query(max_length=20_000)] = None,  # noqa: A002
    order_by: Annotated[list[str] | None, Query(max_length=20)] = None,
    view: View = "ACTIVE_ONLY",
    max_results: Annotated[int, Query(ge=1, le=5000)] = 100,
    page_token: Annotated[str | None, Query(max_length=200)] = None,
) -> Response:
    return bounded_listing(
        lambda limit, token: svc.search_runs(
            principal,
            experiment_ids=[experiment_id],
            filter_string=filter,
            view=view_type(view),
            max_results=limit,
            order_by=order_by or [],
            page_token=token,
        ),
        lambda r: model_json(RunOut.of(r)),
        max_results=max_results,
        page_token=page_token,
        max_bytes=page_bytes,
        resume_at=resume_token,
    )


@router.get("/runs/{run_id}", summary="One run with its params, latest metrics and tags")
def get_run(run_id: RunId, svc: Tracking, principal: CurrentPrincipal) -> RunOut:
    return RunOut.of(svc.get_run(principal, run_id))


@router.get(
    "/runs/{run_id}/metrics/{key}",
    summary="A metric's history (a page stops early past max_page_bytes)",
    response_model=Listing[MetricPoint],
    dependencies=SEARCH_SLOT,
)
def metric_history(
    run_id: RunId,
    key: Annotated[str, Path(max_length=250)],
    svc: Tracking,
    principal: CurrentPrincipal,
    page_bytes: PageBytes,
    max_results: Annotated[int, Query(ge=1, le=1_000_000)] = 100_000,
    page_token: Annotated[str | None, Query(max_length=200)] = None,
) -> Response:
    return bounded_listing(
        lambda limit, token: svc.metric_history(principal, run_id, key, token, limit),
        lambda m: model_json(MetricPoint.of(m)),
        max_results=max_results,
        page_token=page_token,
        max_bytes=page_bytes,
        cursor_of=encode_history_token,
    )


@router.get("/runs", summary="Runs the caller can see whose id starts with a prefix")
def find_runs(
    id_prefix: RunIdPrefix,
    svc: Tracking,
    principal: CurrentPrincipal,
    max_results: Annotated[int, Query(ge=1, le=100)] = 10,
) -> Listing[RunOut]:
    """How a short id (what the CLI shows) becomes a run: the runs whose id starts with
    ``id_prefix``, among every experiment the caller can see, deleted runs included (they
    can still be shown). At most ``max_results``, in run-id order; ask for two to tell
    "one", "none" and "ambiguous" apart.
    """
    # The prefix is lower-case hex by its pattern, so the clause says only "starts with"; it
    # goes through the filter grammar like any user filter and reaches SQL as a bound value.
    clause = f"attributes.run_id LIKE '{id_prefix}%'"
    found: list[Run] = []
    ids = _visible_experiment_ids(svc, principal)
    for start in range(0, len(ids), _EXPERIMENT_BATCH):
        page = svc.search_runs(
            principal,
            experiment_ids=ids[start : start + _EXPERIMENT_BATCH],
            filter_string=clause,
            view="all",
            max_results=max_results,
            order_by=["attributes.run_id ASC"],
            page_token=None,
        )
        found.extend(page.items)
    found.sort(key=lambda r: r.info.run_id)
    return Listing(items=[RunOut.of(r) for r in found[:max_results]])


def _visible_experiment_ids(svc: TrackingService, principal: Principal) -> list[str]:
    """The ids of every experiment (deleted ones too) the principal may read."""
    ids: list[str] = []
    token: str | None = None
    while True:
        page = svc.search_experiments(
            principal,
            filter_string=None,
            order_by=["experiment_id"],
            view="all",
            max_results=MAX_SEARCH["experiments"],
            page_token=token,
        )
        ids.extend(e.experiment_id for e in page.items)
        token = page.next_page_token
        if token is None:
            return ids
