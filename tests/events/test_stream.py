"""The outbox: events commit and roll back with their change; who reads which."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from shamal.db.models import EventRow
from shamal.errors import InvalidParameter
from shamal.events import EventKind, EventService, NewEvent, emit
from shamal.server import Platform
from tests.events.conftest import People, record


def _count(platform: Platform) -> int:
    with platform.db.unit_of_work(write=False) as s:
        return s.scalar(select(func.count()).select_from(EventRow)) or 0


def test_an_event_commits_with_its_change_and_rolls_back_with_it(
    platform: Platform, events: EventService, people: People
) -> None:
    first = record(platform, state="succeeded", exit_code=0)

    class Boom(Exception):
        pass

    def failing(s: Session) -> None:
        emit(s, NewEvent(EventKind.JOB_FINISHED, "jobs:/x", "red", "mo", {"state": "failed"}))
        raise Boom

    with pytest.raises(Boom):
        platform.db.run(failing)
    second = record(platform, state="lost")
    page = events.list_events(people.principals["admin"])
    assert [e.id for e in page.events] == [first, second]
    assert [e.payload["state"] for e in page.events] == ["succeeded", "lost"]
    assert page.next_after == second
    assert page.events[0].to_json()["kind"] == "job_finished"


def test_payloads_are_stored_as_json(
    platform: Platform, events: EventService, people: People
) -> None:
    from datetime import UTC, datetime

    record(platform, at=datetime(2030, 1, 2, tzinfo=UTC), kind_=EventKind.DRIFT_DETECTED)
    (event,) = events.list_events(people.principals["admin"]).events
    assert event.payload == {"at": "2030-01-02 00:00:00+00:00", "kind_": "drift_detected"}


def test_an_oversized_payload_is_a_programming_error(platform: Platform) -> None:
    with pytest.raises(ValueError, match="16384 bytes"):
        record(platform, blob="x" * 20_000)
    with pytest.raises(ValueError, match="subject"):
        platform.db.run(lambda s: emit(s, NewEvent(EventKind.JOB_FINISHED, "", None, "mo", {})))
    assert _count(platform) == 0


def test_readers_see_their_teams_events_and_admins_all(
    platform: Platform, events: EventService, people: People
) -> None:
    red = record(platform, team="red")
    blue = record(platform, team="blue")
    platform_event = record(platform, team=None)
    ids = lambda who: [e.id for e in events.list_events(people.principals[who]).events]  # noqa: E731
    assert ids("vi") == [red]
    assert ids("bo") == [blue]
    assert ids("otto") == []
    assert ids("admin") == [red, blue, platform_event]


def test_kinds_where_and_paging(platform: Platform, events: EventService, people: People) -> None:
    admin = people.principals["admin"]
    made = [record(platform, state="failed" if i % 3 == 0 else "succeeded", n=i) for i in range(10)]
    record(platform, EventKind.DRIFT_DETECTED, features=["age"])
    failed = events.list_events(admin, kinds=["job_finished"], where="state = 'failed'", limit=2)
    assert [e.payload["n"] for e in failed.events] == [0, 3]
    more = events.list_events(admin, after=failed.next_after, where="state = 'failed'", limit=2)
    assert [e.payload["n"] for e in more.events] == [6, 9]
    drift = events.list_events(admin, kinds=["drift_detected"])
    assert [e.kind for e in drift.events] == [EventKind.DRIFT_DETECTED]
    assert events.list_events(admin, after=made[-1] + 1).events == ()
    with pytest.raises(InvalidParameter, match="unknown event kind"):
        events.list_events(admin, kinds=["nope"])
    with pytest.raises(InvalidParameter, match="bad filter"):
        events.list_events(admin, where="state = ")
    with pytest.raises(InvalidParameter, match="limit"):
        events.list_events(admin, limit=0)
    with pytest.raises(InvalidParameter, match="after"):
        events.list_events(admin, after=-1)


def test_concurrent_writers_never_let_a_reader_skip_an_event(
    platform: Platform, events: EventService, people: People
) -> None:
    """Ids become visible in ascending order: a reader that follows the stream by position
    while four writers append sees every event exactly once."""
    writers, each = 4, 15
    admin = people.principals["admin"]
    seen: list[int] = []
    done = threading.Event()

    def write(w: int) -> None:
        for i in range(each):
            record(platform, w=w, i=i)

    def read() -> None:
        position = 0
        while True:
            finished = done.is_set()
            page = events.list_events(admin, after=position, limit=1000)
            seen.extend(e.id for e in page.events)
            position = page.next_after
            if finished:
                return

    reader = threading.Thread(target=read)
    reader.start()
    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    reader.join()
    assert len(seen) == writers * each
    assert seen == sorted(set(seen))
