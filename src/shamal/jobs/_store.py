"""SQL access for jobs. ORM rows never leave this module.

Every function takes the caller's session; the service owns transactions. A job's
state moves only through :func:`transition`, a compare-and-set on the state column
that also appends the job's event row: two processes racing on one job can never
both win, and no transition goes unrecorded.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, func, or_, select, text, update
from sqlalchemy.orm import Session

from shamal.db.models import JobAttemptRow, JobEventRow, JobRow, SnapshotOwnerRow
from shamal.errors import InvalidParameter, NotFound
from shamal.jobs._entities import TRANSITIONS, Job, JobEvent, JobState

logger = logging.getLogger(__name__)

_SCHEDULING_LOCK = 0x53484A42  # "SHJB": one scheduling pass at a time on PostgreSQL

#: Which jobs a caller may see: None = all (platform admins), else these team names.
Visibility = frozenset[str] | None


def job_not_found(job_id: str) -> NotFound:
    return NotFound(f"job {job_id!r} does not exist")


def _job(row: JobRow) -> Job:
    return Job(
        id=row.id,
        name=row.name,
        team=row.team_name,
        user=row.user_id,
        command=tuple(row.command),
        env=dict(row.env),
        snapshot=row.snapshot,
        cpu_milli=row.cpu_milli,
        memory_mib=row.memory_mib,
        gpus=row.gpus,
        gpu_milli=row.gpu_milli,
        mig_profile=row.mig_profile,
        gpu_models=tuple(row.gpu_models),
        gpu_memory_mib=row.gpu_memory_mib,
        workers=row.workers,
        pool=row.pool,
        priority=row.priority,
        priority_value=row.priority_value,
        time_limit_s=row.time_limit_s,
        max_retries=row.max_retries,
        retries_used=row.retries_used,
        attempt=row.attempt,
        state=JobState(row.state),
        reason=row.reason,
        exit_code=row.exit_code,
        submitted_at=row.submitted_at,
        updated_at=row.updated_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        placement=row.placement,
        handle=row.handle,
        claimed_by=row.claimed_by,
        stop_request=row.stop_request,
        attained_s=row.attained_s,
        preemptions=row.preemptions,
        fingerprint=row.fingerprint,
        predicted_s=row.predicted_s,
        datasets=tuple(row.datasets or ()),
        regions=None if row.regions is None else tuple(row.regions),
        executor=row.executor,
    )


def add_snapshot_owner(s: Session, digest: str, team_id: str, at: datetime) -> None:
    """Record that ``team_id`` uploaded the snapshot ``digest`` (again: no change)."""
    if s.get(SnapshotOwnerRow, (digest, team_id)) is None:
        s.add(SnapshotOwnerRow(digest=digest, team_id=team_id, created_at=at))
        s.flush()


def snapshot_owned(s: Session, digest: str, team_id: str) -> bool:
    """Whether ``team_id`` uploaded the snapshot ``digest``."""
    return s.get(SnapshotOwnerRow, (digest, team_id)) is not None


def insert_job(s: Session, job: Job, team_id: str | None, actor: str) -> Job:
    """Store a new job (state ``queued``) with its first event."""
    row = JobRow(
        id=job.id,
        name=job.name,
        team_id=team_id,
        team_name=job.team,
        user_id=job.user,
        command=list(job.command),
        env=dict(job.env),
        snapshot=job.snapshot,
        cpu_milli=job.cpu_milli,
        memory_mib=job.memory_mib,
        gpus=job.gpus,
        gpu_milli=job.gpu_milli,
        mig_profile=job.mig_profile,
        gpu_models=list(job.gpu_models),
        gpu_memory_mib=job.gpu_memory_mib,
        workers=job.workers,
        pool=job.pool,
        priority=job.priority,
        priority_value=job.priority_value,
        time_limit_s=job.time_limit_s,
        max_retries=job.max_retries,
        retries_used=0,
        attempt=0,
        state=JobState.QUEUED.value,
        reason="submitted",
        submitted_at=job.submitted_at,
        updated_at=job.submitted_at,
        attained_s=0.0,
        preemptions=0,
        fingerprint=job.fingerprint,
        predicted_s=job.predicted_s,
        datasets=list(job.datasets) or None,
        regions=None if job.regions is None else list(job.regions),
        executor=job.executor,
    )
    s.add(row)
    s.flush()  # the event row refers to it; no ORM relationship orders the inserts
    s.add(
        JobEventRow(
            job_id=job.id,
            at=job.submitted_at,
            to_state=JobState.QUEUED.value,
            attempt=0,
            actor=actor,
            reason="submitted",
        )
    )
    s.flush()
    return _job(row)


def get_job(s: Session, job_id: str, visible: Visibility = None) -> Job:
    """The job with this id, or with this unique id prefix (at least 6 characters).

    Raises:
        NotFound: none, or not visible to the caller.
        InvalidParameter: a prefix that matches several jobs.
    """
    row = s.get(JobRow, job_id) if len(job_id) == 32 else None
    if row is None and 6 <= len(job_id) < 32:
        query = select(JobRow).where(JobRow.id.startswith(job_id, autoescape=True)).limit(2)
        rows = list(s.scalars(query))
        if len(rows) > 1:
            raise InvalidParameter(f"job id prefix {job_id!r} is ambiguous: give more of it")
        row = rows[0] if rows else None
    if row is None or (visible is not None and row.team_name not in visible):
        raise job_not_found(job_id)
    return _job(row)


def list_jobs(
    s: Session,
    visible: Visibility,
    *,
    states: Collection[JobState] = (),
    team: str | None = None,
    user: str | None = None,
    limit: int = 100,
    after: tuple[datetime, str] | None = None,
) -> list[Job]:
    """Newest first; ``after``: only the jobs listed after the one submitted then with that
    id (a keyset page)."""
    query = select(JobRow).order_by(JobRow.submitted_at.desc(), JobRow.id).limit(limit)
    if after is not None:
        at, job_id = after
        query = query.where(
            or_(
                JobRow.submitted_at < at,
                and_(JobRow.submitted_at == at, JobRow.id > job_id),
            )
        )
    if visible is not None:
        query = query.where(JobRow.team_name.in_(sorted(visible)))
    if states:
        query = query.where(JobRow.state.in_(sorted(state.value for state in states)))
    if team is not None:
        query = query.where(JobRow.team_name == team)
    if user is not None:
        query = query.where(JobRow.user_id == user)
    return [_job(row) for row in s.scalars(query)]


def jobs_in_states(s: Session, states: Collection[JobState]) -> list[Job]:
    """Every job in one of ``states``, oldest first (what the scheduler works on)."""
    query = (
        select(JobRow)
        .where(JobRow.state.in_(sorted(state.value for state in states)))
        .order_by(JobRow.submitted_at, JobRow.id)
    )
    return [_job(row) for row in s.scalars(query)]


def transition(
    s: Session,
    job_id: str,
    expected: JobState | Collection[JobState],
    to: JobState,
    *,
    at: datetime,
    actor: str,
    reason: str,
    **changes: Any,
) -> Job | None:
    """Move a job from one of the ``expected`` states to ``to``; None if it was not in them.

    ``changes`` are other columns set in the same UPDATE. The job's event row is written
    in the same transaction.

    Raises:
        ValueError: a transition the state machine does not allow (a bug, not user input).
    """
    allowed = {expected} if isinstance(expected, JobState) else set(expected)
    for state in allowed:
        if to not in TRANSITIONS[state]:
            raise ValueError(f"job state {state.value} cannot become {to.value}")
    values = {"state": to.value, "updated_at": at, "reason": reason[:2000], **changes}
    result = s.execute(
        update(JobRow)
        .where(JobRow.id == job_id, JobRow.state.in_(sorted(x.value for x in allowed)))
        .values(**values)
        .returning(JobRow.state, JobRow.attempt)
        .execution_options(synchronize_session=False)
    ).first()
    if result is None:
        return None
    s.add(
        JobEventRow(
            job_id=job_id,
            at=at,
            to_state=to.value,
            attempt=result.attempt,
            actor=actor[:256],
            reason=reason[:2000],
        )
    )
    s.flush()
    row = s.get(JobRow, job_id, populate_existing=True)
    assert row is not None
    return _job(row)


def set_fields(s: Session, job_id: str, **changes: Any) -> None:
    """Update columns that are not the state (the executor handle, predictions)."""
    s.execute(
        update(JobRow)
        .where(JobRow.id == job_id)
        .values(**changes)
        .execution_options(synchronize_session=False)
    )


def request_stop(s: Session, job_id: str, what: str) -> bool:
    """Ask the job's scheduler to stop it (``cancel`` or ``preempt``) if it is admitted or
    running at this UPDATE; False if it is not (it ended, or went back to the queue)."""
    result = s.execute(
        update(JobRow)
        .where(
            JobRow.id == job_id,
            JobRow.state.in_((JobState.ADMITTED.value, JobState.RUNNING.value)),
        )
        .values(stop_request=what)
        .returning(JobRow.id)
        .execution_options(synchronize_session=False)
    ).first()
    return result is not None


def events(s: Session, job_id: str) -> list[JobEvent]:
    rows = s.scalars(
        select(JobEventRow).where(JobEventRow.job_id == job_id).order_by(JobEventRow.id)
    )
    result: list[JobEvent] = []
    previous: JobState | None = None
    for row in rows:
        to = JobState(row.to_state)
        result.append(
            JobEvent(row.job_id, row.at, previous, to, row.attempt, row.actor, row.reason)
        )
        previous = to
    return result


def lock_scheduling(s: Session) -> None:
    """Wait for the scheduling lock, held until this transaction ends.

    On PostgreSQL a transaction-scoped advisory lock, so claims of several scheduler
    processes take turns and each sees the capacity the others took; on SQLite the
    write transaction (``BEGIN IMMEDIATE``) already serializes writers.
    """
    if s.get_bind().dialect.name == "postgresql":
        s.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEDULING_LOCK})


# ---------------------------------------------------------------------- attempts
@dataclass(frozen=True, slots=True)
class Attempt:
    """One start of a job and the resources it held (the unit of cost)."""

    job_id: str
    attempt: int
    team: str
    user: str
    pool: str
    nodes: tuple[str, ...]
    cpu_milli: int
    memory_mib: int
    gpu_milli: int
    started_at: datetime
    ended_at: datetime | None
    outcome: str | None
    exit_code: int | None


def open_attempt(s: Session, attempt: Attempt) -> None:
    s.add(
        JobAttemptRow(
            job_id=attempt.job_id,
            attempt=attempt.attempt,
            team_name=attempt.team,
            user_id=attempt.user,
            pool=attempt.pool,
            nodes=",".join(attempt.nodes)[:1024],
            cpu_milli=attempt.cpu_milli,
            memory_mib=attempt.memory_mib,
            gpu_milli=attempt.gpu_milli,
            started_at=attempt.started_at,
        )
    )
    s.flush()


def close_attempt(
    s: Session, job_id: str, attempt: int, ended_at: datetime, outcome: str, exit_code: int | None
) -> None:
    """End an open attempt (no-op if it is already closed)."""
    s.execute(
        update(JobAttemptRow)
        .where(
            JobAttemptRow.job_id == job_id,
            JobAttemptRow.attempt == attempt,
            JobAttemptRow.ended_at.is_(None),
        )
        .values(ended_at=ended_at, outcome=outcome[:16], exit_code=exit_code)
        .execution_options(synchronize_session=False)
    )


def attempt_started(s: Session, job_id: str, attempt: int) -> datetime | None:
    row = s.get(JobAttemptRow, (job_id, attempt))
    return row.started_at if row is not None else None


def _attempt(row: JobAttemptRow) -> Attempt:
    return Attempt(
        row.job_id,
        row.attempt,
        row.team_name,
        row.user_id,
        row.pool,
        tuple(x for x in row.nodes.split(",") if x),
        row.cpu_milli,
        row.memory_mib,
        row.gpu_milli,
        row.started_at,
        row.ended_at,
        row.outcome,
        row.exit_code,
    )


def attempts_overlapping(
    s: Session, since: datetime, until: datetime, visible: Visibility
) -> list[Attempt]:
    """Attempts that ran at some time in [since, until) (open ones included)."""
    query = select(JobAttemptRow).where(
        JobAttemptRow.started_at < until,
        (JobAttemptRow.ended_at.is_(None)) | (JobAttemptRow.ended_at > since),
    )
    if visible is not None:
        query = query.where(JobAttemptRow.team_name.in_(sorted(visible)))
    return [_attempt(row) for row in s.scalars(query.order_by(JobAttemptRow.started_at))]


def attempts_of(s: Session, job_id: str) -> list[Attempt]:
    query = select(JobAttemptRow).where(JobAttemptRow.job_id == job_id)
    return [_attempt(row) for row in s.scalars(query.order_by(JobAttemptRow.attempt))]


def finished_runtimes(s: Session, limit: int = 5_000) -> list[tuple[Job, float]]:
    """Succeeded jobs with their total run time over all attempts, newest first.

    The runtime predictor's history.
    """
    rows = list(
        s.scalars(
            select(JobRow)
            .where(JobRow.state == JobState.SUCCEEDED.value)
            .order_by(JobRow.finished_at.desc())
            .limit(limit)
        )
    )
    seconds: dict[str, float] = defaultdict(float)
    for start in range(0, len(rows), 500):
        ids = [row.id for row in rows[start : start + 500]]
        query = select(JobAttemptRow).where(
            JobAttemptRow.job_id.in_(ids), JobAttemptRow.ended_at.is_not(None)
        )
        for attempt in s.scalars(query):
            assert attempt.ended_at is not None
            seconds[attempt.job_id] += (attempt.ended_at - attempt.started_at).total_seconds()
    return [(_job(row), seconds[row.id]) for row in rows]


def job_statuses(s: Session, ids: Collection[str]) -> dict[str, tuple[JobState, bool, str]]:
    """(state, whether it has ended for good, team name) of each job that exists.

    Ended for good: succeeded or cancelled, or failed or lost with no retry left.
    """
    query = select(
        JobRow.id, JobRow.state, JobRow.retries_used, JobRow.max_retries, JobRow.team_name
    )
    out: dict[str, tuple[JobState, bool, str]] = {}
    for job_id, raw, used, most, team in s.execute(query.where(JobRow.id.in_(sorted(ids)))):
        state = JobState(raw)
        retryable = state in (JobState.FAILED, JobState.LOST) and used < most
        final = state in (JobState.SUCCEEDED, JobState.CANCELLED, JobState.FAILED, JobState.LOST)
        out[job_id] = (state, final and not retryable, team)
    return out


def jobs_by_id(s: Session, ids: Collection[str]) -> list[Job]:
    """The jobs among ``ids`` that exist (any team: the caller has checked access)."""
    found: list[Job] = []
    ordered = sorted(ids)
    for start in range(0, len(ordered), 500):
        query = select(JobRow).where(JobRow.id.in_(ordered[start : start + 500]))
        found.extend(_job(row) for row in s.scalars(query))
    return found


def count_by_state(s: Session, visible: Visibility) -> Mapping[str, int]:
    query = select(JobRow.state, func.count()).group_by(JobRow.state)
    if visible is not None:
        query = query.where(JobRow.team_name.in_(sorted(visible)))
    return {state: int(n) for state, n in s.execute(query)}
