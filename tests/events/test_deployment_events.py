"""Deployments record their events in the transaction of the change: deploy, traffic changes,
rollbacks (by hand and by the rollout controller). A change that fails leaves no event."""

from __future__ import annotations

from typing import Any

import pytest

from shamal.deployments import RolloutAction, RolloutPlan, Slo
from shamal.deployments._entities import DeploymentSpec, WeightedUri
from shamal.deployments._service import DeploymentService
from shamal.errors import Conflict, NotFound
from shamal.events import Event, EventKind, EventService
from shamal.server import Platform
from tests.deployments.conftest import People, registry, service
from tests.deployments.test_service import _report

__all__ = ["registry", "service"]

SPEC: dict[str, Any] = {
    "primaries": (WeightedUri("models:/fraud@champion"),),
    "canary": WeightedUri("models:/fraud/2", 10),
    "slo": Slo(max_error_rate=0.05, max_p99_ms=50.0, min_requests=20),
    "plan": RolloutPlan((10, 50), 60.0),
}


def _seen(events: EventService, people: People) -> list[tuple[EventKind, dict[str, Any]]]:
    page = events.list_events(people.principals["admin"])
    return [(e.kind, dict(e.payload)) for e in page.events if e.subject.startswith("deploy")]


def _events(events: EventService, people: People) -> list[Event]:
    return [
        e
        for e in events.list_events(people.principals["vi"]).events
        if e.subject.startswith("deploy")
    ]


def test_changes_and_rollbacks_are_announced(
    service: DeploymentService, events: EventService, people: People, platform: Platform
) -> None:
    service.deploy(people.ctx("mo"), "fraud-api", DeploymentSpec(**SPEC))
    service.set_canary(people.ctx("mo"), "fraud-api", WeightedUri("models:/fraud/3", 20))
    service.rollback(people.ctx("mo"), "fraud-api", reason="looks wrong")
    seen = _seen(events, people)
    assert seen == [
        (
            EventKind.DEPLOYMENT_CHANGED,
            {"deployment": "fraud-api", "team": "red", "revision": 1, "change": "create"},
        ),
        (
            EventKind.DEPLOYMENT_CHANGED,
            {"deployment": "fraud-api", "team": "red", "revision": 2, "change": "canary"},
        ),
        (
            EventKind.DEPLOYMENT_ROLLED_BACK,
            {"deployment": "fraud-api", "team": "red", "revision": 3, "reason": "looks wrong"},
        ),
    ]
    assert {e.subject for e in _events(events, people)} == {"deployments:/fraud-api"}


def test_the_controllers_rollback_is_announced(
    service: DeploymentService, events: EventService, people: People
) -> None:
    service.deploy(people.ctx("mo"), "fraud-api", DeploymentSpec(**SPEC))
    mo = people.principals["mo"]
    outcome = service.record_report(mo, "fraud-api", 1, [_report("2", 40, errors=3)])
    assert outcome.decision.action is RolloutAction.ROLLBACK
    kind, payload = _seen(events, people)[-1]
    assert kind is EventKind.DEPLOYMENT_ROLLED_BACK
    assert "error rate" in payload["reason"]
    assert _events(events, people)[-1].actor == "rollout-controller"


def test_a_change_that_fails_leaves_no_event(
    service: DeploymentService, events: EventService, people: People
) -> None:
    with pytest.raises(NotFound):
        service.deploy(
            people.ctx("mo"),
            "fraud-api",
            DeploymentSpec(**{**SPEC, "canary": WeightedUri("models:/fraud/9", 10)}),
        )
    service.deploy(people.ctx("mo"), "fraud-api", DeploymentSpec(**SPEC))
    with pytest.raises(Conflict):
        service.promote(people.ctx("mo"), "fraud-api", expected_revision=7)
    assert [k for k, _ in _seen(events, people)] == [EventKind.DEPLOYMENT_CHANGED]


def test_a_primary_breaking_the_slo_is_announced_once_per_revision(
    service: DeploymentService, events: EventService, people: People
) -> None:
    mo = people.principals["mo"]
    only = {**SPEC, "canary": None}
    d = service.deploy(people.ctx("mo"), "fraud-api", DeploymentSpec(**only))
    # Under the minimum of requests nothing is judged; then 10% errors break the 5% SLO.
    service.record_report(mo, "fraud-api", d.revision, [_report("1", 10, errors=5)])
    assert not [k for k, _ in _seen(events, people) if k is EventKind.SLO_BREACHED]
    service.record_report(mo, "fraud-api", d.revision, [_report("1", 90, errors=5)])
    service.record_report(mo, "fraud-api", d.revision, [_report("1", 50, errors=20)])
    breaches = [p for k, p in _seen(events, people) if k is EventKind.SLO_BREACHED]
    assert len(breaches) == 1, breaches  # once, however many reports repeat it
    assert breaches[0]["version"] == "1"
    assert breaches[0]["revision"] == d.revision
    assert "error rate" in breaches[0]["reason"]
    recorded = [e for e in service.events(mo, "fraud-api") if e.kind == "slo_breach"]
    assert [(e.revision, e.detail["version"]) for e in recorded] == [(d.revision, "1")]
    # A new revision is a new window: its own breach is announced again; slow calls count.
    changed = service.deploy(people.ctx("mo"), "fraud-api", DeploymentSpec(**only))
    service.record_report(mo, "fraud-api", changed.revision, [_report("1", 40, ms=400.0)])
    again = [p for k, p in _seen(events, people) if k is EventKind.SLO_BREACHED]
    assert [(p["revision"], "p99 latency" in p["reason"]) for p in again] == [
        (d.revision, False),
        (changed.revision, True),
    ]


def test_a_primary_within_its_slo_is_not_announced(
    service: DeploymentService, events: EventService, people: People
) -> None:
    mo = people.principals["mo"]
    d = service.deploy(people.ctx("mo"), "fraud-api", DeploymentSpec(**{**SPEC, "canary": None}))
    service.record_report(mo, "fraud-api", d.revision, [_report("1", 500, errors=20)])  # 4%
    assert not [k for k, _ in _seen(events, people) if k is EventKind.SLO_BREACHED]
