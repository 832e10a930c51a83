"""The scheduler's side of jobs: claim, start, end and requeue them, each step audited.

Every method is one transaction: a compare-and-set on the job's state, its event
row, its attempt row and its audit entry commit together or not at all. A scheduler
process names itself (``claimed_by``); it starts and ends only the jobs it claimed,
so two scheduler processes never run one job twice. Each scheduler also beats a heartbeat;
the jobs of one silent for longer than its lease are adopted by a live one
(:meth:`JobLifecycle.adopt_orphans`), so no job is forgotten when its scheduler never returns.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from shamal.clock import Clock, utc_now
from shamal.db import Database
from shamal.events import emit
from shamal.jobs import ACTIVE_STATES, Job, JobState, job_finished
from shamal.jobs import store as _store
from shamal.scheduler.live import _store as _leases
from shamal.security import AuditLog

logger = logging.getLogger(__name__)

REQUEUE_STATES = frozenset({JobState.PREEMPTED, JobState.FAILED, JobState.LOST})
#: Where a job ends for good once no retry requeues it.
ENDED_STATES = frozenset({JobState.SUCCEEDED, JobState.CANCELLED, JobState.FAILED, JobState.LOST})


class JobLifecycle:
    """State changes the scheduler loop makes, as scheduler ``name``."""

    def __init__(self, db: Database, audit: AuditLog, name: str, clock: Clock = utc_now) -> None:
        self._db = db
        self._audit = audit
        self.name = name
        self.actor = f"scheduler:{name}"
        self._clock = clock

    def now(self) -> datetime:
        return self._clock()

    def _record(self, s: Session, job: Job, **detail: Any) -> None:
        self._audit.append(
            s,
            actor=self.actor,
            action=f"job.{job.state.value}",
            target=f"job:{job.id}",
            outcome="ok",
            detail={"attempt": job.attempt, "reason": job.reason[:200], **detail},
        )

    # ------------------------------------------------------------------ reads
    def pending(self) -> tuple[list[Job], list[Job]]:
        """(queued jobs, jobs holding resources) in one consistent read."""
        with self._db.unit_of_work(write=False) as s:
            jobs = _store.jobs_in_states(s, {JobState.QUEUED, *ACTIVE_STATES})
        queued = [job for job in jobs if job.state is JobState.QUEUED]
        return queued, [job for job in jobs if job.state in ACTIVE_STATES]

    def mine(self) -> list[Job]:
        """Jobs this scheduler claimed that still hold resources (what restart recovers)."""
        _, active = self.pending()
        return [job for job in active if job.claimed_by == self.name]

    def get(self, job_id: str) -> Job:
        with self._db.unit_of_work(write=False) as s:
            return _store.get_job(s, job_id)

    def attempts_since(self, since: datetime) -> list[_store.Attempt]:
        """Every attempt that ran at some time after ``since`` (running ones included)."""
        now = self._clock()
        with self._db.unit_of_work(write=False) as s:
            return _store.attempts_overlapping(s, since, now, None)

    def history(self, limit: int = 5_000) -> list[tuple[Job, float]]:
        with self._db.unit_of_work(write=False) as s:
            return _store.finished_runtimes(s, limit)

    # ------------------------------------------------------------------ leases
    def heartbeat(self) -> None:
        """Tell the other schedulers this one is alive."""
        now = self._clock()
        self._db.run(lambda s: _leases.beat(s, self.name, socket.gethostname(), now))

    def adopt_orphans(self, lease_s: float) -> list[Job]:
        """Claim the active jobs of every scheduler silent for over ``lease_s`` seconds.

        Runs under the scheduling lock, so of several live schedulers exactly one adopts each
        job; each adoption is audited (``job.adopted``). The caller then treats the jobs as
        its own after a restart: re-attach, or declare lost.
        """
        now = self._clock()

        def work(s: Session) -> list[Job]:
            _store.lock_scheduling(s)
            silent = _leases.silent_claimers(s, self.name, now, lease_s)
            if not silent:
                return []
            adopted: list[Job] = []
            for job_id, previous in _leases.adopt(s, list(silent), self.name):
                job = _store.get_job(s, job_id)
                last = silent.get(previous)
                self._audit.append(
                    s,
                    actor=self.actor,
                    action="job.adopted",
                    target=f"job:{job.id}",
                    outcome="ok",
                    detail={
                        "attempt": job.attempt,
                        "state": job.state.value,
                        "from": previous,
                        "lease_s": lease_s,
                        "last_heartbeat": None if last is None else last.isoformat(),
                    },
                )
                adopted.append(job)
            return adopted

        return self._db.run(work)

    # ------------------------------------------------------------------ changes
    def admit(
        self,
        job_id: str,
        placement: Mapping[str, Any],
        reason: str,
        fits: Callable[[Sequence[Job]], bool] | None = None,
    ) -> Job | None:
        """Claim a queued job for this scheduler; None if it cannot have it.

        Runs under the scheduling lock: claims of several scheduler processes take
        turns. ``fits`` is asked, under the lock, whether the placement still fits next
        to every job holding resources now (another scheduler may have claimed capacity
        since this one decided); None is returned when it does not, or when the job is
        no longer queued.
        """
        now = self._clock()

        def work(s: Session) -> Job | None:
            _store.lock_scheduling(s)
            if fits is not None and not fits(_store.jobs_in_states(s, ACTIVE_STATES)):
                return None
            current = _store.get_job(s, job_id)
            job = _store.transition(
                s,
                job_id,
                JobState.QUEUED,
                JobState.ADMITTED,
                at=now,
                actor=self.actor,
                reason=reason,
                claimed_by=self.name,
                placement=dict(placement),
                attempt=current.attempt + 1,
                stop_request=None,
            )
            if job is not None:
                self._record(s, job, placement=dict(placement))
            return job

        return self._db.run(work)

    def started(self, job: Job, handle: Mapping[str, Any], attempt: _store.Attempt) -> Job | None:
        """The executor launched it: running, with its handle and an open attempt."""
        now = self._clock()

        def work(s: Session) -> Job | None:
            done = _store.transition(
                s,
                job.id,
                JobState.ADMITTED,
                JobState.RUNNING,
                at=now,
                actor=self.actor,
                reason=f"started on {', '.join(attempt.nodes)}",
                handle=dict(handle),
                started_at=job.started_at or now,
            )
            if done is not None:
                _store.open_attempt(s, attempt)
                self._record(s, done, nodes=list(attempt.nodes))
            return done

        return self._db.run(work)

    def set_handle(self, job_id: str, handle: Mapping[str, Any]) -> None:
        def work(s: Session) -> None:
            _store.set_fields(s, job_id, handle=dict(handle))

        self._db.run(work)

    def ended(
        self,
        job: Job,
        outcome: JobState,
        *,
        reason: str,
        exit_code: int | None = None,
    ) -> Job | None:
        """An attempt ended with ``outcome``; requeue it when the rules say so.

        Preempted jobs always go back to the queue (preemption never uses up a retry);
        failed and lost ones while they have retries left. None if the job was not
        in an active state any more (another path ended it first).
        """
        now = self._clock()

        def work(s: Session) -> Job | None:
            current = _store.get_job(s, job.id)
            if current.state not in ACTIVE_STATES:
                return None
            started = _store.attempt_started(s, job.id, current.attempt)
            ran_s = (now - started).total_seconds() if started is not None else 0.0
            done = _store.transition(
                s,
                job.id,
                current.state,
                outcome,
                at=now,
                actor=self.actor,
                reason=reason,
                exit_code=exit_code,
                attained_s=current.attained_s + max(ran_s, 0.0),
                preemptions=current.preemptions + (outcome is JobState.PREEMPTED),
                handle=None,
                stop_request=None,
                finished_at=now,
            )
            assert done is not None  # the state was read in this transaction
            _store.close_attempt(s, job.id, current.attempt, now, outcome.value, exit_code)
            self._record(s, done, exit_code=exit_code)
            final = self._maybe_requeue(s, done, now)
            if final.state in ENDED_STATES:
                emit(s, job_finished(final, self.actor))
            return final

        return self._db.run(work)

    def _maybe_requeue(self, s: Session, job: Job, now: datetime) -> Job:
        if job.state not in REQUEUE_STATES:
            return job
        retry = job.state is not JobState.PREEMPTED
        if retry and job.retries_used >= job.max_retries:
            return job
        requeued = _store.transition(
            s,
            job.id,
            job.state,
            JobState.QUEUED,
            at=now,
            actor=self.actor,
            reason=(
                f"retry {job.retries_used + 1} of {job.max_retries}"
                if retry
                else "requeued after preemption"
            ),
            retries_used=job.retries_used + retry,
            claimed_by=None,
            placement=None,
            finished_at=None,
        )
        assert requeued is not None
        self._record(s, requeued)
        return requeued

    def unclaim(self, job: Job, reason: str) -> Job | None:
        """Give an admitted job that never started back to the queue."""
        now = self._clock()

        def work(s: Session) -> Job | None:
            done = _store.transition(
                s,
                job.id,
                JobState.ADMITTED,
                JobState.QUEUED,
                at=now,
                actor=self.actor,
                reason=reason,
                claimed_by=None,
                placement=None,
                attempt=max(job.attempt - 1, 0),
            )
            if done is not None:
                self._record(s, done)
            return done

        return self._db.run(work)
