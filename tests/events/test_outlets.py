"""The platform's outlets: events reach the company's broker through a consumer of the
stream, in order, each once per round, and a broker that is down gets them again later."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from shamal.config import EventSettings
from shamal.events import EventKind, EventOutlets, NewEvent, emit
from shamal.server import Platform
from tests.events.test_brokers import AMQP_URL, _Exchange
from tests.polling import wait_for


@pytest.fixture
def exchange() -> Iterator[_Exchange]:
    made = _Exchange()
    yield made
    made.close()


def _emit(platform: Platform, n: int) -> None:
    event = NewEvent(
        EventKind.JOB_FINISHED,
        f"jobs:/{n:032x}",
        "ml",
        "scheduler",
        {"job_id": f"{n:032x}", "state": "succeeded"},
    )
    platform.db.run(lambda s: emit(s, event))


def test_the_broker_gets_every_event_once_and_again_after_an_outage(
    platform: Platform, exchange: _Exchange
) -> None:
    down = EventOutlets(
        platform.events,
        EventSettings(
            broker="rabbitmq",
            broker_url="amqp://guest:guest@127.0.0.1:1/",
            broker_exchange=exchange.name,
        ),
    )
    for n in range(3):
        _emit(platform, n)
    try:
        assert down.publish() == 0  # refused: the position stays where it was
    finally:
        down.close()
    outlets = EventOutlets(
        platform.events,
        EventSettings(
            broker="rabbitmq",
            broker_url=AMQP_URL,
            broker_exchange=exchange.name,
        ),
    )
    try:
        assert outlets.publish() == 3
        assert outlets.publish() == 0  # nothing new
        _emit(platform, 3)
        assert outlets.run_once() == 1  # no webhooks: the one new event, published
    finally:
        outlets.close()
    got = [wait_for(exchange.take, f"message {n}", 10) for n in range(4)]
    assert exchange.take() is None
    bodies = [json.loads(body) for _, _, body in got]
    assert [b["payload"]["job_id"] for b in bodies] == [f"{n:032x}" for n in range(4)]
    assert [key for key, _, _ in got] == ["job_finished"] * 4
    ids = [b["id"] for b in bodies]
    assert ids == sorted(ids)
