"""StreamService on SQLite and PostgreSQL: micro-batches written exactly once by key (a
retried batch, a redelivery, concurrent writers with the same keys), poison records parked
in the same transaction and never retried, pushes idempotent by key and all-or-nothing."""

from __future__ import annotations

import io
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as paipc
import pyarrow.parquet as pq
import pytest

from shamal.datasets import DeadLetter, StreamService
from shamal.errors import InvalidParameter, NotFound, PermissionDenied
from shamal.server import Platform
from tests.registry.conftest import People, people

__all__ = ["people"]


@pytest.fixture
def streams(platform: Platform, tmp_path: Path) -> StreamService:
    return StreamService(platform.db, platform.audit, platform.datasets, tmp_path / "spool")


def _rows(platform: Platform, people: People, name: str) -> list[dict[str, object]]:
    service = platform.datasets
    version = service.version(people.principals["vi"], name)
    tables = []
    for index in range(len(version.parts)):
        data = b"".join(service.open_part(people.principals["vi"], version.uri[6:], index))
        tables.append(pq.read_table(io.BytesIO(data)))
    rows: list[dict[str, object]] = pa.concat_tables(tables).to_pylist()
    return rows


def _records(ids: range | list[int]) -> list[tuple[str, dict[str, object]]]:
    return [(f"m-{i}", {"id": i, "reading": i * 0.5}) for i in ids]


def test_a_retried_batch_and_a_redelivery_write_each_record_once(
    platform: Platform, streams: StreamService, people: People
) -> None:
    platform.datasets.create(people.ctx("mo"), "sensors", "red")
    first = streams.write_records(people.ctx("mo"), "sensors", "redis:s", _records(range(5)))
    assert (first.written, first.skipped, first.parked) == (5, 0, 0)
    assert first.version is not None
    assert first.version.source == {"kind": "stream", "stream": "redis:s", "records": 5}
    # The consumer died before acknowledging: the broker delivers 3..4 again, with new ones,
    # out of order and one twice in the batch.
    again = streams.write_records(
        people.ctx("mo"), "sensors", "redis:s", _records([7, 4, 6, 3, 5, 6])
    )
    assert (again.written, again.skipped) == (3, 3)
    assert again.version is not None
    assert again.version.row_count == 8
    # All of it again: nothing written, no version.
    nothing = streams.write_records(people.ctx("mo"), "sensors", "redis:s", _records(range(8)))
    assert (nothing.version, nothing.written, nothing.skipped) == (None, 0, 8)
    assert platform.datasets.version(people.principals["vi"], "sensors").version == 2
    assert sorted(r["id"] for r in _rows(platform, people, "sensors")) == list(range(8))
    # Keys are unique within a stream: another stream's m-1 is another record.
    other = streams.write_records(people.ctx("mo"), "sensors", "amqp:q", _records([1]))
    assert other.written == 1


def test_poison_records_are_parked_with_the_batch_and_never_retried(
    platform: Platform, streams: StreamService, people: People
) -> None:
    platform.datasets.create(people.ctx("mo"), "sensors", "red")
    streams.write_records(people.ctx("mo"), "sensors", "mqtt:t", _records([0]))
    records = [
        *_records([1]),
        ("bad-columns", {"id": 2, "secret_name": "Fatima Al Mansouri"}),
        ("bad-type", {"id": 3, "reading": "Fatima Al Mansouri"}),
        *_records([4]),
    ]
    undecodable = DeadLetter("bad-json", "the payload is not JSON (line 1, column 2)", "0" * 64, 9)
    done = streams.write_records(people.ctx("mo"), "sensors", "mqtt:t", records, [undecodable])
    assert (done.written, done.parked) == (2, 3)
    letters = {d.key: d for d in streams.dead_letters(people.principals["mo"], "sensors")}
    assert set(letters) == {"bad-columns", "bad-type", "bad-json"}
    assert "missing 'reading'" in letters["bad-columns"].reason
    assert "1 unexpected" in letters["bad-columns"].reason
    assert letters["bad-type"].reason == "column 'reading' is not a double"
    for letter in letters.values():
        assert "Fatima" not in letter.reason
        assert len(letter.digest) == 64
    # Delivered again (the consumer died before its ack): skipped, not parked twice.
    again = streams.write_records(people.ctx("mo"), "sensors", "mqtt:t", records, [undecodable])
    assert (again.written, again.skipped, again.parked) == (0, 5, 0)
    assert len(streams.dead_letters(people.principals["mo"], "sensors")) == 3
    # A batch of nothing but poison parks it without a version.
    alone = streams.write_records(
        people.ctx("mo"), "sensors", "mqtt:t", [("only-bad", {"wrong": 1})]
    )
    assert (alone.version, alone.parked) == (None, 1)
    assert platform.datasets.version(people.principals["vi"], "sensors").row_count == 3


def test_concurrent_writers_of_the_same_keys_write_each_once(
    platform: Platform, streams: StreamService, people: People
) -> None:
    platform.datasets.create(people.ctx("mo"), "busy", "red")
    streams.write_records(people.ctx("mo"), "busy", "nats:s", _records([0]))
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def write() -> None:
        start.wait()
        try:
            streams.write_records(people.ctx("mo"), "busy", "nats:s", _records(range(1, 7)))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(r["id"] for r in _rows(platform, people, "busy")) == list(range(7))


def test_access_and_hostile_stream_names(
    platform: Platform, streams: StreamService, people: People
) -> None:
    platform.datasets.create(people.ctx("mo"), "sensors", "red")
    with pytest.raises(PermissionDenied):
        streams.write_records(people.ctx("vi"), "sensors", "redis:s", _records([1]))
    with pytest.raises(NotFound):
        streams.write_records(people.ctx("bo"), "sensors", "redis:s", _records([1]))
    with pytest.raises(NotFound):
        streams.dead_letters(people.principals["bo"], "sensors")
    for bad in ("amqp://guest:guest@host/q", "redis:x@y", "no scheme", "x:\x00", "x:", ""):
        with pytest.raises(InvalidParameter, match="credentials"):
            streams.write_records(people.ctx("mo"), "sensors", bad, _records([1]))
    with pytest.raises(InvalidParameter, match="at most"):
        streams.write_records(people.ctx("mo"), "sensors", "redis:s", _records(range(10_001)))
    with pytest.raises(NotFound):
        platform.datasets.version(people.principals["vi"], "sensors")


def _ipc(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with paipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def test_a_push_is_written_once_per_key_and_all_or_nothing(
    platform: Platform, streams: StreamService, people: People
) -> None:
    platform.datasets.create(people.ctx("mo"), "orders", "red")
    rows = [{"id": 1, "total": 9.5}, {"id": 2, "total": 3.0}]
    first = streams.push_rows(people.ctx("mo"), "orders", "push-1", rows)
    assert first.version is not None
    assert (first.written, first.replayed) == (2, False)
    retried = streams.push_rows(people.ctx("mo"), "orders", "push-1", rows)
    assert retried.replayed
    assert retried.version == first.version
    table = pa.table({"id": [3, 4, 5], "total": [1.0, 2.0, 4.0]})
    arrow = streams.push_arrow(people.ctx("mo"), "orders", "push-2", [_ipc(table)])
    assert arrow.version is not None
    assert arrow.version.row_count == 5
    assert streams.push_arrow(people.ctx("mo"), "orders", "push-2", [_ipc(table)]).replayed
    # One bad row refuses the push: nothing written, and the key stays free for the fix.
    bad = [{"id": 6, "total": 1.0}, {"id": 7, "total": "Fatima"}]
    with pytest.raises(InvalidParameter, match="row 2") as caught:
        streams.push_rows(people.ctx("mo"), "orders", "push-3", bad)
    assert "Fatima" not in caught.value.message
    with pytest.raises(InvalidParameter, match="arrow"):
        streams.push_arrow(people.ctx("mo"), "orders", "push-3", [_ipc(table)[:-9]])
    with pytest.raises(InvalidParameter):
        streams.push_rows(people.ctx("mo"), "orders", "push-3", [])
    assert platform.datasets.version(people.principals["vi"], "orders").row_count == 5
    fixed = streams.push_rows(people.ctx("mo"), "orders", "push-3", bad[:1])
    assert fixed.version is not None
    assert fixed.version.row_count == 6


def test_rows_of_a_nested_dataset_append_or_are_parked_by_their_types(
    platform: Platform, streams: StreamService, people: People
) -> None:
    platform.datasets.create(people.ctx("mo"), "tagged", "red")
    table = pa.table({"id": [1], "tags": pa.array([[1, 2]], pa.list_(pa.int64()))})
    platform.datasets.ingest_batches(
        people.ctx("mo"), "tagged", table.to_batches(), source={"kind": "test"}
    )
    fits = streams.write_records(
        people.ctx("mo"), "tagged", "redis:t", [("a", {"id": 2, "tags": [3]})]
    )
    assert fits.written == 1
    wrong = streams.write_records(
        people.ctx("mo"), "tagged", "redis:t", [("b", {"id": 3, "tags": ["Fatima"]})]
    )
    assert (wrong.version, wrong.written, wrong.parked) == (None, 0, 1)
    (letter,) = streams.dead_letters(people.principals["mo"], "tagged")
    assert letter.reason == "the record's values do not have the dataset's column types"
    assert platform.datasets.version(people.principals["vi"], "tagged").row_count == 2
