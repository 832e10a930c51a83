"""Monitors: created only on readable deployments, run on schedule (missed ticks coalesce),
never twice at once across servers, drift stored as series with its event and policy, and
failures recorded without stopping the loop."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select

from shamal.db.models import MonitorResultRow
from shamal.deployments._entities import DeploymentSpec, WeightedUri
from shamal.deployments._service import DeploymentService
from shamal.errors import Conflict, InvalidParameter, NotFound, PermissionDenied
from shamal.events import EventKind
from shamal.events import _store as events_store
from shamal.monitoring import MonitorService, MonitorSpec, parse_on_drift
from shamal.monitoring._service import POLICY_CONSUMER
from shamal.monitoring._store import claim, find
from shamal.pipelines import PipelineSpec
from shamal.server import Platform
from tests.monitoring.conftest import DEPLOYMENT, MODEL, ManualClock, People, send

HOUR = 3600


def _results(platform: Platform) -> int:
    with platform.db.unit_of_work(write=False) as s:
        return int(s.scalar(select(func.count()).select_from(MonitorResultRow)) or 0)


def _drift_events(platform: Platform, people: People) -> list[dict[str, object]]:
    page = platform.events.list_events(people.principals["admin"], limit=1000)
    return [dict(e.payload) for e in page.events if e.kind is EventKind.DRIFT_DETECTED]


@pytest.mark.usefixtures("reference")
def test_a_monitor_defaults_to_the_primary_versions_reference(
    monitors: MonitorService, people: People
) -> None:
    made = monitors.create(people.ctx("mo"), MonitorSpec(DEPLOYMENT, HOUR))
    assert (made.name, made.team, made.reference_model, made.reference_version) == (
        f"{DEPLOYMENT}-drift",
        "red",
        MODEL,
        1,
    )
    assert monitors.get(people.principals["vi"], made.name) == made
    assert [m.name for m in monitors.list_monitors(people.principals["bo"])] == []


@pytest.mark.usefixtures("reference")
def test_monitors_on_deployments_the_caller_cannot_read_are_refused(
    monitors: MonitorService, people: People, platform: Platform
) -> None:
    with pytest.raises(NotFound):  # another team's deployment is not there for them
        monitors.create(people.ctx("bo"), MonitorSpec(DEPLOYMENT, HOUR))
    with pytest.raises(NotFound):
        monitors.create(people.ctx("otto"), MonitorSpec(DEPLOYMENT, HOUR))
    with pytest.raises(PermissionDenied):  # a viewer reads the deployment, makes nothing
        monitors.create(people.ctx("vi"), MonitorSpec(DEPLOYMENT, HOUR))
    with pytest.raises(NotFound):
        monitors.create(people.ctx("mo"), MonitorSpec("no-such-api", HOUR))
    with pytest.raises(NotFound):  # version 2 has no reference profile
        monitors.create(people.ctx("mo"), MonitorSpec(DEPLOYMENT, HOUR, reference=(MODEL, 2)))
    with pytest.raises(InvalidParameter):
        monitors.create(people.ctx("mo"), MonitorSpec(DEPLOYMENT, HOUR, columns=("nope",)))
    spec = MonitorSpec(DEPLOYMENT, HOUR, on_drift=parse_on_drift("retrain:nope"))
    with pytest.raises(NotFound):
        monitors.create(people.ctx("mo"), spec)
    assert monitors.list_monitors(people.principals["admin"]) == []
    made = monitors.create(people.ctx("mo"), MonitorSpec(DEPLOYMENT, HOUR))
    with pytest.raises(NotFound):
        monitors.get(people.principals["bo"], made.name)
    with pytest.raises(NotFound):
        monitors.run_now(people.ctx("bo"), made.name)
    with pytest.raises(PermissionDenied):
        monitors.delete(people.ctx("mo"), made.name)  # maintainers delete
    monitors.delete(people.ctx("rita"), made.name)
    with pytest.raises(NotFound):
        monitors.get(people.principals["mo"], made.name)


@pytest.mark.usefixtures("reference")
def test_traffic_like_the_training_set_is_no_drift_and_shifted_traffic_is_drift(
    monitors: MonitorService,
    deployments: DeploymentService,
    people: People,
    platform: Platform,
    clock: ManualClock,
) -> None:
    made = monitors.create(people.ctx("mo"), MonitorSpec(DEPLOYMENT, HOUR, window=5000))
    assert send(deployments, people, samples=20) == 20
    calm = monitors.run_now(people.ctx("mo"), made.name).result
    assert calm is not None
    assert not calm.drifted
    assert calm.report["bands"]["amount"]["outside"] is False
    assert (calm.samples, calm.rows) == (20, 800)
    assert _drift_events(platform, people) == []
    clock.advance(60)
    send(deployments, people, samples=20, amount_shift=40.0, seed=9)
    shifted = monitors.run_now(people.ctx("mo"), made.name).result
    assert shifted is not None
    assert shifted.drifted
    assert shifted.first_sample > calm.last_sample  # the cursor moved: nothing read twice
    drifted = {p["column"] for p in shifted.report["columns"] if p["drifted"]}
    assert "amount" in drifted
    assert shifted.report["bands"]["amount"]["outside"] is True
    (event,) = _drift_events(platform, people)
    assert event["monitor"] == made.name
    assert event["deployment"] == DEPLOYMENT
    assert event["result"] == shifted.id
    assert "amount" in event["features"]
    assert (event["model"], event["version"], event["team"]) == (MODEL, 1, "red")
    # The series: one point per column per run, oldest first.
    series = monitors.series(people.principals["vi"], made.name, column="amount")
    assert [p.drifted for p in series] == [False, True]
    assert [p.result_id for p in series] == [calm.id, shifted.id]
    again = monitors.run_now(people.ctx("mo"), made.name)
    assert (again.result, again.reason) == (None, "no new samples")
    assert _results(platform) == 2


@pytest.mark.usefixtures("reference")
def test_missed_ticks_coalesce_into_one_run_on_the_schedules_grid(
    monitors: MonitorService, deployments: DeploymentService, people: People, clock: ManualClock
) -> None:
    made = monitors.create(people.ctx("mo"), MonitorSpec(DEPLOYMENT, HOUR))
    send(deployments, people, samples=3)
    assert monitors.run_due() == 0  # not due yet
    clock.advance(3.5 * HOUR)  # three ticks missed
    assert monitors.run_due() == 1
    assert monitors.run_due() == 0
    after = monitors.get(people.principals["mo"], made.name)
    assert after.next_run_at > clock.now
    assert (after.next_run_at - made.next_run_at).total_seconds() == 3 * HOUR
    assert len(monitors.results(people.principals["mo"], made.name)) == 1


@pytest.mark.usefixtures("reference")
def test_a_paused_monitor_is_not_run_on_schedule(
    monitors: MonitorService, deployments: DeploymentService, people: People, clock: ManualClock
) -> None:
    made = monitors.create(people.ctx("mo"), MonitorSpec(DEPLOYMENT, HOUR))
    send(deployments, people, samples=2)
    monitors.pause(people.ctx("mo"), made.name)
    clock.advance(2 * HOUR)
    assert monitors.run_due() == 0
    resumed = monitors.resume(people.ctx("mo"), made.name)
    assert resumed.next_run_at > clock.now  # missed ticks are not owed
    clock.advance(HOUR)
    assert monitors.run_due() == 1


@pytest.mark.usefixtures("reference")
def test_a_run_held_by_another_server_is_not_run_again_until_its_lease_ends(
    monitors: MonitorService,
    other_server: MonitorService,
    deployments: DeploymentService,
    people: People,
    platform: Platform,
    clock: ManualClock,
) -> None:
    made = monitors.create(people.ctx("mo"), MonitorSpec(DEPLOYMENT, HOUR))
    send(deployments, people, samples=3)
    clock.advance(HOUR)
    with platform.db.unit_of_work(write=False) as s:
        found = find(s, made.name)
    assert found is not None
    # Server B's run is under way (it took the lease and has not finished).
    until = clock.now + timedelta(minutes=10)
    assert platform.db.run(
        lambda s: claim(s, found[0].id, "server-b", clock.now, until, scheduled=True)
    )
    assert monitors.run_due() == 0
    with pytest.raises(Conflict):
        monitors.run_now(people.ctx("mo"), made.name)
    assert _results(platform) == 0
    clock.advance(11 * 60)  # B died: its lease runs out and A takes the monitor on
    assert monitors.run_due() == 1
    assert _results(platform) == 1
    assert other_server.run_due() == 0  # B, back, finds it run and not due


@pytest.mark.usefixtures("reference")
def test_two_servers_ticking_together_run_a_monitor_once(
    monitors: MonitorService,
    other_server: MonitorService,
    deployments: DeploymentService,
    people: People,
    platform: Platform,
    clock: ManualClock,
) -> None:
    monitors.create(people.ctx("mo"), MonitorSpec(DEPLOYMENT, HOUR))
    send(deployments, people, samples=5)
    clock.advance(HOUR)
    start = threading.Barrier(2)
    ran: list[int] = []

    def tick(service: MonitorService) -> None:
        start.wait()
        ran.append(service.run_due())

    threads = [threading.Thread(target=tick, args=(s,)) for s in (monitors, other_server)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(ran) == [0, 1]
    assert _results(platform) == 1


@pytest.mark.usefixtures("reference")
def test_a_failing_monitor_records_its_error_and_the_others_still_run(
    monitors: MonitorService,
    deployments: DeploymentService,
    people: People,
    platform: Platform,
    clock: ManualClock,
) -> None:
    broken = monitors.create(people.ctx("mo"), MonitorSpec(DEPLOYMENT, HOUR, name="broken"))
    deployments.deploy(
        people.ctx("mo"),
        "second-api",
        DeploymentSpec(primaries=(WeightedUri(f"models:/{MODEL}/1"),), team="red"),
    )
    healthy = monitors.create(people.ctx("mo"), MonitorSpec("second-api", HOUR, name="healthy"))
    # The deployment goes: its monitor's runs fail (recorded), the other's still run.
    deployments.delete(people.ctx("rita"), DEPLOYMENT)
    clock.advance(HOUR)
    assert monitors.run_due() == 2
    failed = monitors.get(people.principals["mo"], broken.name)
    assert failed.last_error is not None
    assert "fraud-api" in failed.last_error
    assert failed.next_run_at > clock.now  # the schedule moved on: no hot loop
    assert failed.cursor == 0
    ok = monitors.get(people.principals["mo"], healthy.name)
    assert ok.last_error is None
    assert ok.last_run_at == clock.now


@pytest.mark.usefixtures("reference")
def test_nan_infinity_and_type_changed_values_complete_the_run_and_are_reported(
    monitors: MonitorService, deployments: DeploymentService, people: People
) -> None:
    made = monitors.create(people.ctx("mo"), MonitorSpec(DEPLOYMENT, HOUR))
    hostile: list[object] = [100.0, "NaN", "Infinity", "-Infinity", None, "abc", {"x": 1}, 1e308]
    kept = send(deployments, people, samples=4, amounts=hostile * 4)
    assert kept == 4
    result = monitors.run_now(people.ctx("mo"), made.name).result
    assert result is not None
    assert result.samples == 4  # nothing lost
    issues = {(i["column"], i["kind"]) for i in result.report["quality"]}
    assert ("amount", "invalid_value") in issues
    assert ("amount", "null_rate") in issues  # NaN, None and the invalid ones
    (changed,) = [i for i in result.report["quality"] if i["kind"] == "invalid_value"]
    assert changed["value"] == pytest.approx(2 / 8)
    assert monitors.get(people.principals["mo"], made.name).cursor == result.last_sample


@pytest.mark.usefixtures("reference")
def test_drift_starts_the_retraining_pipeline_once(
    monitors: MonitorService,
    deployments: DeploymentService,
    people: People,
    platform: Platform,
) -> None:
    spec = PipelineSpec.from_json(
        {
            "name": "retrain-fraud",
            "team": "red",
            "params": {"reason": "by hand"},
            "steps": [{"name": "a", "command": ["true"]}],
        }
    )
    platform.pipelines.register(people.ctx("mo"), spec)
    with pytest.raises(InvalidParameter):  # parameters are for a retraining policy only
        monitors.create(people.ctx("mo"), MonitorSpec(DEPLOYMENT, HOUR, retrain_params={"a": 1}))
    made = monitors.create(
        people.ctx("mo"),
        MonitorSpec(
            DEPLOYMENT,
            HOUR,
            on_drift=parse_on_drift("retrain:retrain-fraud"),
            retrain_params={"reason": "drift"},
        ),
    )
    send(deployments, people, samples=20, amount_shift=50.0)
    result = monitors.run_now(people.ctx("mo"), made.name).result
    assert result is not None
    assert result.drifted
    (action,) = result.actions
    assert action["action"] == "retrain"
    assert action["status"] == "started"
    runs = platform.pipelines.list_runs(people.principals["mo"], pipeline="retrain-fraud")
    assert len(runs) == 1
    assert "drift" in runs[0].trigger
    assert runs[0].params == {"reason": "drift"}
    # The policy applied again for the same result starts nothing new.
    again = monitors._apply_policy(monitors.get(people.principals["mo"], made.name), result)
    assert again[0]["status"] == "already started"
    assert len(platform.pipelines.list_runs(people.principals["mo"], pipeline="retrain-fraud")) == 1
    stored = monitors.results(people.principals["mo"], made.name)[0]
    assert stored.actions == result.actions


@pytest.mark.usefixtures("reference")
def test_a_policy_a_dying_server_left_undone_is_carried_out_once_by_the_next_call(
    monitors: MonitorService,
    other_server: MonitorService,
    deployments: DeploymentService,
    people: People,
    platform: Platform,
) -> None:
    spec = {"name": "retrain-fraud", "team": "red", "steps": [{"name": "a", "command": ["true"]}]}
    platform.pipelines.register(people.ctx("mo"), PipelineSpec.from_json(spec))
    made = monitors.create(
        people.ctx("mo"),
        MonitorSpec(DEPLOYMENT, HOUR, on_drift=parse_on_drift("retrain:retrain-fraud")),
    )
    # A server holds the policy consumer's lease and dies before acting.
    now = datetime.now(UTC)
    with platform.db.unit_of_work() as s:
        events_store.ensure_consumer(s, POLICY_CONSUMER, now)
        held = events_store.claim_consumer(s, POLICY_CONSUMER, "dead", now, now + timedelta(days=1))
        assert held is not None
    send(deployments, people, samples=20, amount_shift=50.0)
    result = monitors.run_now(people.ctx("mo"), made.name).result
    assert result is not None
    assert result.drifted
    assert result.actions == ()  # the drift is recorded; its policy waits for the stream
    assert platform.pipelines.list_runs(people.principals["mo"], pipeline="retrain-fraud") == []
    # Its lease runs out: the next call (either server's loop) carries the policy out, once.
    with platform.db.unit_of_work() as s:
        assert events_store.release_consumer(s, POLICY_CONSUMER, "dead", now, None)
    assert other_server.apply_policies() == 1
    assert monitors.apply_policies() == 0
    runs = platform.pipelines.list_runs(people.principals["mo"], pipeline="retrain-fraud")
    assert len(runs) == 1
    (stored,) = monitors.results(people.principals["mo"], made.name)
    assert [a["status"] for a in stored.actions] == ["started"]


@pytest.mark.usefixtures("reference")
def test_drift_rolls_the_canary_back(
    monitors: MonitorService, deployments: DeploymentService, people: People
) -> None:
    deployments.set_canary(people.ctx("mo"), DEPLOYMENT, WeightedUri(f"models:/{MODEL}/2", 10))
    made = monitors.create(
        people.ctx("mo"), MonitorSpec(DEPLOYMENT, HOUR, on_drift=parse_on_drift("rollback"))
    )
    send(deployments, people, samples=20, amount_shift=50.0)
    result = monitors.run_now(people.ctx("mo"), made.name).result
    assert result is not None
    assert result.actions[0]["status"] == "rolled back"
    after = deployments.get(people.principals["mo"], DEPLOYMENT)
    assert after.split.canary is None
    assert after.state.phase.value == "rolled_back"


@pytest.mark.usefixtures("reference")
def test_a_column_whose_every_value_changed_type_is_reported_and_the_run_completes(
    monitors: MonitorService, deployments: DeploymentService, people: People
) -> None:
    made = monitors.create(people.ctx("mo"), MonitorSpec(DEPLOYMENT, HOUR))
    send(deployments, people, samples=3, amounts=["abc"] * 10)
    result = monitors.run_now(people.ctx("mo"), made.name).result
    assert result is not None
    assert result.samples == 3
    kinds = {(i["column"], i["kind"]) for i in result.report["quality"]}
    assert ("amount", "invalid_value") in kinds
    assert monitors.get(people.principals["mo"], made.name).last_error is None
