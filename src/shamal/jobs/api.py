"""Native HTTP API of jobs and cost: what the CLI and the SDK use."""

from __future__ import annotations

import logging
import math
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request, Response, status
from pydantic import Field

from shamal.api import (
    BINARY_BODY,
    ERROR_RESPONSES,
    ListPage,
    PageBytes,
    PageToken,
    bounded_list,
    keyset_page,
    model_json,
)
from shamal.artifacts import consume_body, download_slot
from shamal.jobs._cursor import job_cursor, job_cursor_after
from shamal.jobs._entities import Amount, CostLine, Job, JobEvent, JobState, QuotaUse
from shamal.jobs._schemas import JobIn
from shamal.jobs._schemas import Model as _Model
from shamal.jobs._service import MAX_LIST, JobService
from shamal.security import AuditContext
from shamal.security.api import CurrentPrincipal, audited

logger = logging.getLogger(__name__)


def get_jobs(request: Request) -> JobService:
    service: JobService = request.app.state.jobs
    return service


Jobs = Annotated[JobService, Depends(get_jobs)]
JobId = Annotated[str, Path(min_length=6, max_length=32, pattern=r"^[0-9a-f]+$")]
Digest = Annotated[str, Path(pattern=r"^[0-9a-f]{64}$")]


class JobOut(_Model):
    """A job and where it stands."""

    id: str
    name: str
    team: str
    user: str
    state: str = Field(examples=["queued", "running", "succeeded"])
    reason: str
    command: list[str]
    priority: str
    pool: str | None
    cpus: float
    memory_mib: int
    gpus: int
    gpu_fraction: float
    mig_profile: str | None
    gpu_memory_mib: int = Field(
        default=0, description="the memory each worker's device must have, in MiB (0: any)"
    )
    workers: int
    resources: str
    time_limit_s: float | None
    attempt: int
    max_retries: int
    retries_used: int
    preemptions: int
    exit_code: int | None
    snapshot: str | None
    submitted_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    placement: dict[str, Any] | None
    stop_request: str | None
    attained_s: float
    predicted_s: float | None
    datasets: list[str] = Field(default=[], description="the datasets the job reads")
    regions: list[str] | None = Field(
        default=None,
        description="the regions the residency policies of its datasets leave it to run in "
        "(null: anywhere)",
    )
    executor: str | None = Field(
        default=None,
        description="the executor it asked for (local, ray); null: the server's default",
    )
    waiting: str | None = Field(
        default=None,
        description="for a queued job: what it waits for (quota, resources or the "
        "scheduler's next pass), or why it can never start",
        examples=["waiting for quota: team 'vision' holds its share of pool 'gpu'; ..."],
    )

    @classmethod
    def of(cls, job: Job, waiting: str | None) -> JobOut:
        """``job`` as answered; ``waiting`` as :meth:`JobService.waiting` says (endpoints
        use :meth:`one` or :meth:`each`, which ask it, so every answer fills it alike)."""
        return cls(
            id=job.id,
            name=job.name,
            team=job.team,
            user=job.user,
            state=job.state.value,
            reason=job.reason,
            command=list(job.command),
            priority=job.priority,
            pool=job.pool,
            cpus=job.cpu_milli / 1000,
            memory_mib=job.memory_mib,
            gpus=job.gpus,
            gpu_fraction=job.gpu_milli / 1000,
            mig_profile=job.mig_profile,
            gpu_memory_mib=job.gpu_memory_mib,
            workers=job.workers,
            resources=job.resources_text,
            time_limit_s=job.time_limit_s,
            attempt=job.attempt,
            max_retries=job.max_retries,
            retries_used=job.retries_used,
            preemptions=job.preemptions,
            exit_code=job.exit_code,
            snapshot=job.snapshot,
            submitted_at=job.submitted_at,
            updated_at=job.updated_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            placement=dict(job.placement) if job.placement else None,
            stop_request=job.stop_request,
            attained_s=job.attained_s,
            predicted_s=job.predicted_s,
            datasets=list(job.datasets),
            executor=job.executor,
            regions=None if job.regions is None else list(job.regions),
            waiting=waiting,
        )

    @classmethod
    def one(cls, job: Job, svc: JobService) -> JobOut:
        """A job as answered, with what it waits for if it is queued."""
        return cls.each([job], svc)[0]

    @classmethod
    def each(cls, jobs: list[Job], svc: JobService) -> list[JobOut]:
        """Jobs as answered, queued ones with what they wait for."""
        waiting = svc.waiting(jobs)
        return [cls.of(job, waiting.get(job.id)) for job in jobs]


class EventOut(_Model):
    at: datetime
    from_state: str | None
    to_state: str
    attempt: int
    actor: str
    reason: str

    @classmethod
    def of(cls, event: JobEvent) -> EventOut:
        return cls(
            at=event.at,
            from_state=event.from_state.value if event.from_state else None,
            to_state=event.to_state.value,
            attempt=event.attempt,
            actor=event.actor,
            reason=event.reason,
        )


class SnapshotOut(_Model):
    digest: str
    size: int


class CostOut(_Model):
    key: str
    jobs: int
    attempts: int
    gpu_seconds: float
    cpu_seconds: float
    memory_gib_seconds: float
    cost: float

    @classmethod
    def of(cls, line: CostLine) -> CostOut:
        return cls(
            key=line.key,
            jobs=line.jobs,
            attempts=line.attempts,
            gpu_seconds=line.gpu_seconds,
            cpu_seconds=line.cpu_seconds,
            memory_gib_seconds=line.memory_gib_seconds,
            cost=line.cost,
        )


router = APIRouter(prefix="/api/v1", tags=["jobs"], responses=ERROR_RESPONSES)


SnapshotTeam = Annotated[
    str | None,
    Query(max_length=64, description="The team whose snapshot it is (default: your only team)."),
]


@router.get(
    "/snapshots/{digest}",
    summary="Whether the team uploaded a code snapshot (404 if not, or only another team did)",
)
def get_snapshot(
    digest: Digest, svc: Jobs, principal: CurrentPrincipal, team: SnapshotTeam = None
) -> SnapshotOut:
    return SnapshotOut(digest=digest, size=svc.snapshot_size(principal, digest, team))


@router.put(
    "/snapshots/{digest}",
    status_code=status.HTTP_201_CREATED,
    summary="Upload a code snapshot (a .tar.gz named by its sha256)",
    openapi_extra=BINARY_BODY,
)
async def put_snapshot(
    digest: Digest,
    request: Request,
    svc: Jobs,
    ctx: Annotated[AuditContext, Depends(audited("job.snapshot"))],
    team: SnapshotTeam = None,
) -> SnapshotOut:
    size = await consume_body(request, lambda chunks: svc.store_snapshot(ctx, digest, chunks, team))
    return SnapshotOut(digest=digest, size=size)


@router.post("/jobs", status_code=status.HTTP_201_CREATED, summary="Queue a job")
def submit_job(
    body: JobIn, svc: Jobs, ctx: Annotated[AuditContext, Depends(audited("job.submit"))]
) -> JobOut:
    return JobOut.one(svc.submit(ctx, body.spec()), svc)


def _job_cursor(job: JobOut) -> str:
    return job_cursor(job.submitted_at, job.id)


@router.get(
    "/jobs",
    summary="Jobs you can see, newest first (a page stops early past max_page_bytes)",
    response_model=list[JobOut],
)
def list_jobs(
    svc: Jobs,
    principal: CurrentPrincipal,
    page_bytes: PageBytes,
    state: Annotated[list[JobState], Query(max_length=8)] = [],  # noqa: B006 - FastAPI copies
    team: Annotated[str | None, Query(max_length=64)] = None,
    user: Annotated[str | None, Query(max_length=256)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = 100,
    page_token: PageToken = None,
) -> Response:
    def fetch(count: int, token: str | None) -> ListPage[JobOut]:
        jobs = svc.list_jobs(
            principal,
            states=state,
            team=team,
            user=user,
            limit=count,
            after=job_cursor_after(token),
        )
        return keyset_page(JobOut.each(jobs, svc), count, _job_cursor)

    return bounded_list(
        fetch,
        model_json,
        max_results=limit,
        page_token=page_token,
        max_bytes=page_bytes,
        cursor_of=_job_cursor,
    )


@router.get("/jobs/{job_id}", summary="One job (its id or a unique prefix of 6+ characters)")
def get_job(job_id: JobId, svc: Jobs, principal: CurrentPrincipal) -> JobOut:
    return JobOut.one(svc.get(principal, job_id), svc)


@router.get("/jobs/{job_id}/events", summary="Every state transition of a job, oldest first")
def job_events(job_id: JobId, svc: Jobs, principal: CurrentPrincipal) -> list[EventOut]:
    return [EventOut.of(event) for event in svc.events(principal, job_id)]


@router.get(
    "/jobs/{job_id}/logs",
    summary="A job's log from a byte offset (headers say where the next read starts)",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}}},
    # A log read is a download of up to 1 MiB: it holds one of the caller's download slots.
    dependencies=[Depends(download_slot, scope="request")],
)
def job_logs(
    job_id: JobId,
    svc: Jobs,
    principal: CurrentPrincipal,
    attempt: Annotated[int | None, Query(ge=0, le=10_000)] = None,
    offset: Annotated[int, Query(ge=0, le=2**62)] = 0,
) -> Response:
    chunk = svc.read_log(principal, job_id, attempt, offset)
    return Response(
        content=chunk.data,
        media_type="text/plain; charset=utf-8",
        headers={
            "X-Shamal-Next-Offset": str(chunk.next_offset),
            "X-Shamal-Attempt": str(chunk.attempt),
            "X-Shamal-Complete": "true" if chunk.complete else "false",
        },
    )


@router.post("/jobs/{job_id}/cancel", summary="Cancel a job (member of its team)")
def cancel_job(
    job_id: JobId, svc: Jobs, ctx: Annotated[AuditContext, Depends(audited("job.cancel"))]
) -> JobOut:
    return JobOut.one(svc.cancel(ctx, job_id), svc)


@router.post("/jobs/{job_id}/preempt", summary="Preempt a running job and requeue it (admin)")
def preempt_job(
    job_id: JobId, svc: Jobs, ctx: Annotated[AuditContext, Depends(audited("job.preempt"))]
) -> JobOut:
    return JobOut.one(svc.preempt(ctx, job_id), svc)


class AmountOut(_Model):
    cpus: float
    memory_mib: int
    gpus: float

    @classmethod
    def of(cls, amount: Amount) -> AmountOut:
        return cls(cpus=amount.cpus, memory_mib=amount.memory_mib, gpus=amount.gpus)


class QuotaOut(_Model):
    """A team's quota in a pool (from the cluster file) and what its jobs hold there now."""

    team: str
    pool: str
    cohort: str
    weight: float
    guaranteed: AmountOut
    borrow_limit: AmountOut = Field(description="idle quota of the cohort it may borrow")
    held: AmountOut = Field(description="what its admitted and running jobs hold now")
    running: int
    queued: int = Field(
        description="its waiting jobs this pool could run: those naming it, and those "
        "naming no pool that could start here (counted in each such pool)"
    )

    @classmethod
    def of(cls, use: QuotaUse) -> QuotaOut:
        return cls(
            team=use.team,
            pool=use.pool,
            cohort=use.cohort,
            weight=use.weight,
            guaranteed=AmountOut.of(use.guaranteed),
            borrow_limit=AmountOut.of(use.borrow_limit),
            held=AmountOut.of(use.held),
            running=use.running,
            queued=use.queued,
        )


class PredictorOut(_Model):
    """Runtime predictions replayed over history: each job predicted before it ran."""

    n: int
    unpredicted: int
    mae_s: float | None
    mdape: float | None
    within_2x: float | None
    median_log2_ratio: float | None


@router.get("/scheduler/quotas", summary="Team quotas per pool and what each team holds now")
def quotas(svc: Jobs, principal: CurrentPrincipal) -> list[QuotaOut]:
    return [QuotaOut.of(use) for use in svc.quota_use(principal)]


@router.get("/scheduler/predictor", summary="How well the runtime predictor does on history")
def predictor_report(svc: Jobs, principal: CurrentPrincipal) -> PredictorOut:
    report = svc.predictor_report(principal)
    return PredictorOut(
        n=int(report["n"]),
        unpredicted=int(report.get("unpredicted", 0)),
        **{
            key: None if math.isnan(report[key]) else report[key]
            for key in ("mae_s", "mdape", "within_2x", "median_log2_ratio")
        },
    )


@router.get("/cost", summary="GPU-, CPU- and memory-seconds and their cost, grouped")
def cost_report(
    svc: Jobs,
    principal: CurrentPrincipal,
    since: datetime,
    by: Literal["team", "pool", "user", "job"] = "team",
    until: datetime | None = None,
) -> list[CostOut]:
    lines = svc.cost_report(principal, by=by, since=since, until=until)
    return [CostOut.of(line) for line in lines]
