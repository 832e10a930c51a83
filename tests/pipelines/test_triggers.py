"""Triggers: an event starts a run once (at-least-once delivery starts nothing twice), a
schedule's tick starts one run however many servers look, and never overlaps its last."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from shamal.errors import InvalidParameter
from shamal.events import EventKind, NewEvent, emit
from shamal.pipelines import PipelineSpec, PipelineTriggers
from shamal.security import AuditContext, Principal, Role
from shamal.server import Platform
from tests.clock import ManualClock


def _admin(platform: Platform) -> Principal:
    assert platform.admin_secret is not None
    return platform.security.authenticate(platform.admin_secret)


def _ctx(platform: Platform, action: str = "test") -> AuditContext:
    principal = _admin(platform)
    return AuditContext(action=action, actor=principal.name, principal=principal)


def _register(platform: Platform, triggers: list[dict[str, object]], name: str = "p") -> None:
    ctx = _ctx(platform)
    if "ml" not in ctx.require_principal().roles:  # made by an earlier registration
        platform.security.create_team(ctx, "ml")
        platform.security.set_member(ctx, "ml", ctx.require_principal().name, Role.ADMIN)
    spec = PipelineSpec.from_json(
        {
            "name": name,
            "team": "ml",
            "steps": [{"name": "a", "command": ["echo", "hi"]}],
            "triggers": triggers,
        }
    )
    platform.pipelines.register(_ctx(platform), spec)


def _emit(platform: Platform, team: str | None, dataset: str) -> None:
    event = NewEvent(
        EventKind.DATASET_VERSION_CREATED,
        f"data:/{dataset}/1",
        team,
        "someone",
        {"dataset": dataset, "version": 1, "team": team, "rows": 10},
    )
    platform.db.run(lambda s: emit(s, event))


def _runs(platform: Platform) -> list[str]:
    return [r.trigger for r in platform.pipelines.list_runs(_admin(platform), limit=1000)]


def test_an_event_starts_a_run_once_and_only_for_its_team(platform: Platform) -> None:
    _register(platform, [{"on": "dataset_version_created where dataset = 'wine'"}])
    triggers = PipelineTriggers(
        platform.db,
        platform.security,
        platform.pipelines,
        platform.events,
        lambda: datetime.now(UTC),
    )
    _emit(platform, "ml", "wine")
    _emit(platform, "ml", "other")  # the filter leaves it out
    _emit(platform, "risk", "wine")  # another team's data never starts ml's pipeline
    assert triggers.consume_events() == 3
    started = _runs(platform)
    assert len(started) == 1
    assert started[0].startswith("event dataset_version_created #")
    # The same events handed out again (a crash before the position moved): nothing new.
    page = platform.events.list_events(_admin(platform), limit=100)
    triggers.on_events(page.events)
    assert len(_runs(platform)) == 1
    assert triggers.consume_events() == 0


def test_triggers_that_cannot_work_are_refused_at_registration(platform: Platform) -> None:
    for bad, message in (
        ({"on": "dataset_version_created where dataset = 'x'; DROP TABLE runs"}, "filter"),
        ({"on": "no_such_kind"}, "kind"),
        ({"schedule": "* * * * * *"}, "once a minute"),
        ({"schedule": "0 3 * * *", "timezone": "Mars/Olympus"}, "time zone"),
    ):
        with pytest.raises(InvalidParameter, match=message):
            _register(platform, [bad], name="bad")
    assert _runs(platform) == []


def test_a_tick_fires_once_across_servers_and_never_overlaps(platform: Platform) -> None:
    _register(platform, [{"schedule": "0 * * * *", "timezone": "Asia/Dubai", "catch_up": "latest"}])
    clock = ManualClock(datetime(2026, 11, 27, 10, 30, tzinfo=UTC))
    servers = [
        PipelineTriggers(platform.db, platform.security, platform.pipelines, platform.events, clock)
        for _ in range(3)
    ]
    assert servers[0].fire_schedules() == 0  # a new schedule owes nothing from its past
    clock.now = datetime(2026, 11, 27, 11, 0, 5, tzinfo=UTC)
    fired: list[int] = []
    threads = [
        threading.Thread(target=lambda s=s: fired.append(s.fire_schedules())) for s in servers
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(fired) == [0, 0, 1]
    runs = _runs(platform)
    assert runs == ["schedule 0 * * * * at 2026-11-27T11:00:00+00:00"]
    # The next tick comes while that run still runs (its step's job is queued): skipped.
    clock.now = datetime(2026, 11, 27, 12, 0, 1, tzinfo=UTC)
    assert servers[1].fire_schedules() == 0
    assert len(_runs(platform)) == 1
    fired_events = platform.events.list_events(
        _admin(platform), kinds=(EventKind.SCHEDULE_FIRED,), limit=10
    ).events
    assert [e.payload["tick"] for e in fired_events] == [
        "2026-11-27T11:00:00+00:00",
        "2026-11-27T12:00:00+00:00",
    ]
    # Once it ended, a server that was down for three hours fires only the latest tick.
    run_id = platform.pipelines.list_runs(_admin(platform))[0].id
    platform.pipelines.cancel(_ctx(platform), run_id)
    clock.now = datetime(2026, 11, 27, 15, 0, 30, tzinfo=UTC) + timedelta(seconds=0)
    assert servers[2].fire_schedules() == 1
    assert _runs(platform)[0] == "schedule 0 * * * * at 2026-11-27T15:00:00+00:00"


def test_a_tick_whose_run_was_never_recorded_fires_again(
    platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    _register(platform, [{"schedule": "*/5 * * * *"}])
    clock = ManualClock(datetime(2026, 11, 27, 10, 1, tzinfo=UTC))
    server = PipelineTriggers(
        platform.db, platform.security, platform.pipelines, platform.events, clock
    )
    server.fire_schedules()
    clock.now = datetime(2026, 11, 27, 10, 5, 2, tzinfo=UTC)
    service = platform.pipelines

    def dies(*_: object, **__: object) -> object:
        raise RuntimeError("the server died before it recorded the run")

    with monkeypatch.context() as patched:
        patched.setattr(service, "_insert_run", dies)
        with pytest.raises(RuntimeError):
            server.fire_schedules()
    assert _runs(platform) == []  # nothing recorded, and the tick did not move either
    assert server.fire_schedules() == 1
    assert _runs(platform) == ["schedule */5 * * * * at 2026-11-27T10:05:00+00:00"]
