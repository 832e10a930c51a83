"""The pure parts of streaming: the micro-batcher (size, age, duplicates), payload decoding,
rows checked against a dataset's columns, broker URLs (credentials never repeated), and the
server importing no broker client."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pytest

from shamal.datasets import Message, MicroBatcher, describe, parse_url
from shamal.datasets._batcher import arrow_schema, decode, fit_key, to_table
from shamal.errors import InvalidParameter


class FakeClock:
    """A clock the test moves by hand (time is an input here, not a synchronisation)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _message(key: str, row: object = None) -> Message:
    return Message(key, json.dumps(row if row is not None else {"id": key}).encode())


def test_a_batch_closes_by_size_or_by_age_and_drops_duplicate_keys() -> None:
    clock = FakeClock()
    batcher = MicroBatcher(3, 2.0, clock)
    assert not batcher.due()
    assert batcher.time_left() == 2.0
    assert batcher.add(_message("a"))
    assert not batcher.add(_message("a"))  # the same record, delivered twice
    assert batcher.add(_message("b"))
    assert not batcher.due()
    assert batcher.room() == 1
    clock.now += 1.5
    assert batcher.time_left() == pytest.approx(0.5)
    assert batcher.add(_message("c"))
    assert batcher.due()  # by size: three distinct records
    batch = batcher.take()
    assert [m.key for m in batch.unique] == ["a", "b", "c"]
    assert [m.key for m in batch.all] == ["a", "a", "b", "c"]
    assert batcher.pending == 0
    batcher.add(_message("d"))
    clock.now += 1.99
    assert not batcher.due()
    clock.now += 0.01
    assert batcher.due()  # by age
    with pytest.raises(ValueError, match="max_rows"):
        MicroBatcher(0, 1.0)
    by_bytes = MicroBatcher(1000, 60.0, clock, max_bytes=10)
    by_bytes.add(Message("x", b"12345"))
    assert not by_bytes.due()
    by_bytes.add(Message("y", b"67890"))
    assert by_bytes.due()  # by payload bytes
    assert by_bytes.room() == 0


def test_payloads_that_are_not_one_json_object_are_parked_without_their_values() -> None:
    messages = [
        _message("ok", {"id": 1}),
        Message("bad-json", b'{"name": "Fatima'),
        Message("list", b"[1]"),
        Message("utf16", "{}".encode("utf-16")),
        Message("deep", b"[" * 100_000 + b"]" * 100_000),
        Message("huge", b'{"x": "' + b"a" * (1 << 20) + b'"}'),
    ]
    rows, dead = decode(messages)
    assert rows == [("ok", {"id": 1})]
    reasons = {d.key: d.reason for d in dead}
    assert reasons["bad-json"].startswith("the payload is not JSON (line 1")
    assert "not a JSON object" in reasons["list"]
    assert reasons["utf16"] == "the payload is not UTF-8"
    assert (
        reasons["deep"]
        in {"the payload nests too deeply", "the payload is not JSON (line 1, column 1)"}
        or "not" in reasons["deep"]
    )
    assert "over" in reasons["huge"]
    assert all("Fatima" not in d.reason and len(d.digest) == 64 for d in dead)


def test_rows_are_checked_against_the_dataset_columns() -> None:
    schema = arrow_schema(
        [
            {"name": "id", "type": "int64", "nullable": True},
            {"name": "at", "type": "timestamp[us, tz=UTC]", "nullable": True},
            {"name": "ok", "type": "bool", "nullable": True},
        ]
    )
    assert schema is not None
    records = [
        ("1", {"id": 1, "at": "2026-11-27T03:00:00Z", "ok": True}),
        ("2", {"id": "2", "at": "2026-11-27T04:00:00+00:00", "ok": False}),
        ("3", {"id": 1.5, "at": "2026-11-27", "ok": True}),
        ("4", {"id": 4, "at": "yesterday", "ok": True}),
        ("5", {"id": 5, "ok": True}),
        ("6", {"id": None, "at": None, "ok": None}),
        ("7", {"id": True, "at": None, "ok": None}),
        ("8", {"id": 8.0, "at": None, "ok": 1}),
        ("9", {"id": 9, "at": None, "ok": "yes"}),
    ]
    converted = to_table(records, schema)
    assert converted.keys == ["1", "2", "6"]
    assert converted.table is not None
    assert converted.table.column("id").to_pylist() == [1, 2, None]
    reasons = {d.key: d.reason for d in converted.dead}
    assert reasons["3"] == "column 'id' is not a int64"
    assert reasons["4"] == "column 'at' is not a timestamp[us, tz=UTC]"
    assert reasons["5"] == "the record's columns differ from the dataset's (missing 'at')"
    assert reasons["7"] == "column 'id' is not a int64"
    assert reasons["8"] == reasons["9"] == "column 'ok' is not a bool"
    assert arrow_schema([{"name": "n", "type": "list<item: int64>"}]) is None


def test_the_first_batch_of_a_new_dataset_gives_its_columns() -> None:
    converted = to_table(
        [("a", {"x": 1, "y": "s"}), ("b", {"x": 2}), ("c", {"x": "two", "y": "t"})], None
    )
    assert converted.keys == ["a"]
    assert converted.table is not None
    assert converted.table.schema == pa.schema([("x", pa.int64()), ("y", pa.string())])
    assert {d.key for d in converted.dead} == {"b", "c"}
    assert to_table([("z", {})], None).table is None


def test_long_or_unprintable_keys_are_hashed_to_fit() -> None:
    assert fit_key("1700000000000-0") == "1700000000000-0"
    assert fit_key("k" * 257).startswith("sha256:")
    assert fit_key("a\nb").startswith("sha256:")


def test_broker_urls_parse_and_never_repeat_credentials() -> None:
    rabbit = parse_url("amqp://user:s3cret@rabbit:5672/orders")
    assert (rabbit.host, rabbit.port, rabbit.name, rabbit.user) == (
        "rabbit",
        5672,
        "orders",
        "user",
    )
    assert "s3cret" not in repr(rabbit)
    assert describe(rabbit) == "amqp://rabbit:5672/orders"
    redis_url = parse_url("redis://:pw@cache/0?stream=events&group=g")
    assert (redis_url.name, redis_url.port, describe(redis_url)) == (
        "events",
        6379,
        "redis://cache:6379/events",
    )
    assert parse_url("mqtt://broker/sensors/+/temp").name == "sensors/+/temp"
    nats_url = parse_url("nats://n:4222/orders.created?stream=ORDERS&ack_wait=5")
    assert (nats_url.name, nats_url.options["stream"]) == ("orders.created", "ORDERS")
    for bad in (
        "http://user:s3cret@host/x",
        "amqp://user:s3cret@host",
        "redis://user:s3cret@host/0",
        "redis://host/zero?stream=x",
        "mqtt://user:s3cret@host/t?qos=2",
        "amqp://user:s3cret@host:99999/q",
        "nats://:4222/subject",
        "mqtt://host/t\x00x",
    ):
        with pytest.raises(InvalidParameter) as caught:
            parse_url(bad)
        assert "s3cret" not in caught.value.message


def test_the_server_imports_no_broker_client() -> None:
    probe = (
        "import sys, shamal.server, shamal.datasets.api, shamal.datasets._streams;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'paho','nats','pika'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"
