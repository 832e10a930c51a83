"""Rules of deployments: who may deploy and change them, the controller applied, all audited.

Access: a deployment belongs to a team. Viewers of the team read it (spec, events, samples);
members deploy, change the split, promote, roll back and report (serve processes run with a
member's token); maintainers delete. Another team's deployment answers 404. Platform admins
see and do everything; a deployment an admin made without a team is theirs alone.

Every change is a compare-and-set on the deployment's revision, records an event and an
audit entry in the transaction that makes it, and bumps the revision serve processes poll.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from shamal.clock import Clock, utc_now
from shamal.db import Database, RetryableConflict
from shamal.deployments import _rules, _store
from shamal.deployments._entities import (
    Deployment,
    DeploymentEvent,
    DeploymentSpec,
    Label,
    LabelsOutcome,
    LoadStatus,
    ReportOutcome,
    RolloutAction,
    RolloutDecision,
    RolloutPhase,
    RolloutPlan,
    RolloutState,
    Route,
    RouteRole,
    Sample,
    SampledRequest,
    TrafficSplit,
    VersionReport,
    VersionStats,
    WeightedUri,
)
from shamal.errors import AlreadyExists, Conflict, InvalidParameter, NotFound
from shamal.events import EventKind, NewEvent, emit
from shamal.registry import RegistryService
from shamal.security import (
    AuditContext,
    AuditLog,
    IssuedToken,
    Principal,
    Role,
    SecurityService,
)

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

MAX_LIST = 1000
#: How long the calls per minute (the latency and error charts) are kept.
STATS_KEPT = timedelta(days=7)
MAX_EVENTS = 1000
#: Samples kept per deployment; older ones are dropped as new ones arrive.
DEFAULT_KEEP_SAMPLES = 1000
#: Labels kept per deployment (posted labels wait for their samples; the oldest go first).
DEFAULT_KEEP_LABELS = 10_000
#: A sample larger than this (as JSON) is dropped, not stored.
MAX_SAMPLE_BYTES = 32 * 1024
CONTROLLER = "rollout-controller"
#: The deployment event that records a primary breaking the SLO (once per revision).
SLO_BREACH = "slo_breach"

Mutation = Callable[[Deployment], tuple[Deployment, dict[str, Any]]]


def _target(name: str) -> str:
    return f"deployment:{name}"


class DeploymentService:
    """Deploy, change, promote, roll back and delete deployments; take serve processes' reports.

    Thread-safe; one instance per process. Changes take the request's AuditContext; reads a
    Principal. Every method raises ``NotFound`` for a deployment that does not exist or is not
    visible, ``PermissionDenied`` for a role too low, ``InvalidParameter`` for malformed input
    and ``Conflict`` when the deployment is not in a state that allows the change (or is not
    at the revision the caller expected).
    """

    def __init__(
        self,
        db: Database,
        audit: AuditLog,
        security: SecurityService,
        registry: RegistryService,
        clock: Clock = utc_now,
        *,
        keep_samples: int = DEFAULT_KEEP_SAMPLES,
    ) -> None:
        self._db = db
        self._audit = audit
        self._security = security
        self._registry = registry
        self._clock = clock
        self._keep_samples = keep_samples

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _access(
        principal: Principal,
        found: tuple[_store.DeploymentRef, Deployment] | None,
        name: str,
        needed: Role,
    ) -> tuple[_store.DeploymentRef, Deployment]:
        if found is None:
            raise _store.not_found(name)
        ref, deployment = found
        if principal.user.is_admin:
            return found
        if ref.team_id is None:
            raise _store.not_found(name)
        principal.require_owner_role(ref.team_id, needed, f"deployment {name!r}")
        return ref, deployment

    def _read(self, principal: Principal, name: str) -> tuple[_store.DeploymentRef, Deployment]:
        _rules.check_deployment_name(name)
        with self._db.unit_of_work(write=False) as s:
            return self._access(principal, _store.find(s, name), name, Role.VIEWER)

    def _team(self, principal: Principal, team: str | None) -> tuple[str, str | None]:
        """(team name, team id) a new deployment belongs to."""
        return self._security.owning_team(principal, team, "owns this deployment")

    def _resolve(self, principal: Principal, wanted: WeightedUri, role: RouteRole) -> Route:
        """A route for ``wanted``: its URI resolved to a concrete version the caller may read."""
        uri = _rules.parse_model_uri(wanted.uri)
        if uri.alias is not None:
            found = self._registry.get_model_version_by_alias(principal, uri.name, uri.alias)
        else:
            assert uri.version is not None
            found = self._registry.get_model_version(principal, uri.name, uri.version)
        return Route(uri.name, found.version, wanted.weight, role, wanted.uri)

    def _routes(
        self, principal: Principal, wanted: Sequence[WeightedUri], role: RouteRole
    ) -> tuple[Route, ...]:
        return tuple(self._resolve(principal, w, role) for w in wanted)

    # ------------------------------------------------------------------ deploy
    def feature_services_in_use(self) -> frozenset[str]:
        """The feature services some deployment names (the feature store keeps them whole)."""
        with self._db.unit_of_work(write=False) as s:
            return _store.feature_services(s)

    def deploy(self, ctx: AuditContext, name: str, spec: DeploymentSpec) -> Deployment:
        """Create the deployment, or replace its spec (a new revision; the rollout restarts).

        ``models:/`` URIs are resolved to concrete versions through the registry now; the
        deployment keeps both. Creating needs the member role in the team; replacing, the
        member role in the deployment's team (whose team cannot change).

        Raises:
            NotFound: a model, version or alias that does not exist or is not visible.
            InvalidParameter: a malformed spec, or routes of several models.
            AlreadyExists / Conflict: created or deleted at the same moment by someone else.
        """
        principal = ctx.require_principal()
        _rules.check_deployment_name(name)
        ctx.target = _target(name)
        with self._db.unit_of_work(write=False) as s:
            existing = _store.find(s, name)
        if existing is None:
            team, team_id = self._team(principal, spec.team)
        else:
            _refuse_hidden_name(principal, existing[0], name)
            self._access(principal, existing, name, Role.MEMBER)
            team, team_id = existing[1].team, existing[0].team_id
            if spec.team is not None and spec.team != team:
                raise InvalidParameter("a deployment's team cannot change; delete it first")
        draft = self._draft(principal, name, team, spec)
        detail = {"routes": _describe(draft.split), "team": team}

        def work(s: Session) -> Deployment:
            found = _store.find(s, name, lock=True)
            if (found is None) != (existing is None):
                raise Conflict(f"deployment {name!r} changed at the same time; try again")
            if found is None:
                deployment_id, kind, stored = uuid.uuid4().hex, "create", draft
                _store.insert(s, deployment_id, team_id, draft)
            else:
                _refuse_hidden_name(principal, found[0], name)
                ref, current = self._access(principal, found, name, Role.MEMBER)
                stored = replace(
                    draft,
                    revision=current.revision + 1,
                    created_by=current.created_by,
                    created_at=current.created_at,
                )
                if not _store.update(s, ref.id, current.revision, stored):
                    raise RetryableConflict
                _store.drop_stats_before(s, ref.id, stored.revision)
                deployment_id, kind = ref.id, "update"
            self._event(s, ctx, deployment_id, stored, kind, "spec deployed", detail)
            return stored

        return self._db.run(work)

    def _draft(
        self, principal: Principal, name: str, team: str, spec: DeploymentSpec
    ) -> Deployment:
        """The spec checked, its URIs resolved: revision 1 of a deployment, not yet stored."""
        for weighted in spec.primaries:
            _rules.check_weight(weighted.weight, what="a primary's weight")
        plan = _rules.check_plan(spec.plan.steps, spec.plan.interval_s)
        slo = _rules.check_slo(spec.slo.max_error_rate, spec.slo.max_p99_ms, spec.slo.min_requests)
        header = _rules.check_sticky_header(spec.sticky_header)
        rate = _rules.check_sample_rate(spec.sample_rate)
        canary = spec.canary
        if canary is not None:
            _rules.check_percent(canary.weight, "the canary's percentage")
        routes = (
            self._routes(principal, spec.primaries, RouteRole.PRIMARY)
            + self._routes(principal, (canary,) if canary else (), RouteRole.CANARY)
            + self._routes(principal, spec.shadows, RouteRole.SHADOW)
        )
        split = _rules.check_split(TrafficSplit(routes))
        now = self._clock()
        return Deployment(
            name=name,
            team=team,
            split=split,
            slo=slo,
            plan=plan,
            state=_rules.initial_state(split, plan, now),
            revision=1,
            sticky_header=header,
            sample_rate=rate,
            feature_service=_rules.check_feature_service(spec.feature_service),
            created_by=principal.name,
            created_at=now,
            updated_at=now,
        )

    def _event(
        self,
        s: Session,
        ctx: AuditContext,
        deployment_id: str,
        d: Deployment,
        kind: str,
        reason: str,
        detail: dict[str, Any],
    ) -> None:
        """The change's event row and audit entry, in the change's transaction."""
        _store.add_event(
            s,
            deployment_id,
            at=d.updated_at or self._clock(),
            revision=d.revision,
            kind=kind,
            actor=ctx.actor,
            reason=reason,
            detail=detail,
        )
        self._audit.record(s, ctx, _target(d.name), revision=d.revision, reason=reason, **detail)
        emit(s, _stream_event(d, kind, reason, ctx.actor))

    # ------------------------------------------------------------------ changes
    def _change(
        self,
        ctx: AuditContext,
        name: str,
        kind: str,
        mutate: Mutation,
        *,
        needed: Role = Role.MEMBER,
        expected_revision: int | None = None,
        reason: str = "",
    ) -> Deployment:
        """Apply ``mutate`` to the stored deployment by compare-and-set on its revision.

        A lost race re-reads and re-applies (so a promote racing a rollback meets the state
        the winner left and answers Conflict if it no longer applies).
        """
        principal = ctx.require_principal()
        _rules.check_deployment_name(name)
        ctx.target = _target(name)

        def work(s: Session) -> Deployment:
            ref, current = self._access(principal, _store.find(s, name), name, needed)
            if expected_revision is not None and current.revision != expected_revision:
                raise Conflict(
                    f"deployment {name!r} is at revision {current.revision}, "
                    f"not {expected_revision}"
                )
            changed, detail = mutate(current)
            stored = replace(changed, revision=current.revision + 1, updated_at=self._clock())
            if not _store.update(s, ref.id, current.revision, stored):
                raise RetryableConflict
            _store.drop_stats_before(s, ref.id, stored.revision)
            self._event(s, ctx, ref.id, stored, kind, reason or kind, detail)
            return stored

        return self._db.run(work)

    def set_canary(
        self,
        ctx: AuditContext,
        name: str,
        canary: WeightedUri,
        plan: RolloutPlan | None = None,
        *,
        expected_revision: int | None = None,
    ) -> Deployment:
        """Start a canary at ``canary.weight`` percent (replacing any canary); the controller
        moves it up by ``plan`` (default: the deployment's plan)."""
        principal = ctx.require_principal()
        ctx.target = _target(name)
        _rules.check_percent(canary.weight, "the canary's percentage")
        checked = None if plan is None else _rules.check_plan(plan.steps, plan.interval_s)
        _rules.check_deployment_name(name)
        self._read(principal, name)  # 404 before resolving: learn nothing about models
        route = self._resolve(principal, canary, RouteRole.CANARY)

        def mutate(d: Deployment) -> tuple[Deployment, dict[str, Any]]:
            kept = tuple(r for r in d.split.routes if r.role is not RouteRole.CANARY)
            split = _rules.check_split(TrafficSplit((*kept, route)))
            chosen = checked or d.plan
            state = _rules.initial_state(split, chosen, self._clock())
            detail = {"canary": route.concrete_uri, "percent": route.weight}
            return replace(d, split=split, plan=chosen, state=state), detail

        return self._change(ctx, name, "canary", mutate, expected_revision=expected_revision)

    def set_shadows(
        self, ctx: AuditContext, name: str, shadows: Sequence[WeightedUri]
    ) -> Deployment:
        """Replace the deployment's shadows (empty: none)."""
        principal = ctx.require_principal()
        ctx.target = _target(name)
        for shadow in shadows:
            _rules.check_percent(shadow.weight, "a shadow's mirrored percentage")
        self._read(principal, name)
        routes = self._routes(principal, shadows, RouteRole.SHADOW)

        def mutate(d: Deployment) -> tuple[Deployment, dict[str, Any]]:
            kept = tuple(r for r in d.split.routes if r.role is not RouteRole.SHADOW)
            split = _rules.check_split(TrafficSplit((*kept, *routes)))
            return replace(d, split=split), {"shadows": [r.concrete_uri for r in routes]}

        return self._change(ctx, name, "shadows", mutate)

    def set_weights(
        self, ctx: AuditContext, name: str, primaries: Sequence[WeightedUri]
    ) -> Deployment:
        """Replace the primaries and their relative weights (A/B); a canary keeps its share."""
        principal = ctx.require_principal()
        ctx.target = _target(name)
        for weighted in primaries:
            _rules.check_weight(weighted.weight, what="a primary's weight")
        self._read(principal, name)
        routes = self._routes(principal, primaries, RouteRole.PRIMARY)

        def mutate(d: Deployment) -> tuple[Deployment, dict[str, Any]]:
            kept = tuple(r for r in d.split.routes if r.role is not RouteRole.PRIMARY)
            split = _rules.check_split(TrafficSplit((*routes, *kept)))
            return replace(d, split=split), {"routes": _describe(split)}

        return self._change(ctx, name, "weights", mutate)

    def promote(
        self, ctx: AuditContext, name: str, *, expected_revision: int | None = None
    ) -> Deployment:
        """Make the canary the primary at 100% now (Conflict: there is no canary)."""

        def mutate(d: Deployment) -> tuple[Deployment, dict[str, Any]]:
            return self._promoted(d, "promoted by hand")

        return self._change(
            ctx, name, "promote", mutate, expected_revision=expected_revision, reason="promoted"
        )

    def rollback(
        self,
        ctx: AuditContext,
        name: str,
        *,
        reason: str = "",
        expected_revision: int | None = None,
    ) -> Deployment:
        """Remove the canary now; its traffic goes back to the primaries (Conflict: none)."""
        why = (reason or "rolled back by hand")[:500]

        def mutate(d: Deployment) -> tuple[Deployment, dict[str, Any]]:
            return self._rolled_back(d, why)

        return self._change(
            ctx, name, "rollback", mutate, expected_revision=expected_revision, reason=why
        )

    def _promoted(self, d: Deployment, why: str) -> tuple[Deployment, dict[str, Any]]:
        canary = d.split.canary
        if canary is None:
            raise Conflict(f"deployment {d.name!r} has no canary to promote")
        state = RolloutState(RolloutPhase.PROMOTED, 0, 0, self._clock())
        detail = {"promoted": canary.concrete_uri, "why": why}
        return replace(d, split=_rules.promoted(d.split), state=state), detail

    def _rolled_back(self, d: Deployment, why: str) -> tuple[Deployment, dict[str, Any]]:
        canary = d.split.canary
        if canary is None:
            raise Conflict(f"deployment {d.name!r} has no canary to roll back")
        state = RolloutState(RolloutPhase.ROLLED_BACK, 0, 0, self._clock())
        detail = {"rolled_back": canary.concrete_uri, "why": why}
        return replace(d, split=_rules.rolled_back(d.split), state=state), detail

    def delete(self, ctx: AuditContext, name: str) -> None:
        """Delete the deployment with its events, statistics and samples (maintainer)."""
        principal = ctx.require_principal()
        _rules.check_deployment_name(name)
        ctx.target = _target(name)

        def work(s: Session) -> None:
            ref, current = self._access(
                principal, _store.find(s, name, lock=True), name, Role.MAINTAINER
            )
            _store.remove(s, ref.id)
            self._audit.record(s, ctx, ctx.target, revision=current.revision)

        self._db.run(work)
        logger.info("deployment %r deleted by %s", name, principal.name)

    def issue_token(
        self, ctx: AuditContext, name: str, token_name: str, expires_in: timedelta | None
    ) -> IssuedToken:
        """A token of the caller's that may call the models of deployment ``name`` and
        nothing else (give it to the deployment's callers; ``shamal serve --deployment``
        accepts it). The caller must be able to read the deployment.

        Raises:
            NotFound: no deployment ``name`` the caller can see.
        """
        principal = ctx.require_principal()
        self.get(principal, name)
        return self._security.issue_deployment_token(ctx, name, token_name, expires_in)

    # ------------------------------------------------------------------ reads
    def get(self, principal: Principal, name: str) -> Deployment:
        return self._read(principal, name)[1]

    def list_deployments(
        self, principal: Principal, *, limit: int = 100, after: str | None = None
    ) -> list[Deployment]:
        """By name; ``after``: the page after that name."""
        if not 1 <= limit <= MAX_LIST:
            raise InvalidParameter(f"limit must be between 1 and {MAX_LIST}")
        visible = None if principal.user.is_admin else frozenset(principal.team_ids.values())
        with self._db.unit_of_work(write=False) as s:
            return _store.list_deployments(s, visible, limit, after)

    def serving(
        self, principal: Principal, model_name: str, version: int, *, limit: int = 100
    ) -> list[Deployment]:
        """The deployments the caller may see that serve ``version`` of ``model_name`` (as a
        primary, the canary or a shadow), by name: lineage downstream of a model version.

        Raises:
            InvalidParameter: a limit outside 1..1000.
        """
        if not 1 <= limit <= MAX_LIST:
            raise InvalidParameter(f"limit must be between 1 and {MAX_LIST}")
        visible = None if principal.user.is_admin else frozenset(principal.team_ids.values())
        with self._db.unit_of_work(write=False) as s:
            return _store.serving(s, visible, model_name, version, limit)

    def events(self, principal: Principal, name: str, *, limit: int = 100) -> list[DeploymentEvent]:
        """The newest ``limit`` changes, oldest first."""
        if not 1 <= limit <= MAX_EVENTS:
            raise InvalidParameter(f"limit must be between 1 and {MAX_EVENTS}")
        ref, _ = self._read(principal, name)
        with self._db.unit_of_work(write=False) as s:
            return _store.events(s, ref.id, limit)

    def window(self, principal: Principal, name: str) -> dict[str, VersionStats]:
        """Statistics per version since the current revision began."""
        ref, current = self._read(principal, name)
        with self._db.unit_of_work(write=False) as s:
            return _store.window_stats(s, ref.id, current.revision)

    # ------------------------------------------------------------------ data plane
    def record_report(
        self,
        principal: Principal,
        name: str,
        revision: int,
        versions: Sequence[VersionReport],
        loads: LoadStatus | None = None,
    ) -> ReportOutcome:
        """Add a serve process's statistics to the window, then run the rollout controller.

        Statistics gathered under another revision than the current one are not counted
        (they describe another split), and neither is what ``loads`` says (a version that
        failed under an older revision may load under this one). A canary the serve process
        could not load is rolled back; one it is still loading is held. A decision other than
        ``hold`` is applied as an audited change by the controller, in the same transaction.
        """
        _rules.check_deployment_name(name)

        def work(s: Session) -> ReportOutcome:
            # The row lock serializes reports of one deployment (add-up of the window rows).
            found = _store.find(s, name, lock=True)
            ref, current = self._access(principal, found, name, Role.MEMBER)
            known = {r.version_key for r in current.split.routes}
            minute = self._clock().replace(second=0, microsecond=0)
            for report in versions:
                if report.version not in known or report.stats.requests <= 0:
                    continue
                if revision == current.revision:
                    _store.add_stats(s, ref.id, revision, report.version, report.stats)
                # Calls are calls whatever the split: the charts count every one.
                _store.add_minute_stats(s, ref.id, minute, report.version, report.stats)
            _store.drop_minute_stats_before(s, ref.id, minute - STATS_KEPT)
            window = _store.window_stats(s, ref.id, current.revision)
            self._record_breaches(s, ref.id, current, window)
            current_loads = loads if revision == current.revision else None
            decision = _rules.decide_rollout(current, window, self._clock(), current_loads)
            if decision.action is RolloutAction.HOLD:
                return ReportOutcome(current.revision, decision)
            stored = self._apply(s, principal.name, ref.id, current, decision)
            return ReportOutcome(stored.revision, decision)

        return self._db.run(work)

    def _record_breaches(
        self, s: Session, deployment_id: str, current: Deployment, window: dict[str, VersionStats]
    ) -> None:
        """A primary that breaks the SLO is recorded once per revision: a deployment event
        and ``slo_breached`` on the event stream, where monitors' policies, pipelines and
        webhooks pick it up (the split itself is left as it is: a person or a policy acts)."""
        breaches = _rules.primary_breaches(current, window)
        if not breaches:
            return
        seen = _store.breached_versions(s, deployment_id, current.revision)
        now = self._clock()
        for version, why in breaches:
            if version in seen:
                continue
            detail = {"version": version}
            _store.add_event(
                s,
                deployment_id,
                at=now,
                revision=current.revision,
                kind=SLO_BREACH,
                actor=CONTROLLER,
                reason=why,
                detail=detail,
            )
            team = current.team or None
            payload = {
                "deployment": current.name,
                "team": team,
                "revision": current.revision,
                "version": version,
                "reason": why,
            }
            subject = f"deployments:/{current.name}"
            emit(s, NewEvent(EventKind.SLO_BREACHED, subject, team, CONTROLLER, payload))
            logger.warning("deployment %r: %s", current.name, why)

    def _apply(
        self,
        s: Session,
        reporter: str,
        deployment_id: str,
        current: Deployment,
        decision: RolloutDecision,
    ) -> Deployment:
        now = self._clock()
        if decision.action is RolloutAction.ROLLBACK:
            changed, detail = self._rolled_back(current, decision.reason)
        elif decision.action is RolloutAction.PROMOTE:
            changed, detail = self._promoted(current, decision.reason)
        else:
            state = RolloutState(
                RolloutPhase.PROGRESSING, decision.canary_weight, decision.step_index, now
            )
            split = _rules.with_canary_weight(current.split, decision.canary_weight)
            changed, detail = (
                replace(current, split=split, state=state),
                {"percent": decision.canary_weight},
            )
        stored = replace(changed, revision=current.revision + 1, updated_at=now)
        if not _store.update(s, deployment_id, current.revision, stored):
            raise RetryableConflict
        _store.drop_stats_before(s, deployment_id, stored.revision)
        ctx = AuditContext(action=f"deployment.rollout.{decision.action.value}", actor=CONTROLLER)
        detail["reporter"] = reporter
        self._event(s, ctx, deployment_id, stored, decision.action.value, decision.reason, detail)
        logger.info("deployment %r: %s (%s)", current.name, decision.action, decision.reason)
        return stored

    def check_rollouts(self) -> int:
        """Run the controller over every progressing rollout on its current window; for a
        periodic task (a canary whose traffic stopped after its last report still moves on
        when its interval is up). Returns how many deployments changed."""
        with self._db.unit_of_work(write=False) as s:
            names = _store.progressing(s)
        changed = 0
        for name in names:

            def work(s: Session, name: str = name) -> bool:
                found = _store.find(s, name, lock=True)
                if found is None:
                    return False
                ref, current = found
                window = _store.window_stats(s, ref.id, current.revision)
                decision = _rules.decide_rollout(current, window, self._clock())
                if decision.action is RolloutAction.HOLD:
                    return False
                self._apply(s, "periodic check", ref.id, current, decision)
                return True

            changed += self._db.run(work)
        return changed

    def record_samples(
        self,
        principal: Principal,
        name: str,
        samples: Sequence[SampledRequest],
    ) -> int:
        """Keep sampled requests; returns how many were kept. Samples over 16 KiB as JSON (or
        holding NaN or infinity) are dropped; the deployment keeps the newest
        ``keep_samples``."""
        _rules.check_deployment_name(name)
        small = [sample for sample in samples if _fits(sample)]
        now = self._clock()

        def work(s: Session) -> int:
            ref, _ = self._access(principal, _store.find(s, name), name, Role.MEMBER)
            if small:
                _store.add_samples(s, ref.id, now, small, self._keep_samples)
            return len(small)

        return self._db.run(work)

    def record_labels(
        self, principal: Principal, name: str, labels: Sequence[Label]
    ) -> LabelsOutcome:
        """Store the true outcomes of served requests, by the request ids their callers sent
        (member of the deployment's team). A label posted again for a request replaces the
        first; labels whose request no kept sample has are stored too and reported as
        ``unmatched`` (their sample may still arrive; most requests are never sampled).

        Raises:
            InvalidParameter: a malformed label (nothing is stored).
        """
        _rules.check_deployment_name(name)
        checked = _rules.check_labels(labels)
        now = self._clock()

        def work(s: Session) -> LabelsOutcome:
            ref, _ = self._access(principal, _store.find(s, name), name, Role.MEMBER)
            unmatched = _store.add_labels(s, ref.id, now, checked, DEFAULT_KEEP_LABELS)
            return LabelsOutcome(stored=len(checked), unmatched=unmatched)

        return self._db.run(work)

    def _platform_read(
        self, read: Callable[[Session, str, int, int], _T], name: str, after: int, limit: int
    ) -> _T:
        """``read`` of the deployment named ``name`` past ``after``, without a caller's
        access check (the platform's own readers, whose access was checked before)."""
        _rules.check_deployment_name(name)
        if not 1 <= limit <= DEFAULT_KEEP_SAMPLES:
            raise InvalidParameter(f"limit must be between 1 and {DEFAULT_KEEP_SAMPLES}")
        with self._db.unit_of_work(write=False) as s:
            found = _store.find(s, name)
            if found is None:
                raise NotFound(f"Deployment {name!r} not found.")
            return read(s, found[0].id, after, limit)

    def samples_after(self, name: str, after: int, *, limit: int = 1000) -> list[Sample]:
        """The platform's own read (a monitor's, whose access was checked when it was made):
        the oldest ``limit`` samples newer than the sample of id ``after``, oldest first, each
        with its label if one was posted.

        Raises:
            NotFound: no deployment of that name.
        """
        return self._platform_read(_store.samples_after, name, after, limit)

    def labelled_after(
        self, name: str, after: int, *, limit: int = 1000
    ) -> list[tuple[int, Sample]]:
        """The platform's own read (a monitor's): samples whose label came after the label of
        id ``after``, in the order labels came, each with its label's id. A label whose
        sample is not kept is not among them.

        Raises:
            NotFound: no deployment of that name.
        """
        return self._platform_read(_store.labelled_after, name, after, limit)

    def stats_by_minute(
        self, principal: Principal, name: str, since: datetime
    ) -> list[tuple[datetime, str, VersionStats]]:
        """(minute, version, its calls) from ``since`` on, oldest first (viewer): what the
        latency and error charts draw. Minutes are kept for :data:`STATS_KEPT`."""
        ref, _ = self._read(principal, name)
        with self._db.unit_of_work(write=False) as s:
            return _store.minute_stats(s, ref.id, since)

    def samples(
        self, principal: Principal, name: str, *, limit: int = 100, before: int | None = None
    ) -> list[Sample]:
        """The newest ``limit`` samples, newest first (viewer); ``before``: the page of
        those older than the sample of that id."""
        if not 1 <= limit <= DEFAULT_KEEP_SAMPLES:
            raise InvalidParameter(f"limit must be between 1 and {DEFAULT_KEEP_SAMPLES}")
        ref, _ = self._read(principal, name)
        with self._db.unit_of_work(write=False) as s:
            return _store.samples(s, ref.id, limit, before)


def _stream_event(d: Deployment, kind: str, reason: str, actor: str) -> NewEvent:
    """A change as the event stream tells it: a rollback (by hand or by the controller) is
    ``deployment_rolled_back``; every other change ``deployment_changed``."""
    team = d.team or None
    about = {"deployment": d.name, "team": team, "revision": d.revision}
    if kind == RolloutAction.ROLLBACK.value:
        payload = {**about, "reason": reason}
        return NewEvent(
            EventKind.DEPLOYMENT_ROLLED_BACK, f"deployments:/{d.name}", team, actor, payload
        )
    payload = {**about, "change": kind}
    return NewEvent(EventKind.DEPLOYMENT_CHANGED, f"deployments:/{d.name}", team, actor, payload)


def _describe(split: TrafficSplit) -> list[str]:
    """The split in a line per route, for events and the audit log."""
    return [f"{r.role.value} {r.concrete_uri} weight {r.weight}" for r in split.routes]


def _fits(sample: SampledRequest) -> bool:
    """Whether a sample is small enough to keep, and plain JSON (no NaN or infinity)."""
    try:
        text = json.dumps([sample.inputs, sample.outputs], allow_nan=False)
        return len(text) <= MAX_SAMPLE_BYTES
    except (ValueError, TypeError):
        return False


def _refuse_hidden_name(principal: Principal, ref: _store.DeploymentRef, name: str) -> None:
    """A deploy on a name held by a deployment the caller cannot see is a create that finds the
    name taken: the answer any taken name gets, never a 404 that would tell an update from a
    create, and nothing of whose it is.

    Raises:
        AlreadyExists: the caller has no role in the team of the deployment named ``name``.
    """
    if principal.user.is_admin:
        return
    if ref.team_id is None or principal.role_in_team_id(ref.team_id) is None:
        raise AlreadyExists(f"a deployment named {name!r} exists already; pick a different name")
