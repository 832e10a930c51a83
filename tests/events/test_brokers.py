"""Publishing events to the real brokers on this machine, read back by real consumers.

NATS JetStream on 127.0.0.1:4222 (a fresh stream per test), RabbitMQ on 127.0.0.1:5672 (a
fresh exchange per test, with a queue bound to it before publishing).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from shamal.errors import InvalidParameter, ServiceUnavailable
from shamal.events._brokers import NatsPublisher, RabbitPublisher, open_publisher
from shamal.events._entities import Event, EventKind
from tests import needs
from tests.polling import wait_for

nats = needs.module("nats")
pika = needs.module("pika")

HOST = "127.0.0.1"
NATS_URL = f"nats://{HOST}:4222"
AMQP_URL = f"amqp://guest:guest@{HOST}:5672/"
AT = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)


def _events(first_id: int = 101) -> list[Event]:
    kinds = [EventKind.JOB_FINISHED, EventKind.MODEL_ALIAS_MOVED, EventKind.DRIFT_DETECTED]
    return [
        Event(
            first_id + n,
            kind,
            f"jobs:/{n}",
            "fraud",
            "ana",
            {"n": n, "text": "é ✓"},
            AT,
        )
        for n, kind in enumerate(kinds)
    ]


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        port: int = probe.getsockname()[1]
    return port


# ---------------------------------------------------------------------- NATS
class _Stream:
    """A unique JetStream stream name and subject prefix, deleted afterwards."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:10]
        self.name = f"SHAMAL_TEST_EV_{tag.upper()}"
        self.prefix = f"shamal.test.ev{tag}"

    async def _js(self, work: Any) -> Any:
        client = await nats.connect(NATS_URL)
        try:
            return await work(client.jetstream())
        finally:
            await client.close()

    def read(self, count: int) -> list[Any]:
        """Up to ``count`` messages through a pull subscription, from the start."""

        async def fetch(js: Any) -> list[Any]:
            sub = await js.pull_subscribe(
                f"{self.prefix}.>", durable=f"reader{uuid.uuid4().hex[:8]}", stream=self.name
            )
            got = await sub.fetch(count, timeout=5)
            for message in got:
                await message.ack()
            return [(m.subject, m.data, dict(m.headers or {})) for m in got]

        result: list[Any] = asyncio.run(self._js(fetch))
        return result

    def stored(self) -> int:
        async def count(js: Any) -> int:
            info = await js.stream_info(self.name)
            return int(info.state.messages)

        return int(asyncio.run(self._js(count)))

    def delete(self) -> None:
        async def drop(js: Any) -> None:
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await js.delete_stream(self.name)

        asyncio.run(self._js(drop))


@pytest.fixture
def stream() -> Iterator[_Stream]:
    made = _Stream()
    yield made
    made.delete()


@pytest.fixture
def nats_publisher(stream: _Stream) -> Iterator[NatsPublisher]:
    publisher = NatsPublisher(NATS_URL, stream=stream.name, subject_prefix=stream.prefix)
    yield publisher
    publisher.close()


def test_nats_publish_and_read_back(stream: _Stream, nats_publisher: NatsPublisher) -> None:
    events = _events()
    nats_publisher.publish(events)
    got = stream.read(10)
    assert [subject for subject, _, _ in got] == [f"{stream.prefix}.{e.kind.value}" for e in events]
    assert [json.loads(data) for _, data, _ in got] == [e.to_json() for e in events]
    assert [headers["Nats-Msg-Id"] for _, _, headers in got] == [str(e.id) for e in events]


def test_nats_repeat_is_stored_once(stream: _Stream, nats_publisher: NatsPublisher) -> None:
    events = _events()
    nats_publisher.publish(events)
    nats_publisher.publish(events)  # the caller retried a batch that had gone through
    nats_publisher.publish([events[1]])
    assert stream.stored() == 3
    nats_publisher.publish(_events(first_id=104)[:1])
    assert stream.stored() == 4
    assert [json.loads(d)["id"] for _, d, _ in stream.read(10)] == [101, 102, 103, 104]


def test_nats_lost_connection_then_next_batch_reconnects(
    stream: _Stream, nats_publisher: NatsPublisher
) -> None:
    nats_publisher.publish(_events()[:1])
    nats_publisher._runner.run(nats_publisher._nc.close(), 5)  # as if NATS dropped us
    nats_publisher.publish(_events()[1:])
    assert stream.stored() == 3


def test_nats_deleted_stream_fails_the_batch_then_comes_back(
    stream: _Stream, nats_publisher: NatsPublisher
) -> None:
    nats_publisher.publish(_events()[:1])
    stream.delete()
    with pytest.raises(ServiceUnavailable, match="sent again"):
        nats_publisher.publish(_events()[1:])
    nats_publisher.publish(_events()[1:])  # the retry makes the stream again
    assert [json.loads(d)["id"] for _, d, _ in stream.read(10)] == [102, 103]


def test_nats_reuses_an_existing_stream(stream: _Stream, nats_publisher: NatsPublisher) -> None:
    nats_publisher.publish(_events()[:1])
    again = NatsPublisher(NATS_URL, stream=stream.name, subject_prefix=stream.prefix)
    try:
        again.publish(_events()[1:])
    finally:
        again.close()
    assert stream.stored() == 3


def test_nats_stream_with_other_subjects_refused(stream: _Stream) -> None:
    first = NatsPublisher(NATS_URL, stream=stream.name, subject_prefix=stream.prefix)
    first.close()
    with pytest.raises(InvalidParameter, match=stream.name):
        NatsPublisher(NATS_URL, stream=stream.name, subject_prefix=stream.prefix + "x")


def test_nats_unreachable_hides_credentials() -> None:
    url = f"nats://ana:hunter2@{HOST}:{_closed_port()}"
    started = time.monotonic()
    with pytest.raises(ServiceUnavailable) as caught:
        NatsPublisher(url, stream="SHAMAL_TEST_NOWHERE")
    assert time.monotonic() - started < 5  # refused at once, not after a reconnect loop
    assert "hunter2" not in caught.value.message
    assert "ana" not in caught.value.message


@pytest.mark.parametrize(
    ("stream_name", "prefix"), [("A.B", "p"), ("S", "p.*"), ("S", "p.>"), ("S", "a b"), ("", "p")]
)
def test_nats_names_checked(stream_name: str, prefix: str) -> None:
    with pytest.raises(InvalidParameter):
        NatsPublisher(NATS_URL, stream=stream_name, subject_prefix=prefix)


def test_nats_empty_batch_is_nothing(stream: _Stream, nats_publisher: NatsPublisher) -> None:
    nats_publisher.publish([])
    assert stream.stored() == 0


# ---------------------------------------------------------------------- RabbitMQ
class _Exchange:
    """A unique exchange with a queue bound to every routing key; both deleted after."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:10]
        self.name = f"shamal.test.ev.{tag}"
        self.queue = f"shamal-test-ev-{tag}"
        self.connection = pika.BlockingConnection(pika.ConnectionParameters(HOST, 5672))
        self.channel = self.connection.channel()
        self.channel.exchange_declare(self.name, exchange_type="topic", durable=True)
        self.channel.queue_declare(self.queue, exclusive=True)
        self.channel.queue_bind(self.queue, self.name, routing_key="#")

    def take(self) -> Any:
        method, properties, body = self.channel.basic_get(self.queue, auto_ack=True)
        return None if method is None else (method.routing_key, properties, body)

    def close(self) -> None:
        self.channel.exchange_delete(self.name)
        self.connection.close()


@pytest.fixture
def exchange() -> Iterator[_Exchange]:
    made = _Exchange()
    yield made
    made.close()


def test_rabbit_publish_and_read_back(exchange: _Exchange) -> None:
    publisher = RabbitPublisher(AMQP_URL, exchange=exchange.name)
    events = _events()
    try:
        publisher.publish(events)
    finally:
        publisher.close()
    got = [wait_for(exchange.take, f"message {n} in the queue", 10) for n in range(3)]
    assert exchange.take() is None
    assert [key for key, _, _ in got] == [e.kind.value for e in events]
    assert [json.loads(body) for _, _, body in got] == [e.to_json() for e in events]
    assert [p.message_id for _, p, _ in got] == [str(e.id) for e in events]
    assert {p.delivery_mode for _, p, _ in got} == {2}
    assert {p.content_type for _, p, _ in got} == {"application/json"}


def test_rabbit_publisher_declares_its_exchange() -> None:
    name = f"shamal.test.ev.{uuid.uuid4().hex[:10]}"
    publisher = RabbitPublisher(AMQP_URL, exchange=name)
    publisher.publish(_events()[:1])  # no queue bound: confirmed, routed nowhere
    publisher.close()
    connection = pika.BlockingConnection(pika.ConnectionParameters(HOST, 5672))
    try:
        channel = connection.channel()
        channel.exchange_declare(name, exchange_type="topic", durable=True, passive=True)
        channel.exchange_delete(name)
    finally:
        connection.close()


def test_rabbit_reconnects_after_a_lost_connection(exchange: _Exchange) -> None:
    publisher = RabbitPublisher(AMQP_URL, exchange=exchange.name)
    try:
        publisher.publish(_events()[:1])
        publisher._connection.close()  # as if the broker dropped us
        publisher.publish(_events()[1:])
    finally:
        publisher.close()
    got = [wait_for(exchange.take, f"message {n}", 10) for n in range(3)]
    assert [p.message_id for _, p, _ in got] == ["101", "102", "103"]


def test_rabbit_exchange_of_another_type_refused() -> None:
    name = f"shamal.test.ev.{uuid.uuid4().hex[:10]}"
    connection = pika.BlockingConnection(pika.ConnectionParameters(HOST, 5672))
    channel = connection.channel()
    channel.exchange_declare(name, exchange_type="fanout", durable=True)
    try:
        with pytest.raises(InvalidParameter, match="durable topic exchange"):
            RabbitPublisher(AMQP_URL, exchange=name)
    finally:
        channel.exchange_delete(name)
        connection.close()


def test_rabbit_unreachable_hides_credentials() -> None:
    url = f"amqp://ana:hunter2@{HOST}:{_closed_port()}/"
    with pytest.raises(ServiceUnavailable) as caught:
        RabbitPublisher(url)
    assert "hunter2" not in caught.value.message
    assert "ana" not in caught.value.message


def test_rabbit_wrong_password_is_unavailable_without_it() -> None:
    url = f"amqp://guest:wrong-pw-123@{HOST}:5672/"
    with pytest.raises(ServiceUnavailable) as caught:
        RabbitPublisher(url)
    assert "wrong-pw-123" not in caught.value.message


# ---------------------------------------------------------------------- open_publisher
def test_open_publisher_both_kinds(stream: _Stream, exchange: _Exchange) -> None:
    nats_side = open_publisher("nats", NATS_URL, stream=stream.name, subject_prefix=stream.prefix)
    rabbit_side = open_publisher("rabbitmq", AMQP_URL, exchange=exchange.name)
    try:
        nats_side.publish(_events()[:1])
        rabbit_side.publish(_events()[:1])
    finally:
        nats_side.close()
        rabbit_side.close()
    assert stream.stored() == 1
    assert wait_for(exchange.take, "the message", 10)[1].message_id == "101"


@pytest.mark.parametrize(
    ("kind", "options"),
    [("kafka", {}), ("nats", {"exchange": "x"}), ("rabbitmq", {"stream": "S"})],
)
def test_open_publisher_refuses_unknowns(kind: Any, options: dict[str, str]) -> None:
    with pytest.raises(InvalidParameter):
        open_publisher(kind, "nats://127.0.0.1:4222", **options)
