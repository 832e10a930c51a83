"""Carrying a run's decisions out: starting steps as jobs (or from the cache), following
their jobs to the end, and closing the run.

Every change is a compare-and-set on the step's record, and a step's job id is chosen and
written before the job is submitted (the job service treats a second submission with that
id as the first), so a server that dies at any point and starts again, or two servers
sharing a database, never start a step twice and forget none.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from shamal.clock import Clock
from shamal.db import Database
from shamal.errors import Conflict, InvalidParameter, NotFound, ShamalError
from shamal.events import EventKind, NewEvent, emit
from shamal.jobs import Job, JobService, JobSpec, JobState
from shamal.pipelines import _store
from shamal.pipelines._cache import cache_key, explain_miss
from shamal.pipelines._definitions import PipelineSpec, StepSpec
from shamal.pipelines._engine import (
    ACTIVE,
    RunState,
    Settle,
    Start,
    StepRecord,
    StepState,
    advance,
    run_state,
)
from shamal.pipelines._entities import CACHED_FROM_RUN_TAG, PipelineInfo, PipelineRun, StepRun
from shamal.security import AuditContext, SecurityService
from shamal.tracking import LoggedData, TrackingService

logger = logging.getLogger(__name__)

#: The command every step's job runs: the runner imports the step from the code snapshot.
RUNNER = ("python", "-m", "shamal.pipelines.runner")
#: At most this many passes over one run per call: each pass carries out what the last one
#: made possible (a cached step lets the next one start at once).
MAX_PASSES = 50
PARENT_RUN_TAG = "mlflow.parentRunId"


@dataclass(frozen=True, slots=True)
class Services:
    """What carrying decisions out needs from the rest of the platform."""

    db: Database
    security: SecurityService
    jobs: JobService
    tracking: TrackingService
    clock: Clock
    environment: Mapping[str, str]
    max_map_items: int
    #: Resolves ``NAME[@ALIAS]`` to ``NAME/NUMBER`` as the run's user may read it.
    resolve_dataset: Any


def _records(steps: Sequence[StepRun]) -> dict[str, StepRecord]:
    return {
        s.key: StepRecord(s.key, s.name, s.index, StepState(s.state), s.output, s.reason)
        for s in steps
    }


class RunAdvancer:
    """Moves runs on; one per server process (``owner`` names it in leases)."""

    def __init__(self, services: Services, owner: str, lease: timedelta) -> None:
        self._s = services
        self._owner = owner
        self._lease = lease
        # The lease keeps other processes out; within this one, the loop and a request
        # that starts a run must not carry the same run's decisions out at once.
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    # ------------------------------------------------------------------ the loop
    def advance_all(self) -> int:
        """One pass over every running run this process can lease; how many it moved."""
        with self._s.db.unit_of_work(write=False) as s:
            ids = _store.active_run_ids(s)
        moved = 0
        for run_id in ids:
            try:
                moved += self.advance(run_id)
            except Exception:  # one broken run must not stop the others
                logger.exception("pipeline run %s could not advance", run_id)
        return moved

    def advance(self, run_id: str) -> int:
        """Move ``run_id`` as far as it goes now; the number of changes made."""
        with self._guard:
            lock = self._locks.setdefault(run_id, threading.Lock())
        if not lock.acquire(blocking=False):
            return 0  # this process is moving it already
        try:
            return self._advance(run_id)
        finally:
            lock.release()
            with self._guard:
                self._locks.pop(run_id, None)

    def _advance(self, run_id: str) -> int:
        if not self._claim(run_id):
            return 0
        try:
            return self._carry_out(run_id)
        finally:
            # The lease is held only while a pass runs: a process killed between passes
            # (most of a run's life, while its steps' jobs run) leaves nothing for its
            # successor to wait out; one killed mid-pass leaves at most the lease.
            self._s.db.run(lambda s: _store.release_run(s, run_id, self._owner))

    def _claim(self, run_id: str) -> bool:
        """Take the run's lease: free, expired, or held by a process of this host that is
        gone (a server killed mid-pass and started again takes its runs on at once)."""
        now = self._s.clock()
        if self._s.db.run(lambda s: _store.claim_run(s, run_id, self._owner, now, self._lease)):
            return True
        with self._s.db.unit_of_work(write=False) as s:
            holder = _store.lease_owner(s, run_id)
        if holder is None or not owner_is_gone(holder):
            return False
        logger.info("pipeline run %s: its lease holder %s is gone; taking it on", run_id, holder)
        return bool(
            self._s.db.run(
                lambda s: _store.claim_run(
                    s, run_id, self._owner, now, self._lease, dead_owner=holder
                )
            )
        )

    def _carry_out(self, run_id: str) -> int:
        with self._s.db.unit_of_work(write=False) as s:
            run = _store.get_run(s, run_id)
            info = _store.get_pipeline(s, run.pipeline, run.version)
        spec = PipelineSpec.from_json(info.spec)
        ctx = self._context(run)
        changes = self._follow_jobs(ctx, run)
        # The run is read again only after something was written: a pass that changes
        # nothing (most passes of a long fan-out, while its steps run) reads it once.
        stale = changes > 0
        for _ in range(MAX_PASSES):
            if stale:
                run = self._reload(run_id)
            records = _records(run.steps)
            moved = self._resume_unsubmitted(ctx, info, spec, run)
            decisions = advance(spec, run.params, records, max_map_items=self._s.max_map_items)
            for decision in decisions:
                if isinstance(decision, Settle):
                    moved += self._settle(ctx, run, decision)
                else:
                    moved += self._start(ctx, info, spec, run, decision)
            changes += moved
            stale = bool(decisions) or moved > 0
            if not decisions:
                break
        self._close_if_done(ctx, spec, self._reload(run_id) if stale else run)
        return changes

    def _reload(self, run_id: str) -> PipelineRun:
        with self._s.db.unit_of_work(write=False) as s:
            return _store.get_run(s, run_id)

    def _context(self, run: PipelineRun) -> AuditContext:
        """The run's steps act as its user, with a job's reach."""
        principal = self._s.security.principal_of(run.user)
        return AuditContext(
            action="pipeline.step", actor=f"pipeline:{run.pipeline}", principal=principal
        )

    # ------------------------------------------------------------------ decisions
    def _settle(self, ctx: AuditContext, run: PipelineRun, decision: Settle) -> int:
        now = self._s.clock()
        final = decision.state not in ACTIVE
        values: dict[str, Any] = {"state": decision.state.value, "reason": decision.reason}
        if final:
            values["finished_at"] = now
        if decision.output is not None:
            values["output"] = decision.output

        def work(s: Session) -> bool:
            if _store.insert_step(
                s,
                run.id,
                decision.key,
                name=decision.name,
                index=None,
                args={},
                now=now,
                fan_out=decision.fan_out,
                **values,
            ):
                return True
            return _store.move_step(s, run.id, decision.key, [StepState.RUNNING.value], **values)

        changed = self._s.db.run(work)
        if changed and final:
            logger.info(
                "pipeline run %s: %s %s %s", run.id, decision.key, decision.state, decision.reason
            )
        return int(changed)

    def _start(
        self,
        ctx: AuditContext,
        info: PipelineInfo,
        spec: PipelineSpec,
        run: PipelineRun,
        decision: Start,
    ) -> int:
        step = spec.step(decision.name)
        now = self._s.clock()
        try:
            args = dict(decision.args)
            for arg, ref in decision.datasets.items():
                args[arg] = self._s.resolve_dataset(ctx, ref)
        except ShamalError as exc:
            return self._settle(
                ctx,
                run,
                Settle(decision.key, decision.name, StepState.FAILED, reason=f"{exc}"[:500]),
            )
        key = cache_key(
            snapshot=info.snapshot,
            target=_target(step),
            args=args,
            env=step.env,
            environment=self._s.environment,
        )
        if step.cache:
            with self._s.db.unit_of_work(write=False) as s:
                hit = _store.cached(s, key.key)
                previous = _store.last_cache_parts(s, run.pipeline, step.name)
            if hit is not None:
                return self._from_cache(ctx, run, decision, args, key.key, hit)
            note = explain_miss(previous, key.parts)
        else:
            note = "caching is off for this step"
        job_id = uuid.uuid4().hex

        def work(s: Session) -> bool:
            return _store.insert_step(
                s,
                run.id,
                decision.key,
                name=decision.name,
                index=decision.index,
                state=StepState.SUBMITTING.value,
                args=args,
                now=now,
                job_id=job_id,
                cache_key=key.key,
                cache_parts=dict(key.parts),
                cache_note=note,
            )

        if not self._s.db.run(work):
            return 0
        with self._s.db.unit_of_work(write=False) as s:
            record = _store.get_step(s, run.id, decision.key)
        self._submit(ctx, info, step, run, record)
        return 1

    def _producer_run(self, source: str) -> str | None:
        """The tracking run of the step that made a cached result (``RUN/STEP``), if it is
        still recorded."""
        run_id, _, key = source.partition("/")
        try:
            with self._s.db.unit_of_work(write=False) as s:
                return _store.get_step(s, run_id, key).mlflow_run_id
        except NotFound:
            return None

    def _from_cache(
        self,
        ctx: AuditContext,
        run: PipelineRun,
        decision: Start,
        args: dict[str, Any],
        key: str,
        hit: tuple[Any, str],
    ) -> int:
        output, source = hit
        now = self._s.clock()
        tags = {"shamal.pipeline.cached_from": source}
        producer = self._producer_run(source)
        if producer is not None:
            # The lineage graph's "reused" edge: from the run that made the result to this one.
            tags[CACHED_FROM_RUN_TAG] = producer
        nested = self._nested_run(ctx, run, decision.key, tags, finished=True)

        def work(s: Session) -> bool:
            return _store.insert_step(
                s,
                run.id,
                decision.key,
                name=decision.name,
                index=decision.index,
                state=StepState.CACHED.value,
                args=args,
                now=now,
                output=output,
                cache_key=key,
                cached_from=source,
                cache_note=f"reused the result of {source}",
                mlflow_run_id=nested,
                started_at=now,
                finished_at=now,
            )

        return int(self._s.db.run(work))

    def _resume_unsubmitted(
        self, ctx: AuditContext, info: PipelineInfo, spec: PipelineSpec, run: PipelineRun
    ) -> int:
        """Submit steps whose record was written but whose job may not have been (a server
        that stopped in between): the job id makes a second submission harmless."""
        count = 0
        for record in run.steps:
            if record.state == StepState.SUBMITTING.value and record.job_id:
                self._submit(ctx, info, spec.step(record.name), run, record)
                count += 1
        return count

    def _submit(
        self,
        ctx: AuditContext,
        info: PipelineInfo,
        step: StepSpec,
        run: PipelineRun,
        record: StepRun,
    ) -> None:
        assert record.job_id is not None
        nested = record.mlflow_run_id or self._nested_run(ctx, run, record.key, {})
        call = {
            "run": run.id,
            "key": record.key,
            "function": step.function,
            "command": list(step.command) if step.command else None,
            "args": dict(record.args),
        }
        env = {**step.env, "PIPELINE_STEP": json.dumps(call)}
        if nested is not None and run.experiment_id is not None:
            env.update(MLFLOW_RUN_ID=nested, MLFLOW_EXPERIMENT_ID=run.experiment_id)
        job = JobSpec(
            command=RUNNER,
            name=f"{run.pipeline}.{record.key}"[:120],
            team=step.team or run.team or None,
            cpus=step.cpus,
            memory_mib=step.memory_mib,
            gpus=step.gpus,
            pool=step.pool,
            time_limit_s=step.time_limit_s,
            retries=step.retries,
            env=env,
            snapshot=info.snapshot,
            datasets=_datasets_read(record.args, step),
            executor=step.executor,
            id=record.job_id,
        )
        try:
            self._s.jobs.submit(ctx, job)
        except ShamalError as exc:
            self._fail(run, record.key, StepState.SUBMITTING, f"its job was refused: {exc}")
            return
        self._s.db.run(
            lambda s: _store.move_step(
                s,
                run.id,
                record.key,
                [StepState.SUBMITTING.value],
                state=StepState.RUNNING.value,
                mlflow_run_id=nested,
            )
        )

    def _fail(self, run: PipelineRun, key: str, state: StepState, reason: str) -> None:
        now = self._s.clock()
        self._s.db.run(
            lambda s: _store.move_step(
                s,
                run.id,
                key,
                [state.value],
                state=StepState.FAILED.value,
                reason=reason[:2000],
                finished_at=now,
            )
        )

    # ------------------------------------------------------------------ jobs
    def _follow_jobs(self, ctx: AuditContext, run: PipelineRun) -> int:
        running = {
            r.job_id: r for r in run.steps if r.state == StepState.RUNNING.value and r.job_id
        }
        if not running:
            return 0
        jobs = self._s.jobs.jobs_of(list(running))
        changes = 0
        for job_id, record in running.items():
            job = jobs.get(job_id)
            if job is None:
                self._fail(run, record.key, StepState.RUNNING, "its job is gone")
                changes += 1
            elif _ended_for_good(job):
                changes += self._job_ended(ctx, run, record, job)
            elif job.started_at is not None and record.started_at is None:
                self._mark_started(run.id, record.key, job.started_at)
        return changes

    def _mark_started(self, run_id: str, key: str, at: datetime) -> None:
        def work(s: Session) -> bool:
            return _store.move_step(s, run_id, key, [StepState.RUNNING.value], started_at=at)

        self._s.db.run(work)

    def _job_ended(self, ctx: AuditContext, run: PipelineRun, record: StepRun, job: Job) -> int:
        now = self._s.clock()
        if job.state is JobState.SUCCEEDED:
            state, reason = StepState.SUCCEEDED, ""
        elif job.state is JobState.CANCELLED:
            state, reason = StepState.CANCELLED, "its job was cancelled"
        else:
            state = StepState.FAILED
            reason = f"its job {job.state.value}: {job.reason}"[:2000]

        def work(s: Session) -> bool:
            moved = _store.move_step(
                s,
                run.id,
                record.key,
                [StepState.RUNNING.value],
                state=state.value,
                reason=reason,
                started_at=job.started_at or record.started_at,
                finished_at=job.finished_at or now,
            )
            if moved and state is StepState.SUCCEEDED and record.cache_key and record.cache_parts:
                _store.keep(
                    s,
                    record.cache_key,
                    pipeline=run.pipeline,
                    step=record.name,
                    parts=dict(record.cache_parts),
                    output=record.output,
                    source=f"{run.id}/{record.key}",
                    now=now,
                )
            return moved

        moved = self._s.db.run(work)
        if moved and record.mlflow_run_id:
            self._end_tracking(ctx, record.mlflow_run_id, state is StepState.SUCCEEDED)
        return int(moved)

    # ------------------------------------------------------------------ tracking
    def _nested_run(
        self,
        ctx: AuditContext,
        run: PipelineRun,
        key: str,
        tags: Mapping[str, str],
        *,
        finished: bool = False,
    ) -> str | None:
        """The step's run in MLflow, nested under the pipeline run's (None: no parent)."""
        if run.experiment_id is None or run.mlflow_run_id is None:
            return None
        try:
            nested = self._s.tracking.create_run(
                ctx,
                run.experiment_id,
                key,
                None,
                {
                    PARENT_RUN_TAG: run.mlflow_run_id,
                    "shamal.pipeline": run.pipeline,
                    "shamal.pipeline.run": run.id,
                    **tags,
                },
            )
            if finished:
                self._end_tracking(ctx, nested.info.run_id, True)
            return nested.info.run_id
        except ShamalError as exc:
            logger.warning("pipeline run %s: no tracking run for %s: %s", run.id, key, exc)
            return None

    def _end_tracking(self, ctx: AuditContext, mlflow_run_id: str, ok: bool) -> None:
        try:
            self._s.tracking.update_run(
                ctx,
                mlflow_run_id,
                status="FINISHED" if ok else "FAILED",
                end_time=self._s.tracking.now_ms(),
                run_name=None,
            )
        except (NotFound, InvalidParameter, Conflict) as exc:
            logger.info("tracking run %s not closed: %s", mlflow_run_id, exc)

    # ------------------------------------------------------------------ the end
    def _close_if_done(self, ctx: AuditContext, spec: PipelineSpec, run: PipelineRun) -> None:
        records = _records(run.steps)
        state = run_state(spec, records)
        if state is RunState.RUNNING:
            return
        failed = [r for r in run.steps if r.state in ("failed", "cancelled") and r.reason]
        reason = f"{failed[0].key}: {failed[0].reason}" if failed else ""
        now = self._s.clock()
        if not self._s.db.run(lambda s: finish(s, run, state, reason, now)):
            return
        logger.info("pipeline run %s %s", run.id, state.value)
        if run.mlflow_run_id:
            if state is not RunState.SUCCEEDED:
                self._log_reason(ctx, run.mlflow_run_id, reason)
            self._end_tracking(ctx, run.mlflow_run_id, state is RunState.SUCCEEDED)

    def _log_reason(self, ctx: AuditContext, mlflow_run_id: str, reason: str) -> None:
        principal = ctx.require_principal()
        try:
            self._s.tracking.log(
                principal,
                mlflow_run_id,
                LoggedData(tags=[("shamal.pipeline.reason", reason[:4000])]),
            )
        except ShamalError as exc:
            logger.info("tracking run %s: reason not logged: %s", mlflow_run_id, exc)


def finish(s: Session, run: PipelineRun, state: RunState, reason: str, now: datetime) -> bool:
    """End ``run`` (if it still runs), announcing it on the event stream in the same
    transaction."""
    if not _store.finish_run(s, run.id, state.value, reason, now):
        return False
    payload = {
        "pipeline": run.pipeline,
        "run_id": run.id,
        "state": state.value,
        "version": run.version,
    }
    emit(
        s,
        NewEvent(
            EventKind.PIPELINE_RUN_FINISHED,
            f"pipelines:/{run.pipeline}/{run.id}",
            run.team or None,
            run.user,
            payload,
        ),
    )
    return True


def lease_owner_name() -> str:
    """This process's name in leases: ``HOST:PID:NONCE`` (the nonce keeps two advancers of
    one process, or a pid reused later, apart)."""
    return f"{socket.gethostname()[:32]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def owner_is_gone(owner: str) -> bool:
    """Whether the lease holder ``owner`` (see :func:`lease_owner_name`) is a process of
    this host that no longer exists. Anything else (another host, a live or reused pid, a
    name of another shape) counts as alive: its lease is waited out."""
    parts = owner.rsplit(":", 2)
    if len(parts) != 3 or parts[0] != socket.gethostname()[:32] or not parts[1].isdigit():
        return False
    pid = int(parts[1])
    if pid == os.getpid() or pid <= 1:
        return False
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return True
    except OSError:  # it exists, as another user's
        return False
    return False


def _ended_for_good(job: Job) -> bool:
    if job.state in (JobState.SUCCEEDED, JobState.CANCELLED):
        return True
    return job.state in (JobState.FAILED, JobState.LOST) and job.retries_used >= job.max_retries


def _target(step: StepSpec) -> str:
    return step.function or json.dumps(list(step.command or ()))


def _datasets_read(args: Mapping[str, Any], step: StepSpec) -> tuple[str, ...]:
    """The dataset versions a step was handed: its job runs where their residency allows."""
    return tuple(
        str(args[name]) for name, ref in step.args.items() if ref.kind == "dataset" and name in args
    )
