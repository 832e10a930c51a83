"""One contract, both online stores: SQLite (a file in tmp_path) and Redis (the machine's
real server, a fresh key prefix per test, every key removed afterwards).

Writes are monotonic and idempotent (replaying or reordering chunks never goes back in
time), reads fetch every requested view of every entity in one round trip, values keep
their types, and hostile names and keys round-trip.
"""

from __future__ import annotations

import math
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from shamal.errors import Conflict, InvalidParameter, ServiceUnavailable
from shamal.features._online import (
    OnlineRow,
    OnlineStore,
    RedisOnlineStore,
    SqliteOnlineStore,
    open_online_store,
)
from tests import needs

redis = needs.module("redis")

REDIS_URL = "redis://127.0.0.1:6379/0"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


# ---------------------------------------------------------------------- instrumented stores
class CountingSqliteStore(SqliteOnlineStore):
    """Counts the SELECT statements its connections run (a trace callback, not a mock)."""

    def __init__(self, path: Path) -> None:
        self.selects: list[str] = []
        super().__init__(path)

    def _connect(self) -> sqlite3.Connection:
        connection = super()._connect()

        def trace(statement: str) -> None:
            if statement.lstrip().upper().startswith("SELECT"):
                self.selects.append(statement)

        connection.set_trace_callback(trace)
        return connection


class CountingConnection(redis.Connection):  # type: ignore[misc,name-defined]
    """A real Redis connection that counts the packets it sends (one per round trip)."""

    sent: list[int]

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        self.sent.append(1)
        super().send_packed_command(command, check_health)


class CountingRedisStore(RedisOnlineStore):
    """Counts round trips: every send of a packet on any of its connections."""

    def __init__(self, url: str, *, prefix: str) -> None:
        self.sent: list[int] = []
        super().__init__(url, prefix=prefix)

    def _connect(self, url: str) -> Any:
        sent = self.sent
        counting = type("Counting", (CountingConnection,), {"sent": sent})
        return redis.Redis.from_url(url, connection_class=counting)


def _round_trips(store: OnlineStore) -> int:
    if isinstance(store, CountingSqliteStore):
        return len(store.selects)
    assert isinstance(store, CountingRedisStore)
    return len(store.sent)


@pytest.fixture(params=["sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OnlineStore]:
    if request.param == "sqlite":
        sqlite_store = CountingSqliteStore(tmp_path / "online.db")
        yield sqlite_store
        sqlite_store.close()
        return
    prefix = f"shamal-test:{uuid.uuid4().hex}:"
    redis_store = CountingRedisStore(REDIS_URL, prefix=prefix)
    try:
        yield redis_store
    finally:
        redis_store.close()
        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


# ---------------------------------------------------------------------- helpers
def table(ids: list[Any], stamps: list[datetime | None], **features: list[Any]) -> pa.Table:
    return pa.table({"id": ids, "ts": pa.array(stamps, pa.timestamp("us", tz="UTC")), **features})


def write(store: OnlineStore, view: str, rows: pa.Table, keys: tuple[str, ...] = ("id",)) -> int:
    features = [c for c in rows.column_names if c not in {*keys, "ts"}]
    return store.write(view, rows, keys, "ts", features)


def values(store: OnlineStore, view: str, key: tuple[Any, ...]) -> dict[str, Any] | None:
    row = store.read([view], [key])[0][view]
    return None if row is None else row.values


# ---------------------------------------------------------------------- the contract
def test_several_views_and_keys_read_back_in_one_call(store: OnlineStore) -> None:
    assert write(store, "users", table([1, 2], [T0, T0], age=[30, 40], name=["a", "b"])) == 2
    later = T0 + timedelta(hours=1)
    assert write(store, "spend", table([1, 3], [later, later], total=[1.5, 2.5])) == 2

    got = store.read(["users", "spend", "nope"], [(1,), (2,), (3,), (4,)])

    assert got == [
        {
            "users": OnlineRow(T0, {"age": 30, "name": "a"}),
            "spend": OnlineRow(later, {"total": 1.5}),
            "nope": None,
        },
        {"users": OnlineRow(T0, {"age": 40, "name": "b"}), "spend": None, "nope": None},
        {"users": None, "spend": OnlineRow(later, {"total": 2.5}), "nope": None},
        {"users": None, "spend": None, "nope": None},
    ]
    assert got[0]["users"] is not None
    assert got[0]["users"].event_ts.tzinfo is not None
    assert store.read(["users"], []) == []


def test_one_round_trip_for_every_view_and_key(store: OnlineStore) -> None:
    views = [f"view{v}" for v in range(5)]
    for view in views:
        write(store, view, table(list(range(100)), [T0] * 100, x=list(range(100))))
    before = _round_trips(store)

    got = store.read(views, [(i,) for i in range(100)] + [("missing",)])

    assert _round_trips(store) - before == 1
    assert [row["view3"].values["x"] for row in got[:100]] == list(range(100))  # type: ignore[union-attr]
    assert got[100] == dict.fromkeys(views)


def test_an_older_row_never_replaces_a_newer_one(store: OnlineStore) -> None:
    new, old = T0 + timedelta(days=1), T0
    assert write(store, "v", table([1], [new], x=["new"])) == 1
    assert write(store, "v", table([1], [old], x=["old"])) == 0
    assert store.read(["v"], [(1,)])[0]["v"] == OnlineRow(new, {"x": "new"})

    assert write(store, "v", table([1], [new], x=["same time, later write"])) == 1
    assert values(store, "v", (1,)) == {"x": "same time, later write"}


def test_within_one_call_the_latest_row_of_a_key_wins(store: OnlineStore) -> None:
    stamps = [T0 + timedelta(minutes=m) for m in (5, 9, 1, 9, 3)]
    rows = table([7, 7, 7, 7, 8], stamps, x=["a", "b", "c", "tie, later row", "e"])

    assert write(store, "v", rows) == 2

    assert store.read(["v"], [(7,)])[0]["v"] == OnlineRow(stamps[3], {"x": "tie, later row"})
    assert values(store, "v", (8,)) == {"x": "e"}
    assert store.count("v") == 2


def test_replaying_a_chunk_changes_nothing(store: OnlineStore) -> None:
    rows = table(list(range(50)), [T0 + timedelta(seconds=i) for i in range(50)], x=list(range(50)))
    write(store, "v", rows)
    first = store.read(["v"], [(i,) for i in range(50)])

    write(store, "v", rows)

    assert store.count("v") == 50
    assert store.read(["v"], [(i,) for i in range(50)]) == first


def test_a_resumed_materialization_replays_older_chunks_harmlessly(store: OnlineStore) -> None:
    chunks = [table(list(range(10)), [T0 + timedelta(hours=h)] * 10, x=[h] * 10) for h in range(3)]
    for chunk in chunks:
        write(store, "v", chunk)
    # Killed and started again from the beginning: the old chunks come again.
    for chunk in chunks[:2]:
        assert write(store, "v", chunk) == 0

    assert [values(store, "v", (i,)) for i in range(10)] == [{"x": 2}] * 10


def test_composite_keys_and_key_types(store: OnlineStore) -> None:
    rows = pa.table(
        {
            "a": pa.array([1, 1, None, 2], pa.int64()),
            "b": ["x", "y", "x", None],
            "ts": pa.array([T0] * 4, pa.timestamp("us", tz="UTC")),
            "f": [10, 11, 12, 13],
        }
    )
    assert store.write("pairs", rows, ["a", "b"], "ts", ["f"]) == 2
    assert store.count("pairs") == 2

    got = store.read(["pairs"], [(1, "x"), (1, "y"), ("1", "x"), (1,), (1, "x", 0), (None, "x")])

    assert [None if g["pairs"] is None else g["pairs"].values for g in got] == [
        {"f": 10},
        {"f": 11},
        None,
        None,
        None,
        None,
    ]


def test_one_and_the_string_one_and_true_are_different_entities(store: OnlineStore) -> None:
    write(store, "ints", table([1], [T0], x=["int"]))
    write(store, "strs", table(["1"], [T0], x=["str"]))
    write(store, "bools", table([True], [T0], x=["bool"]))
    write(store, "floats", table([2.0, 2.5], [T0, T0], x=["whole", "half"]))

    views = ["ints", "strs", "bools", "floats"]
    got = store.read(views, [(1,), ("1",), (True,), (2,), (2.0,), (2.5,)])

    def names(row: dict[str, OnlineRow | None]) -> dict[str, Any]:
        return {v: r.values["x"] for v, r in row.items() if r is not None}

    assert [names(g) for g in got] == [
        {"ints": "int"},
        {"strs": "str"},
        {"bools": "bool"},
        {"floats": "whole"},
        {"floats": "whole"},
        {"floats": "half"},
    ]


def test_rows_without_a_key_or_a_time_are_skipped(store: OnlineStore) -> None:
    rows = table([1, None, 3], [T0, T0, None], x=[1, 2, 3])
    assert write(store, "v", rows) == 1
    assert store.count("v") == 1
    assert values(store, "v", (3,)) is None

    floats = table([math.nan, math.inf, 0.5], [T0] * 3, x=[1, 2, 3])
    assert write(store, "f", floats) == 1
    assert store.count("f") == 1
    assert [g["f"] for g in store.read(["f"], [(math.nan,), (math.inf,), (None,)])] == [None] * 3


def test_times_before_1970_are_ordered_too(store: OnlineStore) -> None:
    old, older = datetime(1969, 7, 20, 20, 17, tzinfo=UTC), datetime(1900, 1, 1, tzinfo=UTC)
    write(store, "v", table([1], [old], x=["1969"]))
    assert write(store, "v", table([1], [older], x=["1900"])) == 0
    assert store.read(["v"], [(1,)])[0]["v"] == OnlineRow(old, {"x": "1969"})


def test_a_key_asked_twice_and_no_views(store: OnlineStore) -> None:
    write(store, "v", table([1], [T0], x=[1]))
    got = store.read(["v", "v"], [(1,), (2,), (1,)])
    assert [None if g["v"] is None else g["v"].values for g in got] == [{"x": 1}, None, {"x": 1}]
    assert store.read([], [(1,), (2,)]) == [{}, {}]


def test_values_keep_their_types(store: OnlineStore) -> None:
    when = datetime(2025, 3, 4, 5, 6, 7, 891011, tzinfo=UTC)
    rows = pa.table(
        {
            "id": [1, 2],
            "ts": pa.array([T0, T0], pa.timestamp("ns", tz="UTC")),
            "i": pa.array([2**62, None], pa.int64()),
            "f": [math.nan, math.inf],
            "g": [-math.inf, 0.25],
            "b": [True, False],
            "s": ['héllo ✓ "quoted" \n{*}', None],
            "t": pa.array([when, None], pa.timestamp("us", tz="UTC")),
            "naive": pa.array([when.replace(tzinfo=None), None], pa.timestamp("ms")),
            "n": pa.array([None, None], pa.null()),
        }
    )
    features = [c for c in rows.column_names if c not in {"id", "ts"}]
    store.write("v", rows, ["id"], "ts", features)

    first, second = (r["v"] for r in store.read(["v"], [(1,), (2,)]))
    assert first is not None
    assert second is not None
    got = first.values
    assert math.isnan(got.pop("f"))
    assert got == {
        "i": 2**62,
        "g": -math.inf,
        "b": True,
        "s": 'héllo ✓ "quoted" \n{*}',
        "t": when,
        "naive": when.replace(microsecond=891000),
        "n": None,
    }
    assert type(got["i"]) is int
    assert got["t"].tzinfo is not None
    assert second.values == {
        "i": None,
        "f": math.inf,
        "g": 0.25,
        "b": False,
        "s": None,
        "t": None,
        "naive": None,
        "n": None,
    }


def test_delete_view_removes_only_that_view(store: OnlineStore) -> None:
    write(store, "a", table([1, 2, 3], [T0] * 3, x=[1, 2, 3]))
    write(store, "b", table([2, 3, 4], [T0] * 3, y=[2, 3, 4]))
    assert (store.count("a"), store.count("b")) == (3, 3)

    assert store.delete_view("a") == 3

    assert (store.count("a"), store.count("b")) == (0, 3)
    got = store.read(["a", "b"], [(1,), (2,), (3,), (4,)])
    assert [g["a"] for g in got] == [None] * 4
    assert [None if g["b"] is None else g["b"].values for g in got] == [
        None,
        {"y": 2},
        {"y": 3},
        {"y": 4},
    ]
    assert store.delete_view("a") == 0
    assert store.delete_view("never written") == 0


def test_count_is_exact_across_many_chunks(store: OnlineStore) -> None:
    n = 4500  # more than two write chunks
    write(store, "v", table(list(range(n)), [T0] * n, x=list(range(n))))
    write(store, "v", table(list(range(n - 100, n + 100)), [T0] * 200, x=[0] * 200))

    assert store.count("v") == n + 100
    assert store.delete_view("v") == n + 100
    assert store.count("v") == 0


def test_concurrent_writers_end_with_the_newest_row(store: OnlineStore) -> None:
    keys = list(range(200))
    errors: list[BaseException] = []

    def writer(hours: list[int]) -> Callable[[], None]:
        def run() -> None:
            try:
                for h in hours:
                    write(store, "v", table(keys, [T0 + timedelta(hours=h)] * 200, x=[h] * 200))
            except BaseException as exc:  # surfaced by the assertion below
                errors.append(exc)

        return run

    threads = [
        threading.Thread(target=writer([0, 3, 4, 7, 8])),
        threading.Thread(target=writer([9, 1, 2, 5, 6])),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    got = store.read(["v"], [(k,) for k in keys])
    assert {g["v"].values["x"] for g in got} == {9}  # type: ignore[union-attr]
    assert store.count("v") == 200


def test_readers_in_threads_never_see_time_go_back(store: OnlineStore) -> None:
    keys = [(k,) for k in range(50)]
    write(store, "v", table(list(range(50)), [T0] * 50, x=[0] * 50))
    done = threading.Event()
    seen: list[list[int]] = [[] for _ in range(3)]
    errors: list[BaseException] = []

    def reader(mine: list[int]) -> None:
        try:
            while not done.is_set() or not mine:
                got = store.read(["v"], keys)
                mine.append(min(g["v"].values["x"] for g in got))  # type: ignore[union-attr]
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(mine,)) for mine in seen]
    for thread in threads:
        thread.start()
    for h in range(1, 21):
        write(store, "v", table(list(range(50)), [T0 + timedelta(hours=h)] * 50, x=[h] * 50))
    done.set()
    for thread in threads:
        thread.join()

    assert errors == []
    assert all(mine == sorted(mine) for mine in seen)
    assert [g["v"].values["x"] for g in store.read(["v"], keys)] == [20] * 50  # type: ignore[union-attr]


# ---------------------------------------------------------------------- hostile input
def test_hostile_view_names_and_keys_round_trip(store: OnlineStore) -> None:
    view = "v'\"\n*{}[]?\\ %_ é"
    keys = ["a'b", 'c"d', "e\nf", "*", "{tag}", "", "[1]", "\x00zero"]
    write(store, view, table(keys, [T0] * len(keys), x=list(range(len(keys)))))
    write(store, "*", table(["other"], [T0], x=[99]))

    got = store.read([view], [(k,) for k in keys])

    assert [g[view].values["x"] for g in got] == list(range(len(keys)))  # type: ignore[union-attr]
    assert store.count(view) == len(keys)
    assert store.delete_view(view) == len(keys)
    assert store.count("*") == 1


def test_a_one_mebibyte_value_round_trips(store: OnlineStore) -> None:
    huge = "x" * (1 << 20)
    write(store, "v", table([1], [T0], blob=[huge]))
    assert values(store, "v", (1,)) == {"blob": huge}


def test_bad_columns_are_refused_clearly(store: OnlineStore) -> None:
    rows = table([1], [T0], x=[1])
    with pytest.raises(InvalidParameter, match="lack the column"):
        store.write("v", rows, ["id"], "ts", ["missing"])
    with pytest.raises(InvalidParameter, match="timestamp"):
        store.write("v", rows, ["id"], "x", [])
    listed = pa.table({"id": [1], "ts": rows.column("ts"), "l": [[1, 2]]})
    with pytest.raises(InvalidParameter, match="cast the column"):
        store.write("v", listed, ["id"], "ts", ["l"])
    with pytest.raises(InvalidParameter, match="entity key"):
        store.read(["v"], [(b"bytes",)])  # type: ignore[list-item]
    with pytest.raises(InvalidParameter, match="64 bits"):
        store.read(["v"], [(2**70,)])
    assert store.count("v") == 0


def test_ping_answers_on_a_live_store_and_a_closed_one_refuses(store: OnlineStore) -> None:
    store.ping()
    store.close()
    with pytest.raises(Conflict, match="closed"):
        store.read(["v"], [(1,)])
    with pytest.raises(Conflict, match="closed"):
        store.ping()
    store.close()


def test_an_unreachable_redis_is_a_clear_error() -> None:
    unreachable = RedisOnlineStore("redis://:secret@127.0.0.1:1/0", prefix="unused:")
    with pytest.raises(ServiceUnavailable, match=r"127\.0\.0\.1:1") as caught:
        unreachable.ping()
    assert "secret" not in caught.value.message
    with pytest.raises(ServiceUnavailable):
        unreachable.read(["v"], [(1,)])
    with pytest.raises(ServiceUnavailable):
        write(unreachable, "v", table([1], [T0], x=[1]))
    unreachable.close()
    with pytest.raises(InvalidParameter, match="port"):
        RedisOnlineStore("redis://127.0.0.1:notaport/0")


# ---------------------------------------------------------------------- opening by URL
def test_open_online_store_by_url(tmp_path: Path) -> None:
    default = open_online_store("sqlite", home=tmp_path)
    assert isinstance(default, SqliteOnlineStore)
    assert default.path == tmp_path / "online-features.db"
    default.close()

    explicit = open_online_store(f"sqlite://{tmp_path}/x/online.db", home=tmp_path / "unused")
    assert isinstance(explicit, SqliteOnlineStore)
    explicit.ping()
    assert (tmp_path / "x" / "online.db").exists()
    explicit.close()

    remote = open_online_store(REDIS_URL, home=tmp_path)
    assert isinstance(remote, RedisOnlineStore)
    remote.ping()
    remote.close()

    for bad in ("postgres://db", "memory", "x" * 10_000):
        with pytest.raises(InvalidParameter, match="sqlite") as caught:
            open_online_store(bad, home=tmp_path)
        assert len(caught.value.message) < 300
