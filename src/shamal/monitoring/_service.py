"""Monitors: attach to a deployment, read its sample log on a schedule, compare with the
reference, store the result, emit drift events and apply the drift policy.

Access: a monitor belongs to its deployment's team. Viewers of the team read it and its
results; members create, run, pause and resume it (creating one needs read access to the
deployment, which answers NotFound otherwise, as deployments do); maintainers delete it.
Another team's monitor answers 404; platform admins see and do everything.

A run, scheduled or asked for, holds the monitor's lease while it reads and compares; its
result, the per-column points, the moved cursor and (on drift) the ``drift_detected`` event
commit in one transaction, under the lease (a run that lost its lease stores nothing). The
drift policy follows that event through the stream (the consumer ``monitors.policies``, at
least once: a server that dies between the commit and the policy leaves the event to the
next call, in any server's scheduler loop) and acts once in effect: a result whose actions
are recorded is left alone, and a retraining run is started with the result's id as its
trigger key, so a retry starts nothing new. A run that fails records its error on the
monitor and moves the schedule on; it never stops the loop that runs the others.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy.orm import Session

from shamal.clock import Clock, utc_now
from shamal.db import Database
from shamal.deployments import Deployment, DeploymentService, RolloutPhase
from shamal.errors import Conflict, InvalidParameter, NotFound, ShamalError
from shamal.events import Event, EventFilter, EventKind, EventService, NewEvent, emit
from shamal.monitoring import _rules, _store
from shamal.monitoring._columns import Sampled, labelled_pairs, split_samples
from shamal.monitoring._entities import (
    DriftAction,
    Monitor,
    MonitorResult,
    MonitorSpec,
    RunOutcome,
    SeriesPoint,
)
from shamal.monitoring._evaluate import Evaluation, evaluate, score
from shamal.monitoring._references import ReferenceService
from shamal.pipelines import PipelineService
from shamal.registry import RegistryService
from shamal.security import AuditContext, AuditLog, Principal, Role, SecurityService

logger = logging.getLogger(__name__)

__all__ = ["MonitorService", "MonitorServices"]

MAX_LIST: Final = 1000
#: How long a run may hold a monitor before another server may take it over.
DEFAULT_LEASE: Final = timedelta(minutes=10)
#: Monitors one pass of the scheduler runs at most (the rest wait for the next pass).
DUE_PER_PASS: Final = 50
#: Samples read per page of the deployment's log.
#: The event consumer that carries out drift policies.
POLICY_CONSUMER: Final = "monitors.policies"
_PAGE: Final = 1000


def _target(name: str) -> str:
    return f"monitor:{name}"


def owner_name() -> str:
    """This process's name in leases: ``HOST:PID:NONCE``."""
    return f"{socket.gethostname()[:32]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True)
class MonitorServices:
    """What monitors work with: the database and audit log, and the domains a run reads
    (deployments' samples, the registry's signatures, reference profiles) and acts on
    (pipelines, deployments' rollback, events' webhooks)."""

    db: Database
    audit: AuditLog
    security: SecurityService
    deployments: DeploymentService
    registry: RegistryService
    references: ReferenceService
    pipelines: PipelineService
    events: EventService


class MonitorService:
    """Create, read, run, pause, resume and delete monitors; run the due ones. Thread-safe.

    Every method raises ``NotFound`` for a monitor (or deployment, model, pipeline) that
    does not exist or is not visible, ``PermissionDenied`` for a role too low,
    ``InvalidParameter`` for malformed input and ``Conflict`` for a run asked for while
    another holds the monitor.
    """

    def __init__(
        self,
        services: MonitorServices,
        clock: Clock = utc_now,
        *,
        owner: str | None = None,
        lease: timedelta = DEFAULT_LEASE,
        retrain_backoff: timedelta = _rules.DEFAULT_RETRAIN_BACKOFF,
    ) -> None:
        self._db = services.db
        self._audit = services.audit
        self._security = services.security
        self._deployments = services.deployments
        self._registry = services.registry
        self._references = services.references
        self._pipelines = services.pipelines
        self._events = services.events
        self._clock = clock
        self._owner = owner or owner_name()
        self._lease = lease
        self._retrain_backoff = retrain_backoff

    # ------------------------------------------------------------------ access
    @staticmethod
    def _access(
        principal: Principal,
        found: tuple[_store.MonitorRef, Monitor] | None,
        name: str,
        needed: Role,
    ) -> tuple[_store.MonitorRef, Monitor]:
        if found is None:
            raise _store.not_found(name)
        ref, _ = found
        if principal.user.is_admin:
            return found
        if ref.team_id is None:
            raise _store.not_found(name)
        principal.require_owner_role(ref.team_id, needed, f"monitor {name!r}")
        return found

    def _find(
        self, principal: Principal, name: str, needed: Role
    ) -> tuple[_store.MonitorRef, Monitor]:
        _rules.check_monitor_name(name)
        with self._db.unit_of_work(write=False) as s:
            return self._access(principal, _store.find(s, name), name, needed)

    def _team(self, principal: Principal, deployment: Deployment) -> tuple[str, str | None]:
        """The monitor's team: the deployment's (the caller must be a member of it)."""
        if not deployment.team:
            principal.require_admin()
            return "", None
        return self._security.owning_team(principal, deployment.team, "owns this monitor")

    # ------------------------------------------------------------------ create
    def _reference_of(self, spec: MonitorSpec, deployment: Deployment) -> tuple[str, int]:
        if spec.reference is not None:
            return spec.reference
        primaries = deployment.split.primaries
        if not primaries:
            raise InvalidParameter(f"deployment {deployment.name!r} has no primary version")
        return primaries[0].model_name, primaries[0].version

    def _check_against(
        self, principal: Principal, spec: MonitorSpec, reference: tuple[str, int]
    ) -> None:
        """The reference exists and holds the columns the spec names; a retraining
        pipeline is one the caller sees."""
        profile = self._references.get(principal, *reference)
        for column in (*spec.columns, *spec.tests):
            if column not in profile.columns:
                raise InvalidParameter(
                    f"the reference of {reference[0]}/{reference[1]} has no column {column[:64]!r}"
                )
        if spec.on_drift.action is DriftAction.RETRAIN:
            assert spec.on_drift.pipeline is not None
            self._pipelines.get(principal, spec.on_drift.pipeline)

    def create(self, ctx: AuditContext, spec: MonitorSpec) -> Monitor:
        """Attach a monitor to ``spec.deployment``; its first run is one period from now and
        reads the samples the deployment keeps.

        Raises:
            NotFound: a deployment, model version, reference profile or pipeline the
                caller cannot see.
            PermissionDenied: below member in the deployment's team (or, with an alert URL,
                below maintainer: a webhook is made).
            InvalidParameter: a malformed spec, or columns the reference lacks.
            AlreadyExists: a monitor of that name exists.
        """
        principal = ctx.require_principal()
        spec = _rules.check_spec(spec)
        deployment = self._deployments.get(principal, spec.deployment)
        name = spec.name or _rules.default_name(deployment.name)
        ctx.target = _target(name)
        team, team_id = self._team(principal, deployment)
        reference = self._reference_of(spec, deployment)
        self._check_against(principal, spec, reference)
        now = self._clock()
        webhook_id = self._subscribe(ctx, name, team, spec.alert_url)
        monitor = Monitor(
            name=name,
            deployment=deployment.name,
            team=team,
            reference_model=reference[0],
            reference_version=reference[1],
            columns=spec.columns,
            tests=dict(spec.tests),
            threshold=spec.threshold,
            correction=spec.correction,
            drift_share=spec.drift_share,
            window=spec.window,
            on_drift=spec.on_drift,
            retrain_params=dict(spec.retrain_params),
            follows=spec.reference is None,
            schedule_s=spec.schedule_s,
            paused=False,
            cursor=0,
            next_run_at=now + timedelta(seconds=spec.schedule_s),
            last_run_at=None,
            last_error=None,
            webhook_id=webhook_id,
            created_by=principal.name,
            created_at=now,
            updated_at=now,
        )
        stored = _rules.spec_json(spec, reference)

        def work(s: Session) -> Monitor:
            _store.insert_monitor(s, uuid.uuid4().hex, team_id, monitor, stored)
            self._audit.record(
                s,
                ctx,
                _target(name),
                deployment=deployment.name,
                reference=f"{reference[0]}/{reference[1]}",
                schedule_s=spec.schedule_s,
                on_drift=str(spec.on_drift),
            )
            return monitor

        try:
            return self._db.run(work)
        except ShamalError:
            if webhook_id is not None:
                self._unsubscribe(ctx, webhook_id)
            raise

    def _subscribe(self, ctx: AuditContext, name: str, team: str, url: str | None) -> str | None:
        """A webhook told of this monitor's drift events (None: no alert URL)."""
        if url is None:
            return None
        principal = ctx.require_principal()
        hook_ctx = AuditContext(action="webhook.create", actor=ctx.actor, principal=principal)
        hook, _secret = self._events.create_webhook(
            hook_ctx,
            f"monitor-{name}"[:63],
            url,
            f"{EventKind.DRIFT_DETECTED.value} where monitor = '{name}'",
            team=team or None,
        )
        return hook.id

    def _unsubscribe(self, ctx: AuditContext, webhook_id: str) -> None:
        principal = ctx.require_principal()
        hook_ctx = AuditContext(action="webhook.delete", actor=ctx.actor, principal=principal)
        with contextlib.suppress(NotFound):
            self._events.delete_webhook(hook_ctx, webhook_id)

    # ------------------------------------------------------------------ reads
    def get(self, principal: Principal, name: str) -> Monitor:
        return self._find(principal, name, Role.VIEWER)[1]

    def list_monitors(
        self,
        principal: Principal,
        *,
        deployment: str | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> list[Monitor]:
        """The monitors the caller may see (of ``deployment`` only, if given), by name."""
        if not 1 <= limit <= MAX_LIST:
            raise InvalidParameter(f"limit must be between 1 and {MAX_LIST}")
        visible = None if principal.user.is_admin else frozenset(principal.team_ids.values())
        with self._db.unit_of_work(write=False) as s:
            return _store.list_monitors(s, visible, deployment, limit, after)

    def results(self, principal: Principal, name: str, *, limit: int = 20) -> list[MonitorResult]:
        """The newest ``limit`` results, newest first."""
        if not 1 <= limit <= MAX_LIST:
            raise InvalidParameter(f"limit must be between 1 and {MAX_LIST}")
        ref, monitor = self._find(principal, name, Role.VIEWER)
        with self._db.unit_of_work(write=False) as s:
            return _store.results(s, ref.id, monitor.name, limit)

    def series(
        self, principal: Principal, name: str, *, column: str | None = None, limit: int = 50
    ) -> list[SeriesPoint]:
        """Each column's points over the newest ``limit`` results, oldest first."""
        if not 1 <= limit <= MAX_LIST:
            raise InvalidParameter(f"limit must be between 1 and {MAX_LIST}")
        if column is not None:
            _rules.check_column(column)
        ref, _ = self._find(principal, name, Role.VIEWER)
        with self._db.unit_of_work(write=False) as s:
            return _store.series(s, ref.id, column, limit)

    # ------------------------------------------------------------------ changes
    def _set_paused(self, ctx: AuditContext, name: str, paused: bool) -> Monitor:
        principal = ctx.require_principal()
        _rules.check_monitor_name(name)
        ctx.target = _target(name)

        def work(s: Session) -> Monitor:
            ref, monitor = self._access(
                principal, _store.find(s, name, lock=True), name, Role.MEMBER
            )
            now = self._clock()
            due = (
                monitor.next_run_at
                if paused
                else _rules.next_due(monitor.next_run_at, monitor.schedule_s, now)
            )
            _store.set_paused(s, ref.id, paused, due, now)
            self._audit.record(s, ctx, ctx.target, paused=paused)
            return replace(monitor, paused=paused, next_run_at=due, updated_at=now)

        return self._db.run(work)

    def pause(self, ctx: AuditContext, name: str) -> Monitor:
        """Stop scheduled runs (a run asked for still runs)."""
        return self._set_paused(ctx, name, True)

    def resume(self, ctx: AuditContext, name: str) -> Monitor:
        """Run on schedule again, from the next tick (ticks missed while paused are not run)."""
        return self._set_paused(ctx, name, False)

    def delete(self, ctx: AuditContext, name: str) -> None:
        """Delete the monitor, its results and its alert webhook (maintainer)."""
        principal = ctx.require_principal()
        _rules.check_monitor_name(name)
        ctx.target = _target(name)

        def work(s: Session) -> str | None:
            ref, monitor = self._access(
                principal, _store.find(s, name, lock=True), name, Role.MAINTAINER
            )
            _store.remove(s, ref.id)
            self._audit.record(s, ctx, ctx.target, deployment=monitor.deployment)
            return monitor.webhook_id

        webhook_id = self._db.run(work)
        if webhook_id is not None:
            self._unsubscribe(ctx, webhook_id)

    # ------------------------------------------------------------------ runs
    def run_now(self, ctx: AuditContext, name: str) -> RunOutcome:
        """Run the monitor now, paused or not (member).

        Raises:
            Conflict: a run of it holds it now.
            ShamalError: what failed the run (it is also recorded on the monitor).
        """
        principal = ctx.require_principal()
        ref, monitor = self._find(principal, name, Role.MEMBER)
        ctx.target = _target(name)
        now = self._clock()
        if not self._db.run(
            lambda s: _store.claim(s, ref.id, self._owner, now, now + self._lease, scheduled=False)
        ):
            raise Conflict(f"monitor {name!r} is running now; try again when it is done")
        return self._run(ref.id, monitor, ctx)

    def run_due(self) -> int:
        """Run every monitor due now (for the scheduler loop); how many ran. A monitor whose
        run fails keeps its error; the others still run."""
        now = self._clock()
        with self._db.unit_of_work(write=False) as s:
            names = _store.due(s, now, DUE_PER_PASS)
        ran = 0
        for name in names:
            try:
                ran += self._run_scheduled(name)
            except Exception:  # noqa: BLE001 - one monitor must never stop the loop
                logger.exception("monitor %r: the scheduled run failed", name)
        return ran

    def _run_scheduled(self, name: str) -> int:
        with self._db.unit_of_work(write=False) as s:
            found = _store.find(s, name)
        if found is None:
            return 0
        ref, monitor = found
        now = self._clock()
        claimed = self._db.run(
            lambda s: _store.claim(s, ref.id, self._owner, now, now + self._lease, scheduled=True)
        )
        if not claimed:
            return 0  # another server (or a run still going) has it
        with contextlib.suppress(ShamalError):  # recorded on the monitor by _run
            self._run(ref.id, monitor, None)
        return 1

    def _run(self, monitor_id: str, monitor: Monitor, ctx: AuditContext | None) -> RunOutcome:
        """One run under the lease this process took; the lease is always released."""
        try:
            return self._evaluate_and_store(monitor_id, monitor, ctx)
        except Exception as exc:
            message = exc.message if isinstance(exc, ShamalError) else "internal error"
            if not isinstance(exc, ShamalError):
                logger.exception("monitor %r: run failed", monitor.name)
            now = self._clock()
            due = _rules.next_due(monitor.next_run_at, monitor.schedule_s, now)
            self._db.run(
                lambda s: _store.finish(
                    s,
                    monitor_id,
                    self._owner,
                    cursor=monitor.cursor,
                    next_run_at=due,
                    now=now,
                    error=message,
                )
            )
            raise

    def _principal(self, monitor: Monitor) -> Principal:
        """Who runs act as: the monitor's creator, with their current roles (one who left
        the team makes the run fail, recorded, rather than read what they no longer may)."""
        return self._security.principal_of(monitor.created_by)

    def _follow(
        self, monitor_id: str, monitor: Monitor, principal: Principal
    ) -> tuple[Monitor, str | None]:
        """The monitor with its reference, and the version whose samples it judges (None:
        every answering version). A monitor that follows the deployment's primary judges
        the primary's samples; once the primary changes (a canary promoted, a redeploy) and
        the new one has a reference profile, that profile becomes the reference, audited
        with the monitor as actor. Until one is built, the primary's samples are judged
        against the reference before. The monitor's creator must still read the deployment."""
        deployment = self._deployments.get(principal, monitor.deployment)
        primaries = deployment.split.primaries
        if not monitor.follows or not primaries:
            return monitor, None
        model, version = primaries[0].model_name, primaries[0].version
        if (model, version) == (monitor.reference_model, monitor.reference_version):
            return monitor, primaries[0].version_key
        try:
            self._references.get(principal, model, version)
        except NotFound:
            logger.warning(
                "monitor %r: %s/%d has no reference profile; judged against %s/%d",
                monitor.name,
                model,
                version,
                monitor.reference_model,
                monitor.reference_version,
            )
            return monitor, primaries[0].version_key
        now = self._clock()
        ctx = AuditContext(
            action="monitor.reference", actor=f"monitor:{monitor.name}", principal=principal
        )

        def work(s: Session) -> None:
            if not _store.set_reference(s, monitor_id, self._owner, model, version, now):
                raise Conflict(f"monitor {monitor.name!r} was taken over; this run stored nothing")
            was = f"{monitor.reference_model}/{monitor.reference_version}"
            self._audit.record(
                s, ctx, _target(monitor.name), reference=f"{model}/{version}", previous=was
            )

        self._db.run(work)
        followed = replace(monitor, reference_model=model, reference_version=version)
        return followed, primaries[0].version_key

    def _samples(self, monitor: Monitor, served_by: str | None) -> Iterator[Sampled]:
        """The deployment's samples after the cursor, oldest first, as far as the window
        needs (shadows, and answers of versions other than ``served_by``, left out)."""
        after = monitor.cursor
        while True:
            page = self._deployments.samples_after(monitor.deployment, after, limit=_PAGE)
            for sample in page:
                if not sample.shadow and served_by in (None, sample.version):
                    yield Sampled(sample.id, sample.inputs, sample.outputs)
            if len(page) < _PAGE:
                return
            after = page[-1].id

    def _labelled(
        self, monitor: Monitor, served_by: str | None
    ) -> tuple[list[tuple[Sampled, Any]], int | None]:
        """Samples whose labels came since the last run (one page, oldest label first; shadow
        answers, and those of versions other than ``served_by``, left out), and the label
        cursor after them (None: no new label)."""
        page = self._deployments.labelled_after(
            monitor.deployment, monitor.label_cursor, limit=_PAGE
        )
        found = [
            (Sampled(sample.id, sample.inputs, sample.outputs), sample.label)
            for _, sample in page
            if not sample.shadow and served_by in (None, sample.version)
        ]
        return found, (page[-1][0] if page else None)

    def _evaluate_and_store(
        self, monitor_id: str, monitor: Monitor, ctx: AuditContext | None
    ) -> RunOutcome:
        principal = self._principal(monitor)
        monitor, served_by = self._follow(monitor_id, monitor, principal)
        reference = self._references.get(
            principal, monitor.reference_model, monitor.reference_version
        )
        version = self._registry.get_model_version(
            principal, monitor.reference_model, monitor.reference_version
        )
        gathered = split_samples(
            self._samples(monitor, served_by), version.signature, max_rows=monitor.window
        )
        labelled, label_cursor = self._labelled(monitor, served_by)
        now = self._clock()
        due = _rules.next_due(monitor.next_run_at, monitor.schedule_s, now)
        if gathered.samples == 0 and not labelled:
            self._finish(monitor_id, monitor, ctx, None, None, now, due, label_cursor)
            return RunOutcome(monitor.name, None, "no new samples")
        result_id = uuid.uuid4().hex
        if gathered.samples:
            found = evaluate(monitor, reference, gathered, at=now, result_id=result_id)
        else:  # labels only: the model's performance on them, no traffic to compare
            empty = {
                "columns": [],
                "share": 0.0,
                "drifted": False,
                "correction": monitor.correction,
            }
            found = Evaluation(empty, (), drifted=False, share=0.0, drifted_columns=())
        found.report["reference"] = {
            "model": monitor.reference_model,
            "version": monitor.reference_version,
        }
        if labelled:
            scored, points = score(labelled_pairs(labelled), at=now, result_id=result_id)
            found.report["performance"] = scored
            found = replace(found, points=found.points + tuple(points))
        result = MonitorResult(
            id=result_id,
            monitor=monitor.name,
            at=now,
            first_sample=gathered.first_id if gathered.samples else monitor.cursor,
            last_sample=gathered.last_id if gathered.samples else monitor.cursor,
            samples=gathered.samples,
            rows=gathered.rows,
            drifted=found.drifted,
            share=found.share,
            report=found.report,
            actions=(),
        )
        self._finish(monitor_id, monitor, ctx, result, found, now, due, label_cursor)
        if found.drifted:
            # The policy follows the drift event the result committed with, through the
            # event stream (at least once: a server that dies here leaves the event to the
            # next call, in the scheduler loop); done now, the answer shows what it did.
            self.apply_policies()
            with self._db.unit_of_work(write=False) as s:
                stored = _store.result(s, monitor_id, monitor.name, result_id)
            if stored is not None:
                result = stored
        return RunOutcome(monitor.name, result, "drift" if found.drifted else "no drift")

    def _finish(
        self,
        monitor_id: str,
        monitor: Monitor,
        ctx: AuditContext | None,
        result: MonitorResult | None,
        found: Evaluation | None,
        now: datetime,
        due: datetime,
        label_cursor: int | None = None,
    ) -> None:
        """Store the result, move the cursors and release the lease, in one transaction."""
        cursor = monitor.cursor if result is None else result.last_sample

        def work(s: Session) -> None:
            if not _store.finish(
                s,
                monitor_id,
                self._owner,
                cursor=cursor,
                next_run_at=due,
                now=now,
                error=None,
                label_cursor=label_cursor,
            ):
                raise Conflict(f"monitor {monitor.name!r} was taken over; this run stored nothing")
            if result is not None and found is not None:
                _store.insert_result(s, monitor_id, result, found.points)
                if result.drifted:
                    emit(s, _drift_event(monitor, result, found))
            if ctx is not None:
                detail: dict[str, Any] = {"result": result.id if result else None}
                self._audit.record(s, ctx, _target(monitor.name), **detail)

        self._db.run(work)

    # ------------------------------------------------------------------ policy
    def apply_policies(self) -> int:
        """Carry out the drift policies of ``drift_detected`` events not acted on yet; for
        the scheduler loop (and after a run that found drift). At least once, and once in
        effect: a result whose actions are recorded is left alone, and a retraining run is
        started under the result's id. Returns how many events were read."""
        return self._events.consume(
            POLICY_CONSUMER, self._on_drift_events, filter=EventFilter.parse("drift_detected")
        )

    def _on_drift_events(self, events: Sequence[Event]) -> None:
        for event in events:
            try:
                self._act_on(event)
            except Exception:  # one event's failure never holds up the stream
                logger.exception("drift event %d: its policy failed", event.id)

    def _act_on(self, event: Event) -> None:
        name, result_id = event.payload.get("monitor"), event.payload.get("result")
        if not isinstance(name, str) or not isinstance(result_id, str):
            return
        with self._db.unit_of_work(write=False) as s:
            found = _store.find(s, name)
            result = None if found is None else _store.result(s, found[0].id, name, result_id)
        if found is None or result is None or result.actions:
            return  # the monitor is gone, or this result was acted on already
        actions = self._apply_policy(found[1], result)
        if actions:
            self._db.run(lambda s: _store.set_actions(s, result_id, actions))

    def _apply_policy(self, monitor: Monitor, result: MonitorResult) -> list[dict[str, Any]]:
        """The drift policy, after the result is stored; each action says how it went."""
        actions: list[dict[str, Any]] = []
        if monitor.webhook_id is not None:
            actions.append({"action": "alert", "webhook": monitor.webhook_id, "status": "queued"})
        policy = monitor.on_drift
        if policy.action is DriftAction.NONE:
            return actions
        actor = f"monitor:{monitor.name}"
        try:
            principal = self._principal(monitor)
            if policy.action is DriftAction.RETRAIN:
                assert policy.pipeline is not None
                held = self._retrain_held(principal, monitor, result.id)
                if held is not None:
                    actions.append(
                        {
                            "action": "retrain",
                            "pipeline": policy.pipeline,
                            "status": "held",
                            "reason": held,
                        }
                    )
                    return actions
                ctx = AuditContext(action="pipeline.run", actor=actor, principal=principal)
                run = self._pipelines.start(
                    ctx,
                    policy.pipeline,
                    dict(monitor.retrain_params),
                    trigger=f"drift found by monitor {monitor.name} (result {result.id})",
                    trigger_key=f"drift:{result.id}",
                )
                actions.append(
                    {
                        "action": "retrain",
                        "pipeline": policy.pipeline,
                        "run": run.id if run else None,
                        "status": "started" if run else "already started",
                    }
                )
            else:
                ctx = AuditContext(action="deployment.rollback", actor=actor, principal=principal)
                why = f"drift found by monitor {monitor.name}: {result.share:.0%} of columns"
                self._deployments.rollback(ctx, monitor.deployment, reason=why)
                actions.append({"action": "rollback", "status": "rolled back"})
        except ShamalError as exc:
            logger.warning("monitor %r: %s failed: %s", monitor.name, policy.action, exc.message)
            actions.append(
                {"action": policy.action.value, "status": "failed", "error": exc.message}
            )
        return actions

    def _retrain_held(self, principal: Principal, monitor: Monitor, result_id: str) -> str | None:
        """Why no retraining run may start now (None: one may). While the deployment has a
        canary in rollout (the last retraining's version, being judged on live traffic) or
        a run this monitor started is still running, drift found meanwhile is the same
        drift: it is recorded, and the first run after those end acts on what it finds.
        After a retraining that did not take (its run failed, or its canary was rolled
        back), retraining backs off (:func:`_rules.retraining_backoff`)."""
        deployment = self._deployments.get(principal, monitor.deployment)
        canary = deployment.split.canary
        if canary is not None:
            return (
                f"deployment {monitor.deployment!r} has a canary in rollout "
                f"({canary.model_name}/{canary.version}); retraining waits until it is "
                "promoted or rolled back"
            )
        with self._db.unit_of_work(write=False) as s:
            found = _store.find(s, monitor.name)
            recent = [] if found is None else _store.results(s, found[0].id, monitor.name, 20)
        for result in (r for r in recent if r.id != result_id):  # not the one acted on
            run_id = next(
                (a.get("run") for a in result.actions if a.get("action") == "retrain"), None
            )
            if isinstance(run_id, str):
                run = self._pipelines.get_run(principal, run_id)
                if run.state == "running":
                    return f"retraining run {run_id} that this monitor started is still running"
                state = deployment.state
                rolled_back = state.phase is RolloutPhase.ROLLED_BACK
                return _rules.retraining_backoff(
                    _rules.LastRetraining(
                        run.id, run.state, run.version, run.created_at, run.finished_at
                    ),
                    rolled_back_at=state.since if rolled_back else None,
                    latest_version=self._pipelines.get(principal, run.pipeline).version,
                    now=self._clock(),
                    backoff=self._retrain_backoff,
                )
        return None


def _drift_event(monitor: Monitor, result: MonitorResult, found: Evaluation) -> NewEvent:
    return NewEvent(
        EventKind.DRIFT_DETECTED,
        f"deployments:/{monitor.deployment}",
        monitor.team or None,
        f"monitor:{monitor.name}",
        {
            "monitor": monitor.name,
            "deployment": monitor.deployment,
            "team": monitor.team or None,
            "features": list(found.drifted_columns)[:100],
            "share": result.share,
            "model": monitor.reference_model,
            "version": monitor.reference_version,
            "result": result.id,
        },
    )
