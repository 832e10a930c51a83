"""One contract, every broker: MQTT (Mosquitto), NATS JetStream, RabbitMQ and Redis Streams,
each the machine's real server, consumed into a real `shamal server` through its HTTP API.

- a consumer killed between the commit and the acknowledgement: the broker delivers the
  batch again, the server skips the committed keys, each record is written once;
- duplicates and out-of-order deliveries of the same records: written once;
- a poison message (not JSON, not an object, wrong columns, a wrong type) is parked with its
  reason, never its payload, and the rest flows past it;
- the broker connection drops mid-batch: the consumer reconnects and resumes, nothing lost
  or doubled.

No sleeps: the tests step the consumer and poll for conditions with deadlines. Every test
uses its own topic, subject, queue or stream key, and removes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import socket
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import pyarrow.parquet as pq
import pytest

from shamal.client import ShamalClient
from shamal.datasets import Consumer, Message, open_broker
from tests import needs
from tests.live import LiveServer
from tests.polling import wait_until

pytestmark = pytest.mark.slow

paho = needs.module("paho.mqtt.client")
nats = needs.module("nats")
pika = needs.module("pika")
redis = needs.module("redis")

HOST = "127.0.0.1"


class Killed(Exception):
    """The consumer died (between its commit and its acknowledgement)."""


class Fixture(Protocol):
    port: int

    def url(self) -> str: ...

    def publish(self, messages: Sequence[tuple[str, bytes]]) -> None:
        """Publish (message id, payload) pairs in this order."""
        ...

    def close(self) -> None: ...


class MqttFixture:
    port = 1883

    def __init__(self, tag: str) -> None:
        self.topic = f"shamal-test/{tag}"
        self.client_id = f"shamal-test-{tag}"

    def url(self) -> str:
        return f"mqtt://{HOST}:{self.port}/{self.topic}?client={self.client_id}"

    def publish(self, messages: Sequence[tuple[str, bytes]]) -> None:
        from paho.mqtt.enums import CallbackAPIVersion

        client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"pub-{uuid.uuid4().hex}")
        client.connect(HOST, self.port)
        client.loop_start()
        try:
            for _id, payload in messages:
                client.publish(self.topic, payload, qos=1).wait_for_publish(10)
        finally:
            client.disconnect()
            client.loop_stop()

    def close(self) -> None:
        from paho.mqtt.enums import CallbackAPIVersion

        # A clean session ends the consumer's persistent one.
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id=self.client_id)
        client.connect(HOST, self.port)
        client.disconnect()


class NatsFixture:
    port = 4222

    def __init__(self, tag: str) -> None:
        self.stream = f"SHAMAL_{tag.upper()}"
        self.subject = f"shamal.test.{tag}"
        asyncio.run(self._js(lambda js: js.add_stream(name=self.stream, subjects=[self.subject])))

    async def _js(self, work: Callable[[Any], Any]) -> Any:
        client = await nats.connect(f"nats://{HOST}:{self.port}")
        try:
            return await work(client.jetstream())
        finally:
            await client.close()

    def url(self) -> str:
        return f"nats://{HOST}:{self.port}/{self.subject}?stream={self.stream}&ack_wait=1"

    def publish(self, messages: Sequence[tuple[str, bytes]]) -> None:
        async def send(js: Any) -> None:
            for _id, payload in messages:
                await js.publish(self.subject, payload)

        asyncio.run(self._js(send))

    def close(self) -> None:
        asyncio.run(self._js(lambda js: js.delete_stream(self.stream)))


class RabbitFixture:
    port = 5672

    def __init__(self, tag: str) -> None:
        self.queue = f"shamal-test-{tag}"
        self._channel(lambda ch: ch.queue_declare(self.queue, durable=False))

    def _channel(self, work: Callable[[Any], Any]) -> None:
        connection = pika.BlockingConnection(pika.ConnectionParameters(HOST, self.port))
        try:
            work(connection.channel())
        finally:
            connection.close()

    def url(self) -> str:
        return f"amqp://guest:guest@{HOST}:{self.port}/{self.queue}"

    def publish(self, messages: Sequence[tuple[str, bytes]]) -> None:
        def send(channel: Any) -> None:
            for message_id, payload in messages:
                properties = pika.BasicProperties(message_id=message_id)
                channel.basic_publish("", self.queue, payload, properties)

        self._channel(send)

    def close(self) -> None:
        self._channel(lambda ch: ch.queue_delete(self.queue))


class RedisFixture:
    port = 6379

    def __init__(self, tag: str) -> None:
        self.key = f"shamal-test-{tag}"

    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0?stream={self.key}&group=g&consumer=c"

    def publish(self, messages: Sequence[tuple[str, bytes]]) -> None:
        with redis.Redis(HOST, self.port) as client:
            for _id, payload in messages:
                client.xadd(self.key, {"data": payload})

    def close(self) -> None:
        with redis.Redis(HOST, self.port) as client:
            client.delete(self.key)


BROKERS: dict[str, Callable[[str], Fixture]] = {
    "mqtt": MqttFixture,
    "nats": NatsFixture,
    "amqp": RabbitFixture,
    "redis": RedisFixture,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("streams-home")) as live:
        with ShamalClient(live.url, live.token) as api:
            api.create_team("iot")
        yield live


@pytest.fixture
def api(server: LiveServer) -> Iterator[ShamalClient]:
    with ShamalClient(server.url, server.token) as client:
        yield client


@pytest.fixture(params=sorted(BROKERS))
def broker(request: pytest.FixtureRequest) -> Iterator[Fixture]:
    made = BROKERS[request.param](uuid.uuid4().hex[:10])
    yield made
    made.close()


@pytest.fixture
def dataset(api: ShamalClient) -> str:
    name = f"s-{uuid.uuid4().hex[:10]}"
    api.create_dataset(name, team="iot")
    return name


def _reading(i: int) -> tuple[str, bytes]:
    return f"m-{i}", json.dumps({"id": i, "reading": i / 4}).encode()


def _sink(api: ShamalClient, name: str) -> Callable[..., dict[str, Any]]:
    def write(stream: str, rows: Any, dead: Any) -> dict[str, Any]:
        return api.write_stream_batch(name, stream, rows, dead)

    return write


def _ids(api: ShamalClient, name: str, tmp_path: Path) -> list[int]:
    """The ids of the latest version's rows, read from its Parquet parts."""
    version = api.dataset_version(name)
    ids: list[int] = []
    for index in range(len(version["parts"])):
        part = api.download_dataset_part(name, version["version"], index, tmp_path / f"{index}.pq")
        ids.extend(pq.read_table(part).column("id").to_pylist())
    return ids


def _rows(api: ShamalClient, name: str) -> int:
    found = api.get_dataset(name)["latest_version"]
    return 0 if found is None else int(api.dataset_version(f"{name}/{found}")["row_count"])


def _consume_until(consumer: Consumer, done: Callable[[], bool], what: str) -> None:
    def stepped() -> bool:
        consumer.step()
        return done()

    wait_until(stepped, what, timeout=60)


def test_a_consumer_killed_between_commit_and_ack_writes_each_record_once(
    broker: Fixture, api: ShamalClient, dataset: str, tmp_path: Path
) -> None:
    ids = list(range(8))
    random.Random(7).shuffle(ids)  # out of order
    first = open_broker(broker.url(), batch=5)
    committed: list[int] = []

    def commit_then_die(stream: str, rows: Any, dead: Any) -> dict[str, Any]:
        answer = api.write_stream_batch(dataset, stream, rows, dead)
        committed.append(answer["written"])
        raise Killed

    consumer = Consumer(first, commit_then_die, max_rows=5, max_seconds=0.3, poll=0.1)
    broker.publish([_reading(i) for i in ids])
    with pytest.raises(Killed):
        _consume_until(consumer, lambda: False, "the first batch")
    first.close()  # gone without acknowledging
    assert committed
    assert committed[0] >= 1
    assert _rows(api, dataset) == committed[0]

    second = open_broker(broker.url(), batch=5)
    try:
        resumed = Consumer(second, _sink(api, dataset), max_rows=5, max_seconds=0.3, poll=0.1)
        _consume_until(
            resumed,
            lambda: _rows(api, dataset) == 8 and resumed.totals.skipped >= committed[0],
            "every record, the committed ones delivered again and skipped",
        )
    finally:
        second.close()
    assert sorted(_ids(api, dataset, tmp_path)) == list(range(8))


class Replaying:
    """A broker whose every delivery comes again later, in reverse order: the copies are
    the same records (same keys), never acknowledged to the real broker twice."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.stream = real.stream
        self._copies: list[Message] = []

    def receive(self, limit: int, timeout: float) -> list[Message]:
        got = self._real.receive(limit, timeout)
        copies = [Message(m.key, m.payload, "copy") for m in got]
        out = got + self._copies[::-1][: max(0, limit - len(got))]
        self._copies = self._copies[: len(self._copies) - (len(out) - len(got))] + copies
        return out

    def ack(self, messages: Sequence[Message]) -> None:
        self._real.ack([m for m in messages if m.token != "copy"])

    def close(self) -> None:
        self._real.close()


def test_duplicates_and_out_of_order_deliveries_are_written_once(
    broker: Fixture, api: ShamalClient, dataset: str, tmp_path: Path
) -> None:
    real = open_broker(broker.url(), batch=4)
    replaying = Replaying(real)
    try:
        consumer = Consumer(replaying, _sink(api, dataset), max_rows=4, max_seconds=0.3, poll=0.1)
        broker.publish([_reading(i) for i in (5, 1, 4, 0, 3, 2)])
        _consume_until(
            consumer,
            lambda: (
                _rows(api, dataset) == 6
                # At least the six replayed copies: a broker may redeliver an unacknowledged
                # record too (MQTT does after a reconnect), which is skipped the same way.
                and consumer.totals.skipped + consumer.totals.duplicates >= 6
            ),
            "six records, and every copy skipped",
        )
    finally:
        replaying.close()
    assert sorted(_ids(api, dataset, tmp_path)) == list(range(6))


def test_a_poison_message_is_parked_and_blocks_nothing(
    broker: Fixture, api: ShamalClient, dataset: str, tmp_path: Path
) -> None:
    secret = "Fatima Al Mansouri"
    poison = [
        ("p-json", b"{not json " + secret.encode()),
        ("p-list", b"[1, 2]"),
        ("p-columns", json.dumps({"id": 90, "name": secret}).encode()),
        ("p-type", json.dumps({"id": 91, "reading": secret}).encode()),
        ("p-utf8", b"\xff\xfe" + secret.encode("utf-16-le")),
    ]
    live = open_broker(broker.url(), batch=20)
    try:
        consumer = Consumer(live, _sink(api, dataset), max_rows=20, max_seconds=0.3, poll=0.1)
        broker.publish([_reading(0), *poison, _reading(1), _reading(2)])
        _consume_until(
            consumer,
            lambda: _rows(api, dataset) == 3 and consumer.totals.parked == 5,
            "the good rows written and the poison parked",
        )
    finally:
        live.close()
    letters = api.dead_letters(dataset)
    assert len(letters) == 5
    reasons = " | ".join(sorted(letter["reason"] for letter in letters))
    assert "not JSON" in reasons
    assert "not a JSON object" in reasons
    assert "columns differ" in reasons
    assert "column 'reading' is not a double" in reasons
    assert "not UTF-8" in reasons
    assert secret not in json.dumps(letters)
    assert sorted(_ids(api, dataset, tmp_path)) == [0, 1, 2]


def _drop_connections(port: int) -> int:
    """Shut down this process's TCP connections to ``port`` (as a broker restart would):
    their owners see the connection drop. Linux: the sockets are found through /proc."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if int(fields[2].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                    inodes.add(fields[9])
    dropped = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:[") and target[8:-1] in inodes:
                twin = socket.socket(fileno=os.dup(int(fd)))
                try:
                    twin.shutdown(socket.SHUT_RDWR)  # the connection, not just this twin
                    dropped += 1
                finally:
                    twin.close()
    return dropped


def test_a_broker_that_drops_mid_batch_loses_and_doubles_nothing(
    broker: Fixture, api: ShamalClient, dataset: str, tmp_path: Path
) -> None:
    live = open_broker(broker.url(), batch=10)
    try:
        # Closed by size only: the drop comes while the batch is open.
        consumer = Consumer(live, _sink(api, dataset), max_rows=10, max_seconds=600, poll=0.1)
        broker.publish([_reading(i) for i in range(4)])

        def four_pending() -> bool:
            consumer.step()
            return consumer.pending >= 4

        wait_until(four_pending, "four deliveries in the open batch", timeout=60)
        assert _drop_connections(broker.port) >= 1
        broker.publish([_reading(i) for i in range(4, 10)])
        _consume_until(consumer, lambda: consumer.totals.batches >= 1, "the batch committed")
        assert _rows(api, dataset) == 10
    finally:
        live.close()
    assert sorted(_ids(api, dataset, tmp_path)) == list(range(10))
