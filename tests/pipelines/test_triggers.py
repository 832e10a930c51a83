"""Triggers: an event starts a run once (at-least-once delivery starts nothing twice), a
schedule's tick starts one run however many servers look, and never overlaps its last; a
pipeline's own runs' writes never start it again, but do start the others."""

from __future__ import annotations

import io
import threading
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from shamal.errors import InvalidParameter
from shamal.events import EventKind, NewEvent, emit
from shamal.pipelines import PipelineSpec, PipelineTriggers
from shamal.security import AuditContext, Principal, Role, job_token_name
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


def _triggers(platform: Platform) -> PipelineTriggers:
    return PipelineTriggers(
        platform.db,
        platform.security,
        platform.pipelines,
        platform.events,
        lambda: datetime.now(UTC),
    )


def test_an_event_starts_a_run_once_and_only_for_its_team(platform: Platform) -> None:
    _register(platform, [{"on": "dataset_version_created where dataset = 'wine'"}])
    triggers = _triggers(platform)
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


def _write_as_step(platform: Platform, run_id: str, dataset: str) -> str:
    """Write a version of ``dataset`` the way the run's step does: with its job's token.
    Returns the job id's prefix."""
    (step,) = platform.pipelines.get_run(_admin(platform), run_id).steps
    assert step.job_id is not None
    issued = platform.security.issue_job_token(
        "admin", job_token_name(step.job_id, 1), timedelta(hours=1)
    )
    job = platform.security.authenticate(issued.secret)
    sink = io.BytesIO()
    pacsv.write_csv(pa.table({"x": [1, 2]}), sink)
    ctx = AuditContext(action="datasets.write", actor=job.name, principal=job)
    platform.datasets.ingest(ctx, dataset, [sink.getvalue()], "csv")
    return step.job_id[:12]


def test_a_pipelines_own_writes_never_start_it_but_start_the_others(platform: Platform) -> None:
    on_wine = [{"on": "dataset_version_created where dataset = 'wine'"}]
    _register(platform, on_wine, name="ingest")
    _register(platform, on_wine, name="train")
    platform.datasets.create(_ctx(platform), "wine", "ml")
    triggers = _triggers(platform)
    first = platform.pipelines.start(_ctx(platform), "ingest")
    assert first is not None
    job = _write_as_step(platform, first.id, "wine")
    (event,) = platform.events.list_events(
        _admin(platform), kinds=(EventKind.DATASET_VERSION_CREATED,), limit=10
    ).events
    assert event.payload["job"] == job
    assert triggers.consume_events() >= 1
    started = platform.pipelines.list_runs(_admin(platform), pipeline="train")
    assert [r.trigger for r in started] == [f"event dataset_version_created #{event.id}"]
    assert len(platform.pipelines.list_runs(_admin(platform), pipeline="ingest")) == 1
    # The run that event started writes too: it starts ingest, never train again.
    _write_as_step(platform, started[0].id, "wine")
    assert triggers.consume_events() >= 1
    assert len(platform.pipelines.list_runs(_admin(platform), pipeline="train")) == 1
    again = platform.pipelines.list_runs(_admin(platform), pipeline="ingest")
    assert [r.trigger.startswith("event dataset_version_created #") for r in again] == [
        True,
        False,
    ]
    # A write by someone's own token (no job) starts both.
    sink = io.BytesIO()
    pacsv.write_csv(pa.table({"x": [3]}), sink)
    platform.datasets.ingest(_ctx(platform), "wine", [sink.getvalue()], "csv")
    assert triggers.consume_events() >= 1
    assert len(platform.pipelines.list_runs(_admin(platform), pipeline="train")) == 2
    assert len(platform.pipelines.list_runs(_admin(platform), pipeline="ingest")) == 3
