"""Consumers: at least once, positions move only after the handler returns, one handler at
a time across processes (two services on one database stand for two server processes)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from shamal.db import open_database
from shamal.errors import InvalidParameter
from shamal.events import Event, EventFilter, EventKind, EventService
from shamal.server import Platform
from tests.events.conftest import ManualClock, record


def test_a_consumer_reads_on_from_its_position(platform: Platform, events: EventService) -> None:
    first = [record(platform, n=i) for i in range(5)]
    got: list[list[int]] = []
    assert events.consume("audit-mirror", lambda b: got.append([e.id for e in b]), batch=3) == 3
    assert events.consume("audit-mirror", lambda b: got.append([e.id for e in b]), batch=3) == 2
    assert events.consume("audit-mirror", lambda b: got.append([e.id for e in b]), batch=3) == 0
    assert got == [first[:3], first[3:]]
    assert events.consumer_position("audit-mirror") == first[-1]
    assert events.consumer_position("never-ran") is None


def test_a_failing_handler_gets_the_same_batch_again(
    platform: Platform, events: EventService
) -> None:
    ids = [record(platform, n=i) for i in range(3)]

    def crash(batch: Sequence[Event]) -> None:
        raise RuntimeError("handler died")

    with pytest.raises(RuntimeError, match="handler died"):
        events.consume("c", crash)
    assert events.consumer_position("c") == 0
    got: list[int] = []
    assert events.consume("c", lambda b: got.extend(e.id for e in b)) == 3
    assert got == ids


def test_a_filter_passes_some_events_and_the_position_moves_past_what_was_read(
    platform: Platform, events: EventService
) -> None:
    """Events of other kinds are not even read; those of its kinds that fail the condition
    are read and passed over."""
    record(platform, state="succeeded")
    failed = record(platform, state="failed")
    record(platform, EventKind.DRIFT_DETECTED, state="failed")
    last = record(platform, state="succeeded")
    got: list[int] = []
    wanted = EventFilter.parse("job_finished where state = 'failed'")
    assert events.consume("f", lambda b: got.extend(e.id for e in b), filter=wanted) == 1
    assert got == [failed]
    assert events.consumer_position("f") == last


def test_a_consumer_being_run_elsewhere_answers_zero(
    platform: Platform, events: EventService, clock: ManualClock
) -> None:
    record(platform)
    inner: list[int] = []

    def outer(batch: Sequence[Event]) -> None:
        # While this handler runs, the consumer is leased: a second call gets nothing.
        inner.append(events.consume("c", lambda b: pytest.fail("handed out twice")))

    assert events.consume("c", outer) == 1
    assert inner == [0]


def test_a_lease_that_ran_out_is_taken_over(
    platform: Platform, events: EventService, clock: ManualClock
) -> None:
    ids = [record(platform, n=i) for i in range(2)]
    again: list[int] = []

    def slow(batch: Sequence[Event]) -> None:
        clock.advance(61)  # outruns the 60 s lease: another process may take the batch
        assert events.consume("c", lambda b: again.extend(e.id for e in b)) == 2

    assert events.consume("c", slow) == 2
    assert again == ids
    assert events.consumer_position("c") == ids[-1]


@pytest.mark.parametrize("name", ["", "UPPER", "a/b", "x" * 65, "../x"])
def test_bad_consumer_names_are_refused(events: EventService, name: str) -> None:
    with pytest.raises(InvalidParameter, match="consumer name"):
        events.consume(name, lambda b: None)


def test_two_processes_hand_every_event_to_exactly_one_handler(platform: Platform) -> None:
    """Two services, each on its own engine (two server processes), consume one stream from
    two threads each; no batch is handled twice or by two handlers at once."""
    total = 120
    for i in range(total):
        record(platform, n=i)
    second_db = open_database(platform.settings.resolved_database_url)
    services = [
        EventService(platform.db, platform.audit, platform.security),
        EventService(second_db, platform.audit, platform.security),
    ]
    handled: list[int] = []
    lock = threading.Lock()
    running = [0]
    overlaps: list[int] = []

    def handler(batch: Sequence[Event]) -> None:
        with lock:
            running[0] += 1
            if running[0] > 1:
                overlaps.append(running[0])
        try:
            handled.extend(e.id for e in batch)  # list.extend is atomic under the GIL
            threading.Event().wait(0.002)  # hold the batch a moment: contention is real
        finally:
            with lock:
                running[0] -= 1

    def work(service: EventService) -> None:
        misses = 0
        while len(handled) < total and misses < 10_000:
            if service.consume("shared", handler, batch=7) == 0:
                misses += 1

    threads = [threading.Thread(target=work, args=(svc,)) for svc in services * 2]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        second_db.dispose()
    assert overlaps == []
    assert sorted(handled) == sorted(set(handled))
    assert len(handled) == total
