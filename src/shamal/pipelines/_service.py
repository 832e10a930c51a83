"""Pipelines under the platform's rules: register, run, follow, cancel, retry.

A pipeline belongs to a team; its members run it and read its runs, each step is a job of
that team (or of the step's own team, which its registrant must be in), submitted as the
user who started the run. Runs started by triggers act as the user who registered the
pipeline's newest version, with a job's reach (:meth:`SecurityService.principal_of`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import platform as host
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

from sqlalchemy.orm import Session

from shamal.clock import Clock, utc_now
from shamal.db import Database, is_unique_violation
from shamal.errors import Conflict, InvalidParameter, NotFound, PermissionDenied, ShamalError
from shamal.jobs import JobService, LogChunk
from shamal.pipelines import _store
from shamal.pipelines._advance import RunAdvancer, Services, finish, lease_owner_name
from shamal.pipelines._definitions import (
    MAX_MAP_ITEMS,
    PipelineSpec,
    check_name,
    check_value,
)
from shamal.pipelines._engine import ACTIVE, DONE, RunState, StepState, check_condition, downstream
from shamal.pipelines._entities import PipelineInfo, PipelineRun, StepRun
from shamal.security import AuditContext, AuditLog, Principal, Role, SecurityService
from shamal.tracking import LoggedData, TrackingService

logger = logging.getLogger(__name__)

MAX_LIST = 1000
EXPERIMENT_PREFIX = "pipelines/"
#: What a step's result depends on besides its code and inputs.
ENVIRONMENT = {"python": host.python_version(), "runner": "1"}


def _visibility(principal: Principal) -> _store.Visibility:
    return None if principal.user.is_admin else frozenset(principal.roles)


class PipelineService:
    """Pipelines, their runs and steps. Thread-safe; one per process.

    Args:
        check_trigger: raises InvalidParameter for a trigger that cannot work (an event
            filter that does not parse, a schedule that is not a cron expression).
        resolve_dataset: ``(ctx, "NAME[@ALIAS]") -> "NAME/NUMBER"`` as the context's
            principal may read it.
    """

    def __init__(  # noqa: PLR0913 - the services it uses, then keyword-only parts
        self,
        db: Database,
        audit: AuditLog,
        security: SecurityService,
        jobs: JobService,
        tracking: TrackingService,
        *,
        resolve_dataset: Callable[[AuditContext, str], str],
        check_trigger: Callable[[Mapping[str, Any]], None] | None = None,
        clock: Clock = utc_now,
        max_map_items: int = MAX_MAP_ITEMS,
        lease: timedelta = timedelta(seconds=60),
    ) -> None:
        self._db = db
        self._audit = audit
        self._security = security
        self._jobs = jobs
        self._tracking = tracking
        self._check_trigger = check_trigger
        self._clock = clock
        owner = lease_owner_name()
        self.advancer = RunAdvancer(
            Services(
                db,
                security,
                jobs,
                tracking,
                clock,
                ENVIRONMENT,
                max_map_items,
                resolve_dataset,
            ),
            owner,
            lease,
        )

    # ------------------------------------------------------------------ definitions
    def register(
        self, ctx: AuditContext, spec: PipelineSpec, snapshot: str | None = None
    ) -> tuple[PipelineInfo, bool]:
        """Store ``spec`` (and the code snapshot its steps run) as the pipeline's next
        version; the same definition and code again changes nothing.

        Raises:
            InvalidParameter: an invalid pipeline, rule or trigger, a step naming an
                executor the server does not run, or an unknown snapshot.
            NotFound / PermissionDenied: a team the caller is not a member of; a pipeline
                of that name owned by another team.
        """
        principal = ctx.require_principal()
        spec = spec.validated()
        team, team_id = self._security.owning_team(principal, spec.team, "owns this pipeline")
        for step in spec.steps:
            if step.team is not None:
                self._security.authorize_team(principal, step.team, Role.MEMBER)
            if step.when is not None:
                self._check_rule(step.name, step.when)
        self._check_executors(spec)
        for trigger in spec.triggers:
            if self._check_trigger is not None:
                self._check_trigger(trigger.to_json())
        if snapshot is not None and not self._jobs.has_snapshot(principal, snapshot, team or None):
            raise InvalidParameter(
                f"no code snapshot {snapshot[:16]}... of team {team!r}: upload the folder first"
            )
        self._same_team(principal, spec.name, team)
        now = self._clock()
        ctx.target = f"pipeline:{spec.name}"

        def work(s: Session) -> tuple[PipelineInfo, bool]:
            info, created = _store.register(
                s,
                spec=spec.to_json(),
                digest=spec.digest,
                snapshot=snapshot,
                team=(team_id, team),
                user=principal.name,
                now=now,
            )
            if created:
                self._audit.record(
                    s,
                    ctx,
                    ctx.target,
                    version=info.version,
                    digest=info.digest,
                    steps=len(spec.steps),
                )
            return info, created

        return self._db.run(work)

    def _check_executors(self, spec: PipelineSpec) -> None:
        """A step naming an executor the server does not run is refused now, not when its
        job is submitted halfway through a run."""
        for step in spec.steps:
            try:
                self._jobs.check_executor(step.executor)
            except InvalidParameter as exc:
                raise InvalidParameter(f"step {step.name!r}: {exc.message}") from None

    def _check_rule(self, step: str, rule: str) -> None:
        try:
            check_condition(rule)
        except InvalidParameter as exc:
            raise InvalidParameter(f"step {step!r}: when: {exc}") from None

    def _same_team(self, principal: Principal, name: str, team: str) -> None:
        with self._db.unit_of_work(write=False) as s:
            try:
                existing = _store.get_pipeline(s, name)
            except NotFound:
                return
        if existing.team != team and not principal.user.is_admin:
            raise PermissionDenied(f"pipeline {name!r} belongs to another team; pick another name")

    def get(self, principal: Principal, name: str, version: int | None = None) -> PipelineInfo:
        check_name("pipeline", name)
        with self._db.unit_of_work(write=False) as s:
            info = _store.get_pipeline(s, name, version)
        self._allow(principal, info.team, Role.VIEWER, f"pipeline {name!r}")
        return info

    def list_pipelines(self, principal: Principal) -> list[PipelineInfo]:
        with self._db.unit_of_work(write=False) as s:
            return _store.list_pipelines(s, _visibility(principal))

    @staticmethod
    def _allow(principal: Principal, team: str, needed: Role, what: str) -> None:
        """NotFound (existence hidden) unless the principal holds ``needed`` in ``team``."""
        if principal.user.is_admin or (not team and needed <= Role.VIEWER):
            return
        if team not in principal.roles:
            raise NotFound(f"{what} does not exist")
        principal.require_team_role(team, needed)

    # ------------------------------------------------------------------ runs
    def start(
        self,
        ctx: AuditContext,
        name: str,
        params: Mapping[str, Any] | None = None,
        *,
        trigger: str | None = None,
        trigger_key: str | None = None,
        advance: bool = True,
        with_run: Callable[[Session], bool] | None = None,
    ) -> PipelineRun | None:
        """Start a run of the pipeline's newest version; None when ``trigger_key`` (an
        event, a schedule's tick) already started one, or when ``with_run`` (work done in the
        transaction that records the run, such as moving a schedule's tick) says False.

        Raises:
            InvalidParameter: an unknown parameter, a missing or oversized value.
        """
        principal = ctx.require_principal()
        info = self.get(principal, name)
        self._allow(principal, info.team, Role.MEMBER, f"pipeline {name!r}")
        spec = PipelineSpec.from_json(info.spec)
        values = _params(spec, params or {})
        run = PipelineRun(
            id=uuid.uuid4().hex,
            pipeline=name,
            version=info.version,
            params=values,
            state=RunState.RUNNING.value,
            trigger=(trigger or f"started by {principal.name}")[:300],
            user=principal.name,
            team=info.team,
            retry_of=None,
            experiment_id=None,
            mlflow_run_id=None,
            reason="",
            created_at=self._clock(),
            finished_at=None,
        )
        if trigger_key is not None and self._started_by(name, trigger_key):
            return None
        # The tracking runs exist before the run does: the loop may move it at once.
        run = self._open_tracking(ctx, run)
        if not self._insert_run(ctx, run, trigger_key, with_run=with_run):
            self._close_orphan(ctx, run)
            return None
        if advance:
            self.advancer.advance(run.id)
        return self.get_run(principal, run.id)

    def _insert_run(
        self,
        ctx: AuditContext,
        run: PipelineRun,
        trigger_key: str | None,
        copied: Sequence[StepRun] = (),
        *,
        with_run: Callable[[Session], bool] | None = None,
    ) -> bool:
        ctx.target = f"pipeline-run:{run.id}"

        def work(s: Session) -> None:
            _store.insert_run(s, run, trigger_key)
            if with_run is not None and not with_run(s):
                raise _NotThisRun
            for step in copied:
                _store.insert_step(
                    s,
                    run.id,
                    step.key,
                    name=step.name,
                    index=step.index,
                    state=StepState.CACHED.value,
                    args=dict(step.args),
                    now=run.created_at,
                    output=step.output,
                    cache_key=step.cache_key,
                    fan_out=step.fan_out,
                    cached_from=f"{run.retry_of}/{step.key}",
                    cache_note=f"reused from run {run.retry_of}",
                    started_at=run.created_at,
                    finished_at=run.created_at,
                )
            self._audit.record(
                s, ctx, ctx.target, pipeline=run.pipeline, version=run.version, trigger=run.trigger
            )

        try:
            self._db.run(work)
        except _NotThisRun:
            return False
        except Exception as exc:
            if trigger_key is not None and is_unique_violation(exc):
                return False
            raise
        return True

    def _close_orphan(self, ctx: AuditContext, run: PipelineRun) -> None:
        """The tracking run of a run that was not recorded after all (another server
        started it first) ends as KILLED rather than running for ever."""
        if run.mlflow_run_id is None:
            return
        tracking_ctx = AuditContext(
            action="pipeline.tracking", actor=ctx.actor, principal=ctx.require_principal()
        )
        with contextlib.suppress(ShamalError):
            self._tracking.update_run(
                tracking_ctx,
                run.mlflow_run_id,
                status="KILLED",
                end_time=self._tracking.now_ms(),
                run_name=None,
            )

    def _started_by(self, pipeline: str, trigger_key: str) -> bool:
        with self._db.unit_of_work(write=False) as s:
            return _store.run_of_trigger(s, pipeline, trigger_key) is not None

    def _open_tracking(self, ctx: AuditContext, run: PipelineRun) -> PipelineRun:
        """The run's parent run in MLflow (steps nest under it); a tracking failure is
        logged and the pipeline runs on without it."""
        principal = ctx.require_principal()
        name = f"{EXPERIMENT_PREFIX}{run.pipeline}"
        tracking_ctx = AuditContext(
            action="pipeline.tracking", actor=ctx.actor, principal=principal
        )
        try:
            try:
                experiment = self._tracking.experiment_by_name(principal, name)
            except NotFound:
                tags = {"shamal.team": run.team} if run.team else {}
                experiment = self._tracking.create_experiment(tracking_ctx, name, tags)
            parent = self._tracking.create_run(
                tracking_ctx,
                experiment.experiment_id,
                f"{run.pipeline}-{run.id[:8]}",
                None,
                {
                    "shamal.pipeline": run.pipeline,
                    "shamal.pipeline.run": run.id,
                    "shamal.pipeline.version": str(run.version),
                },
            )
            params = [(k, json.dumps(v)[:6000]) for k, v in sorted(run.params.items())][:100]
            if params:
                self._tracking.log(principal, parent.info.run_id, LoggedData(params=params))
        except ShamalError as exc:
            logger.warning("pipeline run %s has no tracking run: %s", run.id, exc)
            return run
        return replace(
            run, experiment_id=experiment.experiment_id, mlflow_run_id=parent.info.run_id
        )

    def get_run(self, principal: Principal, run_id: str) -> PipelineRun:
        with self._db.unit_of_work(write=False) as s:
            run = _store.get_run(s, _run_id(run_id))
        self._allow(principal, run.team, Role.VIEWER, f"pipeline run {run_id!r}")
        return run

    def list_runs(
        self,
        principal: Principal,
        *,
        pipeline: str | None = None,
        states: Sequence[str] = (),
        limit: int = 100,
    ) -> list[PipelineRun]:
        if not 1 <= limit <= MAX_LIST:
            raise InvalidParameter(f"limit must be from 1 to {MAX_LIST}")
        for state in states:
            if state not in RunState.__members__.values():
                raise InvalidParameter(f"unknown run state {state[:30]!r}")
        with self._db.unit_of_work(write=False) as s:
            return _store.list_runs(
                s, _visibility(principal), pipeline=pipeline, states=states, limit=limit
            )

    def record_output(
        self, principal: Principal, run_id: str, key: str, job_id: str, output: str
    ) -> None:
        """A step's job hands back its output (JSON text) while it runs.

        Raises:
            NotFound: no such run or step, or one the caller may not see.
            Conflict: the step is not running that job now.
            InvalidParameter: the output is not a small JSON value.
        """
        run = self.get_run(principal, run_id)
        with self._db.unit_of_work(write=False) as s:
            step = _store.get_step(s, run.id, key)
        job = self._jobs.jobs_of([job_id]).get(job_id) if step.job_id == job_id else None
        if (
            job is None
            or job.user != principal.name
            or step.state != "running"
            or job.state.value not in ("admitted", "running")
        ):
            raise Conflict(f"step {key!r} of run {run.id} is not running job {job_id[:32]!r}")
        try:
            value = json.loads(output)
        except ValueError:
            raise InvalidParameter("a step's output must be JSON") from None
        check_value(f"the output of step {key!r}", value)
        self._db.run(lambda s: _store.move_step(s, run.id, key, ["running"], output=value))

    def cancel(self, ctx: AuditContext, run_id: str) -> PipelineRun:
        """Stop a run: its running steps' jobs are cancelled, nothing new starts.

        Raises:
            Conflict: the run has ended.
        """
        principal = ctx.require_principal()
        run = self.get_run(principal, run_id)
        self._allow(principal, run.team, Role.MEMBER, f"pipeline run {run_id!r}")
        if run.state != RunState.RUNNING.value:
            raise Conflict(f"run {run.id} has ended ({run.state})")
        now = self._clock()
        ctx.target = f"pipeline-run:{run.id}"
        active = [s for s in run.steps if s.state in ACTIVE]

        def work(s: Session) -> None:
            for step in active:
                _store.move_step(
                    s,
                    run.id,
                    step.key,
                    list(ACTIVE),
                    state="cancelled",
                    reason=f"cancelled by {principal.name}",
                    finished_at=now,
                )
            finish(s, run, RunState.CANCELLED, f"cancelled by {principal.name}", now)
            self._audit.record(s, ctx, ctx.target, steps_cancelled=len(active))

        self._db.run(work)
        for step in active:
            if step.job_id:
                with contextlib.suppress(Conflict, NotFound):  # it ended meanwhile
                    self._jobs.cancel(ctx, step.job_id)
        return self.get_run(principal, run.id)

    def retry(self, ctx: AuditContext, run_id: str, from_step: str | None = None) -> PipelineRun:
        """A new run of the same version and parameters that reuses what the old one
        finished, except ``from_step`` and everything downstream of it (default: every step
        that did not succeed, and what depends on them).

        Raises:
            InvalidParameter: an unknown step. Conflict: the old run is still running.
        """
        principal = ctx.require_principal()
        old = self.get_run(principal, run_id)
        self._allow(principal, old.team, Role.MEMBER, f"pipeline run {run_id!r}")
        if old.state == RunState.RUNNING.value:
            raise Conflict(f"run {old.id} is still running: cancel it first")
        with self._db.unit_of_work(write=False) as s:
            info = _store.get_pipeline(s, old.pipeline, old.version)
        spec = PipelineSpec.from_json(info.spec)
        again = _to_rerun(spec, old, from_step)
        keep = [s for s in old.steps if s.name not in again and s.state in DONE]
        run = PipelineRun(
            id=uuid.uuid4().hex,
            pipeline=old.pipeline,
            version=old.version,
            params=old.params,
            state=RunState.RUNNING.value,
            trigger=f"retry of {old.id} by {principal.name}",
            user=principal.name,
            team=old.team,
            retry_of=old.id,
            experiment_id=None,
            mlflow_run_id=None,
            reason="",
            created_at=self._clock(),
            finished_at=None,
        )
        run = self._open_tracking(ctx, run)
        self._insert_run(ctx, run, None, keep)
        self.advancer.advance(run.id)
        return self.get_run(principal, run.id)

    def logs(self, principal: Principal, run_id: str, key: str, offset: int = 0) -> LogChunk:
        """The log of a step's job (its latest attempt), from ``offset``."""
        run = self.get_run(principal, run_id)
        step = next((s for s in run.steps if s.key == key), None)
        if step is None:
            raise NotFound(f"run {run.id} has no step {key[:80]!r}")
        if step.job_id is None:
            raise NotFound(f"step {key!r} ran no job ({step.state}: {step.reason or 'cached'})")
        return self._jobs.read_log(principal, step.job_id, None, offset)

    def advance_all(self) -> int:
        """Move every running run on (the scheduler loop calls this)."""
        return self.advancer.advance_all()


class _NotThisRun(Exception):
    """The work done with a run's insertion declined it: the transaction rolls back."""


def _run_id(run_id: str) -> str:
    if not (len(run_id) == 32 and all(c in "0123456789abcdef" for c in run_id)):
        raise NotFound(f"pipeline run {run_id[:40]!r} does not exist")
    return run_id


def _params(spec: PipelineSpec, given: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(given) - set(spec.params))
    if unknown:
        known = ", ".join(sorted(spec.params)) or "none"
        raise InvalidParameter(
            f"pipeline {spec.name!r} has no parameter {unknown[0][:64]!r} (its parameters: {known})"
        )
    values = {**spec.params, **{k: check_value(f"parameter {k!r}", v) for k, v in given.items()}}
    missing = sorted(k for k, v in values.items() if v is None and k not in given)
    if missing:
        raise InvalidParameter(f"pipeline {spec.name!r} needs a value for {missing[0]!r}")
    return values


def _to_rerun(spec: PipelineSpec, old: PipelineRun, from_step: str | None) -> set[str]:
    if from_step is not None:
        try:
            spec.step(from_step)
        except KeyError:
            raise InvalidParameter(
                f"pipeline {spec.name!r} has no step {from_step[:64]!r}"
            ) from None
        return set(downstream(spec, from_step))
    states = {s.key: s.state for s in old.steps}
    again: set[str] = set()
    for step in spec.steps:
        if states.get(step.name) not in DONE:
            again.update(downstream(spec, step.name))
    return again
