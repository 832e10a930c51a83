"""A monitor that follows its deployment's primary: a promoted canary's reference replaces
the one before and only the primary's answers are judged; drift found while the last
retraining is still being judged (its run running, its version a canary) starts nothing."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from shamal.deployments._entities import WeightedUri
from shamal.deployments._service import DeploymentService
from shamal.monitoring import (
    MonitorService,
    MonitorServices,
    MonitorSpec,
    ReferenceService,
    parse_on_drift,
)
from shamal.pipelines import PipelineSpec
from shamal.registry import RegistryService
from shamal.server import Platform
from tests.clock import ManualClock
from tests.monitoring.conftest import DEPLOYMENT, MODEL, People, build_reference, send

HOUR = 3600
RETRAIN = "retrain-fraud"


@pytest.fixture
def second_reference(references: ReferenceService, people: People) -> None:
    """``fraud/2``'s reference, like version 1's (the same training set and scores)."""
    build_reference(references, people, 2)


def _retraining_monitor(monitors: MonitorService, platform: Platform, people: People) -> str:
    """A retraining pipeline (its one step never ends here: nothing advances it) and a
    monitor that starts it on drift."""
    spec = PipelineSpec.from_json(
        {"name": RETRAIN, "team": "red", "steps": [{"name": "a", "command": ["true"]}]}
    )
    platform.pipelines.register(people.ctx("mo"), spec)
    made = monitors.create(
        people.ctx("mo"),
        MonitorSpec(DEPLOYMENT, HOUR, on_drift=parse_on_drift(f"retrain:{RETRAIN}")),
    )
    assert made.follows
    return made.name


def _runs(platform: Platform, people: People) -> int:
    return len(platform.pipelines.list_runs(people.principals["mo"], pipeline=RETRAIN))


@pytest.mark.usefixtures("reference", "second_reference")
def test_drift_during_a_canary_is_held_and_the_promoted_canary_becomes_the_reference(
    monitors: MonitorService, deployments: DeploymentService, platform: Platform, people: People
) -> None:
    name = _retraining_monitor(monitors, platform, people)
    deployments.set_canary(people.ctx("mo"), DEPLOYMENT, WeightedUri(f"models:/{MODEL}/2", 10))
    send(deployments, people, samples=20, amount_shift=50.0)
    drifted = monitors.run_now(people.ctx("mo"), name).result
    assert drifted is not None
    assert drifted.drifted
    (action,) = drifted.actions
    assert (action["action"], action["status"]) == ("retrain", "held")
    assert "canary in rollout (fraud/2)" in action["reason"]
    assert _runs(platform, people) == 0
    deployments.promote(people.ctx("mo"), DEPLOYMENT)
    # The old primary's last answers (shifted) are not the new primary's to answer for.
    send(deployments, people, samples=10, amount_shift=50.0, seed=6)
    kept = send(deployments, people, samples=15, seed=7, version="2")
    calm = monitors.run_now(people.ctx("mo"), name).result
    assert calm is not None
    assert (calm.samples, calm.drifted) == (kept, False)
    assert calm.report["reference"] == {"model": MODEL, "version": 2}
    now = monitors.get(people.principals["mo"], name)
    assert (now.reference_model, now.reference_version) == (MODEL, 2)
    (moved,) = [e for e in platform.audit.entries(limit=100) if e.action == "monitor.reference"]
    assert (moved.actor, moved.target) == (f"monitor:{name}", f"monitor:{name}")
    assert moved.detail == {"reference": f"{MODEL}/2", "previous": f"{MODEL}/1"}


@pytest.mark.usefixtures("reference")
def test_drift_while_the_last_retraining_runs_starts_no_second_run(
    monitors: MonitorService, deployments: DeploymentService, platform: Platform, people: People
) -> None:
    name = _retraining_monitor(monitors, platform, people)
    send(deployments, people, samples=20, amount_shift=50.0)
    first = monitors.run_now(people.ctx("mo"), name).result
    assert first is not None
    assert [a["status"] for a in first.actions] == ["started"]
    send(deployments, people, samples=20, amount_shift=50.0, seed=8)
    second = monitors.run_now(people.ctx("mo"), name).result
    assert second is not None
    assert second.drifted
    (held,) = second.actions
    assert held["status"] == "held"
    assert held["reason"] == (
        f"retraining run {first.actions[0]['run']} that this monitor started is still running"
    )
    assert _runs(platform, people) == 1


@pytest.mark.usefixtures("reference", "second_reference")
def test_a_monitor_with_a_named_reference_keeps_it_and_judges_every_version(
    monitors: MonitorService, deployments: DeploymentService, people: People
) -> None:
    made = monitors.create(people.ctx("mo"), MonitorSpec(DEPLOYMENT, HOUR, reference=(MODEL, 1)))
    assert not made.follows
    deployments.set_canary(people.ctx("mo"), DEPLOYMENT, WeightedUri(f"models:/{MODEL}/2", 10))
    deployments.promote(people.ctx("mo"), DEPLOYMENT)
    kept = send(deployments, people, samples=5) + send(deployments, people, samples=5, version="2")
    result = monitors.run_now(people.ctx("mo"), made.name).result
    assert result is not None
    assert result.samples == kept
    assert result.report["reference"] == {"model": MODEL, "version": 1}


@pytest.mark.usefixtures("reference")
def test_a_primary_without_a_reference_is_judged_against_the_one_before(
    monitors: MonitorService, deployments: DeploymentService, people: People
) -> None:
    made = monitors.create(people.ctx("mo"), MonitorSpec(DEPLOYMENT, HOUR))
    deployments.set_canary(people.ctx("mo"), DEPLOYMENT, WeightedUri(f"models:/{MODEL}/2", 10))
    deployments.promote(people.ctx("mo"), DEPLOYMENT)
    send(deployments, people, samples=5)
    kept = send(deployments, people, samples=5, version="2")
    result = monitors.run_now(people.ctx("mo"), made.name).result
    assert result is not None
    assert result.samples == kept
    assert result.report["reference"] == {"model": MODEL, "version": 1}


@pytest.mark.usefixtures("reference")
def test_after_a_retraining_that_did_not_take_drift_backs_off_then_retrains(
    deployments: DeploymentService,
    registry: RegistryService,
    references: ReferenceService,
    platform: Platform,
    people: People,
) -> None:
    """A retraining run that failed or was cancelled starts no other at every monitor run
    while the drift lasts: retraining waits an hour (or for a new pipeline version)."""
    # The pipeline service stamps its runs with the wall clock; this monitor's clock starts
    # there and moves only when told.
    clock = ManualClock(datetime.now(UTC))
    watched = MonitorService(
        MonitorServices(
            db=platform.db,
            audit=platform.audit,
            security=platform.security,
            deployments=deployments,
            registry=registry,
            references=references,
            pipelines=platform.pipelines,
            events=platform.events,
        ),
        clock,
    )
    name = _retraining_monitor(watched, platform, people)
    send(deployments, people, samples=20, amount_shift=50.0)
    first = watched.run_now(people.ctx("mo"), name).result
    assert first is not None
    (started,) = first.actions
    platform.pipelines.cancel(people.ctx("mo"), started["run"])
    send(deployments, people, samples=20, amount_shift=50.0, seed=8)
    clock.advance(60)
    second = watched.run_now(people.ctx("mo"), name).result
    assert second is not None
    (held,) = second.actions
    assert held["status"] == "held"
    assert held["reason"].startswith(
        f"the last retraining run {started['run']} did not take (its run cancelled); "
        "retraining waits "
    )
    assert _runs(platform, people) == 1
    clock.advance(3600)
    send(deployments, people, samples=20, amount_shift=50.0, seed=9)
    third = watched.run_now(people.ctx("mo"), name).result
    assert third is not None
    assert [a["status"] for a in third.actions] == ["started"]
    assert _runs(platform, people) == 2
