"""DeploymentService on SQLite and PostgreSQL: deploy, changes, the controller, access, races."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from shamal.deployments import (
    LATENCY_SLOTS,
    Label,
    RolloutAction,
    RolloutPhase,
    RolloutPlan,
    RouteRole,
    Slo,
    VersionStats,
    latency_slot,
)
from shamal.deployments._entities import (
    DeploymentSpec,
    SampledRequest,
    VersionReport,
    WeightedUri,
)
from shamal.deployments._service import DeploymentService
from shamal.errors import Conflict, InvalidParameter, NotFound, PermissionDenied, ShamalError
from shamal.server import Platform
from tests.deployments.conftest import ManualClock, People

CHAMPION = WeightedUri("models:/fraud@champion")
SLO = Slo(max_error_rate=0.05, max_p99_ms=50.0, min_requests=20)
PLAN = RolloutPlan((10, 50), 60.0)


def _spec(**changes: Any) -> DeploymentSpec:
    base: dict[str, Any] = {
        "primaries": (CHAMPION,),
        "canary": WeightedUri("models:/fraud/2", 10),
        "slo": SLO,
        "plan": PLAN,
    }
    return DeploymentSpec(**{**base, **changes})


def _report(version: str, requests: int, errors: int = 0, ms: float = 5.0) -> VersionReport:
    counts = [0] * LATENCY_SLOTS
    counts[latency_slot(ms)] = requests
    return VersionReport(version, VersionStats(requests, errors, tuple(counts)))


def _actions(platform: Platform, prefix: str = "deployment.") -> list[tuple[str, str, str]]:
    entries = platform.audit.entries(limit=200)
    return [
        (e.action, e.actor, e.outcome) for e in reversed(entries) if e.action.startswith(prefix)
    ]


def test_deploy_resolves_uris_and_redeploy_makes_a_new_revision(
    service: DeploymentService, people: People, platform: Platform
) -> None:
    made = service.deploy(people.ctx("mo", "deployment.deploy"), "fraud-api", _spec(canary=None))
    assert (made.name, made.team, made.revision, made.state.phase) == (
        "fraud-api",
        "red",
        1,
        RolloutPhase.STABLE,
    )
    (route,) = made.split.routes
    assert (route.model_name, route.version, route.uri) == ("fraud", 1, "models:/fraud@champion")
    again = service.deploy(
        people.ctx("mo", "deployment.deploy"),
        "fraud-api",
        _spec(shadows=(WeightedUri("models:/fraud/3", 50),)),
    )
    assert again.revision == 2
    assert again.state.phase is RolloutPhase.PROGRESSING
    assert again.created_at == made.created_at
    assert [(r.role, r.version, r.weight) for r in again.split.routes] == [
        (RouteRole.PRIMARY, 1, 100),
        (RouteRole.CANARY, 2, 10),
        (RouteRole.SHADOW, 3, 50),
    ]
    events = service.events(people.principals["vi"], "fraud-api")
    assert [(e.kind, e.revision, e.actor) for e in events] == [
        ("create", 1, "mo"),
        ("update", 2, "mo"),
    ]
    assert _actions(platform) == [("deployment.deploy", "mo", "ok")] * 2
    assert [d.name for d in service.list_deployments(people.principals["vi"])] == ["fraud-api"]
    assert service.list_deployments(people.principals["bo"]) == []


def test_healthy_canary_steps_up_and_is_promoted(
    service: DeploymentService, people: People, clock: ManualClock, platform: Platform
) -> None:
    d = service.deploy(people.ctx("mo"), "fraud-api", _spec())
    mo = people.principals["mo"]
    held = service.record_report(mo, "fraud-api", d.revision, [_report("2", 30), _report("1", 300)])
    assert (held.decision.action, held.revision) == (RolloutAction.HOLD, 1)
    assert "healthy for 0 s" in held.decision.reason
    clock.advance(61)
    stepped = service.record_report(mo, "fraud-api", d.revision, [])
    assert (stepped.decision.action, stepped.revision) == (RolloutAction.STEP, 2)
    now = service.get(mo, "fraud-api")
    assert now.split.canary is not None
    assert (now.split.canary.weight, now.state.canary_weight) == (50, 50)
    # Reports made under the old revision describe the old split: not counted.
    clock.advance(61)
    stale = service.record_report(mo, "fraud-api", 1, [_report("2", 500)])
    assert "0 of the 20" in stale.decision.reason
    assert service.window(mo, "fraud-api") == {}
    done = service.record_report(mo, "fraud-api", 2, [_report("2", 25)])
    assert (done.decision.action, done.revision) == (RolloutAction.PROMOTE, 3)
    final = service.get(mo, "fraud-api")
    assert final.state.phase is RolloutPhase.PROMOTED
    assert [(r.role, r.version, r.weight) for r in final.split.routes] == [
        (RouteRole.PRIMARY, 2, 100)
    ]
    kinds = [(e.kind, e.actor) for e in service.events(mo, "fraud-api")]
    assert kinds == [
        ("create", "mo"),
        ("step", "rollout-controller"),
        ("promote", "rollout-controller"),
    ]
    controller = [a for a in _actions(platform) if a[1] == "rollout-controller"]
    assert controller == [
        ("deployment.rollout.step", "rollout-controller", "ok"),
        ("deployment.rollout.promote", "rollout-controller", "ok"),
    ]


@pytest.mark.parametrize(
    ("report", "why"),
    [(_report("2", 40, errors=3), "error rate 7.50%"), (_report("2", 40, ms=200.0), "p99")],
)
def test_breaching_canary_is_rolled_back(
    service: DeploymentService, people: People, report: VersionReport, why: str
) -> None:
    service.deploy(people.ctx("mo"), "fraud-api", _spec())
    mo = people.principals["mo"]
    outcome = service.record_report(mo, "fraud-api", 1, [report])
    assert outcome.decision.action is RolloutAction.ROLLBACK
    assert why in outcome.decision.reason
    after = service.get(mo, "fraud-api")
    assert (after.revision, after.state.phase, after.split.canary) == (
        2,
        RolloutPhase.ROLLED_BACK,
        None,
    )
    last = service.events(mo, "fraud-api")[-1]
    assert (last.kind, last.detail["rolled_back"]) == ("rollback", "models:/fraud/2")
    assert why in last.reason


def test_few_requests_hold_even_when_failing(service: DeploymentService, people: People) -> None:
    service.deploy(people.ctx("mo"), "fraud-api", _spec())
    mo = people.principals["mo"]
    for _ in range(3):
        outcome = service.record_report(mo, "fraud-api", 1, [_report("2", 6, errors=6)])
        assert outcome.decision.action is RolloutAction.HOLD
    assert service.window(mo, "fraud-api")["2"].requests == 18
    breach = service.record_report(mo, "fraud-api", 1, [_report("2", 2, errors=2)])
    assert breach.decision.action is RolloutAction.ROLLBACK  # 20 requests: the SLO applies


def test_changes_by_hand_and_expected_revisions(service: DeploymentService, people: People) -> None:
    service.deploy(people.ctx("mo"), "fraud-api", _spec(canary=None))
    ab = service.set_weights(
        people.ctx("mo"),
        "fraud-api",
        [WeightedUri("models:/fraud/1", 70), WeightedUri("models:/fraud/3", 30)],
    )
    assert ab.split.shares() == pytest.approx({1: 0.7, 3: 0.3})
    canary = service.set_canary(people.ctx("mo"), "fraud-api", WeightedUri("models:/fraud/2", 20))
    assert canary.split.shares() == pytest.approx({1: 0.56, 3: 0.24, 2: 0.2})
    with pytest.raises(Conflict):
        service.promote(people.ctx("mo"), "fraud-api", expected_revision=2)
    promoted = service.promote(people.ctx("mo"), "fraud-api", expected_revision=3)
    assert [(r.version, r.role) for r in promoted.split.routes] == [(2, RouteRole.PRIMARY)]
    with pytest.raises(Conflict):
        service.rollback(people.ctx("mo"), "fraud-api")
    shadowed = service.set_shadows(
        people.ctx("mo"), "fraud-api", [WeightedUri("models:/fraud/1", 100)]
    )
    assert [r.version for r in shadowed.split.shadows] == [1]
    assert shadowed.revision == 5


def test_access_by_role_and_team(service: DeploymentService, people: People) -> None:
    service.deploy(people.ctx("mo"), "fraud-api", _spec())
    with pytest.raises(PermissionDenied):
        service.promote(people.ctx("vi"), "fraud-api")
    with pytest.raises(PermissionDenied):
        service.record_report(people.principals["vi"], "fraud-api", 1, [])
    with pytest.raises(NotFound):
        service.get(people.principals["bo"], "fraud-api")
    with pytest.raises(NotFound):
        service.rollback(people.ctx("bo"), "fraud-api")
    with pytest.raises(PermissionDenied):
        service.delete(people.ctx("mo"), "fraud-api")
    # Another team's model is as good as absent; a member of no team names no team.
    with pytest.raises(NotFound):
        service.deploy(people.ctx("mo"), "x", _spec(primaries=(WeightedUri("models:/blues/1"),)))
    with pytest.raises(InvalidParameter):
        service.deploy(people.ctx("otto"), "y", _spec(canary=None))
    service.delete(people.ctx("rita"), "fraud-api")
    with pytest.raises(NotFound):
        service.get(people.principals["admin"], "fraud-api")


@pytest.mark.parametrize(
    "spec",
    [
        _spec(primaries=(CHAMPION, WeightedUri("models:/fraud/1"))),  # one version twice
        _spec(canary=WeightedUri("models:/fraud/1", 10)),  # canary = primary
        _spec(primaries=(CHAMPION,), canary=WeightedUri("models:/fraud/9", 5)),  # no such version
        _spec(plan=RolloutPlan((), 60.0)),
        _spec(slo=Slo(2.0, 10.0, 10)),
        _spec(sticky_header="bad header"),
        _spec(sample_rate=float("nan")),
        _spec(canary=WeightedUri("models:/fraud/2", 0)),
        _spec(primaries=(WeightedUri("models:/fraud@x' OR 1=1 --"),)),
    ],
)
def test_bad_specs_are_refused_and_store_nothing(
    service: DeploymentService, people: People, spec: DeploymentSpec
) -> None:
    with pytest.raises((InvalidParameter, NotFound)):
        service.deploy(people.ctx("mo"), "fraud-api", spec)
    assert service.list_deployments(people.principals["admin"]) == []


def test_samples_are_bounded_oldest_dropped(service: DeploymentService, people: People) -> None:
    service.deploy(people.ctx("mo"), "fraud-api", _spec())
    mo = people.principals["mo"]
    rows = [
        SampledRequest(1, "1", False, {"x": {"data": [i]}}, {"y": {"data": [2 * i]}})
        for i in range(8)
    ]
    assert service.record_samples(mo, "fraud-api", rows[:3]) == 3
    huge = SampledRequest(1, "2", True, {"x": {"data": ["a" * 40_000]}}, {})
    nan = SampledRequest(1, "2", True, {"x": {"data": [float("nan")]}}, {})
    assert service.record_samples(mo, "fraud-api", [*rows[3:], huge, nan]) == 5
    kept = service.samples(people.principals["vi"], "fraud-api")
    assert [s.inputs["x"]["data"][0] for s in kept] == [7, 6, 5, 4, 3]
    odd = SampledRequest(1, "2", True, {"t\x00": {"data": ["a\x00b", "\u2028", None]}}, {})
    assert service.record_samples(mo, "fraud-api", [odd]) == 1
    newest = service.samples(mo, "fraud-api", limit=1)[0]
    assert (newest.inputs, newest.shadow) == ({"t\x00": {"data": ["a\x00b", "\u2028", None]}}, True)
    with pytest.raises(PermissionDenied):
        service.record_samples(people.principals["vi"], "fraud-api", rows)


def _sampled(request_id: str | None, x: float) -> SampledRequest:
    return SampledRequest(1, "1", False, {"x": {"data": [x]}}, {}, request_id=request_id)


def test_labels_join_samples_by_request_id_whenever_they_arrive(
    service: DeploymentService, people: People, clock: ManualClock
) -> None:
    service.deploy(people.ctx("mo"), "fraud-api", _spec())
    mo = people.principals["mo"]
    service.record_samples(mo, "fraud-api", [_sampled("r1", 1.0), _sampled(None, 2.0)])
    early = service.record_labels(mo, "fraud-api", [Label("r1", 0), Label("r3", [1, 0])])
    assert (early.stored, early.unmatched) == (2, ("r3",))  # r3's sample has not come yet
    clock.advance(5)
    service.record_samples(mo, "fraud-api", [_sampled("r3", 3.0)])
    again = service.record_labels(mo, "fraud-api", [Label("r1", 1)])  # a corrected label
    assert (again.stored, again.unmatched) == (1, ())
    found = service.samples_after("fraud-api", 0)
    assert [(s.inputs["x"]["data"][0], s.request_id, s.label) for s in found] == [
        (1.0, "r1", 1),
        (2.0, None, None),
        (3.0, "r3", [1, 0]),
    ]
    assert found[0].labelled_at is not None
    assert found[1].labelled_at is None
    assert [s.request_id for s in service.samples_after("fraud-api", found[0].id, limit=1)] == [
        None
    ]
    listed = service.samples(people.principals["vi"], "fraud-api")
    assert [s.label for s in listed] == [[1, 0], None, 1]  # newest first, labels joined


@pytest.mark.parametrize(
    "bad",
    [
        [Label("", 1)],
        [Label("x" * 129, 1)],
        [Label("has space", 1)],
        [Label("r1", float("nan"))],
        [Label("r1", float("inf"))],
        [Label("r1", None)],
        [Label("r1", {"nested": 1})],
        [Label("r1", [])],
        [Label("r1", ["a" * 300])],
        [Label("r1", 1), Label("r1", 2)],
        [Label(f"r{i}", 1) for i in range(1000)],  # 1001 with the good one
    ],
)
def test_a_bad_label_post_is_refused_whole(
    service: DeploymentService, people: People, bad: list[Label]
) -> None:
    service.deploy(people.ctx("mo"), "fraud-api", _spec())
    mo = people.principals["mo"]
    service.record_samples(mo, "fraud-api", [_sampled("r1", 1.0)])
    with pytest.raises(InvalidParameter):
        service.record_labels(mo, "fraud-api", [Label("ok", 1), *bad])
    assert [s.label for s in service.samples_after("fraud-api", 0)] == [None]
    assert service.record_labels(mo, "fraud-api", [Label("ok", 1)]).unmatched == ("ok",)


def test_only_members_post_labels(service: DeploymentService, people: People) -> None:
    service.deploy(people.ctx("mo"), "fraud-api", _spec())
    with pytest.raises(PermissionDenied):
        service.record_labels(people.principals["vi"], "fraud-api", [Label("r1", 1)])
    with pytest.raises(NotFound):
        service.record_labels(people.principals["mo"], "nowhere", [Label("r1", 1)])
    with pytest.raises(NotFound):
        service.samples_after("nowhere", 0)


def _race(workers: list[Callable[[], object]]) -> list[object]:
    barrier = threading.Barrier(len(workers))
    results: list[object] = [None] * len(workers)

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = workers[i]()
        except ShamalError as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(workers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def test_concurrent_promote_and_rollback_never_both_win(
    service: DeploymentService, people: People
) -> None:
    service.deploy(people.ctx("mo"), "fraud-api", _spec())
    workers: list[Callable[[], object]] = []
    for i in range(8):
        if i % 2:
            workers.append(lambda: service.promote(people.ctx("mo"), "fraud-api"))
        else:
            workers.append(lambda: service.rollback(people.ctx("mo"), "fraud-api"))
    results = _race(workers)
    winners = [r for r in results if not isinstance(r, ShamalError)]
    assert len(winners) == 1, results
    assert all(isinstance(r, Conflict) for r in results if r not in winners)
    final = service.get(people.principals["mo"], "fraud-api")
    assert final.revision == 2
    assert final.split.canary is None
    assert final.state.phase in (RolloutPhase.PROMOTED, RolloutPhase.ROLLED_BACK)
    assert len(service.events(people.principals["mo"], "fraud-api")) == 2


def test_concurrent_reports_add_up(service: DeploymentService, people: People) -> None:
    service.deploy(people.ctx("mo"), "fraud-api", _spec(slo=Slo(0.05, 50.0, 10_000)))
    mo = people.principals["mo"]
    results = _race(
        [lambda: service.record_report(mo, "fraud-api", 1, [_report("2", 7)]) for _ in range(6)]
    )
    assert not [r for r in results if isinstance(r, ShamalError)]
    assert service.window(mo, "fraud-api")["2"].requests == 42


def test_periodic_check_moves_a_rollout_whose_traffic_stopped(
    service: DeploymentService, people: People, clock: ManualClock
) -> None:
    service.deploy(people.ctx("mo"), "fraud-api", _spec())
    service.deploy(people.ctx("mo"), "quiet", _spec(canary=None))
    mo = people.principals["mo"]
    service.record_report(mo, "fraud-api", 1, [_report("2", 30)])
    assert service.check_rollouts() == 0  # healthy, but not for the interval yet
    clock.advance(61)
    assert service.check_rollouts() == 1
    stepped = service.get(mo, "fraud-api")
    assert (stepped.revision, stepped.state.canary_weight) == (2, 50)
    last = service.events(mo, "fraud-api")[-1]
    assert (last.kind, last.actor, last.detail["reporter"]) == (
        "step",
        "rollout-controller",
        "periodic check",
    )
    clock.advance(61)
    assert service.check_rollouts() == 0  # a new window: no requests yet
    assert service.get(mo, "quiet").revision == 1


def test_a_deployment_names_its_feature_service_and_the_store_sees_it_in_use(
    service: DeploymentService, people: People
) -> None:
    assert service.feature_services_in_use() == frozenset()
    made = service.deploy(
        people.ctx("mo", "deployment.deploy"),
        "fraud-api",
        _spec(canary=None, feature_service="fraud_features"),
    )
    assert made.feature_service == "fraud_features"
    assert service.feature_services_in_use() == frozenset({"fraud_features"})
    with pytest.raises(InvalidParameter, match="feature service"):
        service.deploy(
            people.ctx("mo", "deployment.deploy"),
            "other-api",
            _spec(canary=None, feature_service="Bad Name; DROP"),
        )
    service.deploy(people.ctx("mo", "deployment.deploy"), "fraud-api", _spec(canary=None))
    assert service.feature_services_in_use() == frozenset()


def test_calls_are_kept_per_minute_whatever_the_revision_and_for_a_week(
    service: DeploymentService, people: People, clock: ManualClock
) -> None:
    d = service.deploy(people.ctx("mo"), "fraud-api", _spec())
    mo, vi = people.principals["mo"], people.principals["vi"]
    start = clock().replace(second=0, microsecond=0)
    service.record_report(mo, "fraud-api", d.revision, [_report("1", 10, errors=1, ms=50)])
    service.record_report(mo, "fraud-api", d.revision, [_report("1", 5), _report("2", 4)])
    clock.advance(61)
    again = service.deploy(people.ctx("mo"), "fraud-api", _spec())
    assert again.revision > d.revision
    # Under a revision that is no longer current: not in the window, but calls all the same.
    service.record_report(mo, "fraud-api", d.revision, [_report("1", 7)])
    minutes = service.stats_by_minute(vi, "fraud-api", start)
    assert [(m - start, v, s.requests, s.errors) for m, v, s in minutes] == [
        (timedelta(0), "1", 15, 1),
        (timedelta(0), "2", 4, 0),
        (timedelta(minutes=1), "1", 7, 0),
    ]
    assert sum(minutes[0][2].latency_counts) == 15  # the histograms add up too
    assert (
        service.stats_by_minute(vi, "fraud-api", start + timedelta(minutes=1))[0][2].requests == 7
    )
    clock.advance(7 * 24 * 3600 + 61)
    service.record_report(mo, "fraud-api", again.revision, [_report("1", 1)])
    kept = service.stats_by_minute(vi, "fraud-api", start)
    assert [s.requests for _, _, s in kept] == [1]  # a week later the old minutes are gone
    with pytest.raises(NotFound):
        service.stats_by_minute(people.principals["bo"], "fraud-api", start)
