"""The online store: the latest feature values of each entity, read in milliseconds.

Feature views are *materialized* into an online store so that a model server can read the
newest row of every view of an entity in one round trip. Two backends share one contract:

- :class:`SqliteOnlineStore`, the embedded default (a file under the server's home);
- :class:`RedisOnlineStore`, for production (one hash per entity, a field per view).

Writes are idempotent and monotonic, so that a materialization killed half-way can simply be
run again: a row replaces the stored one of its (view, entity) only when its event time is
the same or newer, and replaying an older chunk never goes back in time.

Encodings (shared by both backends):

- an entity key is the JSON array of its join-key values (``orjson``), so ``1`` and ``"1"``
  and ``True`` are different entities; a float that holds a whole number is the same entity
  as that int (JSON callers cannot tell ``1`` from ``1.0``); a key with a null, NaN or infinite
  part names no entity (such rows are skipped, such reads find nothing);
- a row is the JSON array ``[event_ts_micros, {feature: value}]``, plus a third member
  ``{feature: tag}`` for the values JSON cannot carry exactly (NaN, infinities, datetimes).
"""

from __future__ import annotations

import abc
import contextlib
import logging
import math
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol
from urllib.parse import urlsplit

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from shamal.errors import Conflict, InvalidParameter, ServiceUnavailable

if TYPE_CHECKING:
    import redis

__all__ = [
    "EncodedRow",
    "EntityKey",
    "OnlineRow",
    "OnlineStore",
    "RedisOnlineStore",
    "SqliteOnlineStore",
    "encode_payloads",
    "encode_rows",
    "open_online_store",
]

logger = logging.getLogger(__name__)

EntityKey = tuple[str | int | float | bool | None, ...]
"""An entity's join-key values, in the order of the view's join keys."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: Rows per write round trip (Redis script call, SQLite executemany batch).
_CHUNK = 2000
#: Most bound parameters per SQLite read query (below the library's own limit, 32766 since
#: SQLite 3.32, and never above what the connection reports).
_SQLITE_VARIABLES = 30000
_REDIS_CONNECT_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class OnlineRow:
    """The stored row of one (view, entity).

    Attributes:
        event_ts: the row's event time, tz-aware UTC.
        values: feature name -> value (int, float incl. NaN, str, bool, None, or a tz-aware
            UTC datetime).
    """

    event_ts: datetime
    values: dict[str, Any]


class OnlineStore(Protocol):
    """Where materialized feature rows live, keyed by (view, entity key).

    Contract shared by every backend:

    - thread-safe: one instance serves reads and writes from many threads at once;
    - writes are monotonic and idempotent: a row replaces the stored row of its
      (view, entity) only when its event time is >= the stored one's, so replaying a chunk
      changes nothing and an older chunk never overwrites a newer one;
    - each read returns fresh objects the caller may keep or change (a key asked twice in
      one read gets the same row objects twice);
    - a bad argument (a column that is missing or of a type the store cannot keep)
      raises :class:`~shamal.errors.InvalidParameter`; an unreachable backend raises
      :class:`~shamal.errors.ServiceUnavailable`; a closed store raises
      :class:`~shamal.errors.Conflict`.
    """

    def write(
        self,
        view: str,
        rows: pa.Table,
        join_keys: Sequence[str],
        timestamp_field: str,
        features: Sequence[str],
    ) -> int:
        """Write each row's ``features`` under (``view``, its ``join_keys`` values).

        A row older than the stored one is skipped. Several rows of one key in one call:
        the latest event time wins (ties: the later row). Rows with a null key part or a
        null timestamp are skipped.

        Returns:
            how many keys now hold the row this call wrote.
        """
        ...

    def write_encoded(self, view: str, rows: Sequence[EncodedRow]) -> int:
        """:meth:`write` of rows already encoded (:func:`encode_rows`, or payloads a query
        made; one row per entity): the same rules, without the encoding. A plain
        ``(entity, event_us, payload)`` tuple is taken as an :class:`EncodedRow`."""
        ...

    def read(
        self, views: Sequence[str], keys: Sequence[EntityKey]
    ) -> list[dict[str, OnlineRow | None]]:
        """The stored rows of ``views`` for each of ``keys``, in one round trip.

        Returns:
            for each key, in order: view name -> its row, or None (no row, unknown view,
            or a key whose shape differs from the view's).
        """
        ...

    def delete_view(self, view: str) -> int:
        """Remove every row of ``view``; returns how many there were."""
        ...

    def count(self, view: str) -> int:
        """How many entities ``view`` holds a row for (exact)."""
        ...

    def ping(self) -> None:
        """Raise :class:`~shamal.errors.ServiceUnavailable` unless the backend answers."""
        ...

    def close(self) -> None:
        """Release connections; the store cannot be used afterwards. Idempotent."""
        ...


# ---------------------------------------------------------------------- encodings
def encode_key(key: Sequence[Any]) -> bytes | None:
    """The canonical bytes of an entity key, or None when it names no entity.

    Raises:
        InvalidParameter: a key part is not a str, int, float, bool or None.
    """
    parts: list[Any] = []
    for part in key:
        if part is None:
            return None
        kind = type(part)
        if kind is float:
            if not math.isfinite(part):
                return None
            if part.is_integer():
                part = int(part)
        elif kind is not int and kind is not str and kind is not bool:
            raise InvalidParameter(
                f"an entity key part is a {kind.__name__}; use str, int, float or bool values"
            )
        parts.append(part)
    try:
        return orjson.dumps(parts)
    except orjson.JSONEncodeError:
        raise InvalidParameter("an entity key int is wider than 64 bits") from None


def _column_keys(column: pa.ChunkedArray, name: str) -> list[Any]:
    """A join-key column as Python values, floats that are whole numbers as ints."""
    kind = column.type
    if pa.types.is_dictionary(kind):
        column = column.cast(kind.value_type)
        kind = column.type
    if pa.types.is_floating(kind):
        finite = pc.is_finite(column)
        column = pc.if_else(finite, column, None)
        return [int(v) if v is not None and v.is_integer() else v for v in column.to_pylist()]
    if (
        pa.types.is_integer(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_boolean(kind)
    ):
        return column.to_pylist()  # type: ignore[no-any-return]
    raise InvalidParameter(
        f"the join key {name!r} is of type {kind}; an entity key needs string, integer, "
        "float or boolean columns"
    )


def _micros(column: pa.ChunkedArray, name: str) -> list[int | None]:
    """A timestamp column as microseconds since the epoch (naive times read as UTC)."""
    kind = column.type
    if not pa.types.is_timestamp(kind):
        raise InvalidParameter(
            f"the column {name!r} is of type {kind}; event times and datetime features "
            "need a timestamp column"
        )
    as_us = column.cast(pa.timestamp("us", tz=kind.tz), safe=False)
    return as_us.cast(pa.int64()).to_pylist()  # type: ignore[no-any-return]


_FEATURE_KINDS = (
    pa.types.is_integer,
    pa.types.is_floating,
    pa.types.is_boolean,
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_null,
)


def _feature_column(column: pa.ChunkedArray, name: str) -> tuple[list[Any], dict[int, list[Any]]]:
    """A feature column as (JSON-exact values, row index -> tag for the rest)."""
    kind = column.type
    if pa.types.is_dictionary(kind):
        column = column.cast(kind.value_type)
        kind = column.type
    if pa.types.is_timestamp(kind):
        micros = _micros(column, name)
        stamped = {i: ["t", us] for i, us in enumerate(micros) if us is not None}
        return [None] * len(micros), stamped
    if not any(test(kind) for test in _FEATURE_KINDS):
        raise InvalidParameter(
            f"the feature {name!r} is of type {kind}; the online store keeps integers, "
            "floats, booleans, strings and timestamps (cast the column first)"
        )
    values = column.to_pylist()
    tags: dict[int, list[Any]] = {}
    if pa.types.is_floating(kind) and pc.any(pc.invert(pc.is_finite(column))).as_py():
        for i, v in enumerate(values):
            if v is not None and not math.isfinite(v):
                tags[i] = ["f", repr(v)]
                values[i] = None
    return values, tags


def _untag(tag: list[Any]) -> Any:
    if tag[0] == "t":
        return _EPOCH + timedelta(microseconds=tag[1])
    return float(tag[1])


class RowDecoder:
    """Turns stored rows (parsed JSON) into :class:`OnlineRow` objects; one per read, so
    that rows of the same event time (the rule after a materialization) share one
    datetime instead of building each."""

    __slots__ = ("_times",)

    def __init__(self) -> None:
        self._times: dict[int, datetime] = {}

    def __call__(self, decoded: list[Any] | None) -> OnlineRow | None:
        if decoded is None:
            return None
        micros: int = decoded[0]
        when = self._times.get(micros)
        if when is None:
            when = self._times[micros] = _EPOCH + timedelta(microseconds=micros)
        values: dict[str, Any] = decoded[1]
        if len(decoded) > 2:
            for name, tag in decoded[2].items():
                values[name] = _untag(tag)
        return OnlineRow(when, values)


def _parse_payloads(payloads: Sequence[bytes]) -> list[Any]:
    """Parse many stored rows with one JSON parse (each payload is a JSON array)."""
    return orjson.loads(b"[" + b",".join(payloads) + b"]")  # type: ignore[no-any-return]


class EncodedRow(NamedTuple):
    """One row ready to store: its entity key bytes, event time and payload (a tuple: a
    materialization makes millions, and a frozen dataclass costs five times as much)."""

    entity: bytes
    event_us: int
    payload: bytes


def _require_columns(rows: pa.Table, names: Sequence[str]) -> None:
    missing = [n for n in names if n not in rows.column_names]
    if missing:
        shown = ", ".join(repr(n[:80]) for n in missing[:5])
        raise InvalidParameter(
            f"the rows lack the column(s) {shown}; pass a table with every join key, "
            "the timestamp field and every feature"
        )


def _latest_per_entity(
    key_columns: list[list[Any]], stamps: list[int | None]
) -> dict[bytes, tuple[int, int]]:
    """Entity key bytes -> (event micros, row index) of its latest row (ties: the later row),
    skipping rows with a null key part or a null event time."""
    latest: dict[bytes, tuple[int, int]] = {}
    dumps = orjson.dumps
    for i, (us, parts) in enumerate(zip(stamps, zip(*key_columns, strict=True), strict=True)):
        if us is None or None in parts:
            continue
        entity = dumps(parts)  # a tuple is a JSON array, as encode_key's list is
        seen = latest.get(entity)
        if seen is None or us >= seen[0]:
            latest[entity] = (us, i)
    return latest


def encode_rows(
    rows: pa.Table, join_keys: Sequence[str], timestamp_field: str, features: Sequence[str]
) -> list[EncodedRow]:
    """The rows to store, one per entity: the latest event time of each key wins (ties:
    the later row); rows with a null key part or a null event time are dropped.

    Raises:
        InvalidParameter: a column is missing or of a type the store cannot keep.
    """
    if not join_keys:
        raise InvalidParameter("a feature view needs at least one join key")
    _require_columns(rows, [*join_keys, timestamp_field, *features])
    latest = _latest_per_entity(
        [_column_keys(rows.column(k), k) for k in join_keys],
        _micros(rows.column(timestamp_field), timestamp_field),
    )
    columns = [(name, *_feature_column(rows.column(name), name)) for name in features]
    names = [name for name, _, _ in columns]
    # Rows as tuples in one pass over the columns (C-level), each made a dict by name.
    by_row = list(zip(*(values for _, values, _ in columns), strict=True)) if columns else []
    tagging = [(name, tagged) for name, _, tagged in columns if tagged]
    dumps = orjson.dumps
    encoded = []
    for entity, (us, i) in latest.items():
        values = dict(zip(names, by_row[i], strict=True)) if columns else {}
        tags = {name: tagged[i] for name, tagged in tagging if i in tagged} if tagging else None
        body = [us, values, tags] if tags else [us, values]
        encoded.append(EncodedRow(entity, us, dumps(body)))
    return encoded


def encode_payloads(
    rows: pa.Table, join_keys: Sequence[str], timestamp_field: str, payloads: Sequence[bytes]
) -> list[EncodedRow]:
    """The rows to store, their payloads made already (one per row of ``rows``, each a
    stored row's JSON as :func:`encode_rows` makes it: a query can make them column by
    column); keys and the latest-per-entity rule as :func:`encode_rows`.

    Raises:
        InvalidParameter: a key or the timestamp column is missing or of a type the store
            cannot keep; as many payloads as rows are not given.
    """
    if not join_keys:
        raise InvalidParameter("a feature view needs at least one join key")
    _require_columns(rows, [*join_keys, timestamp_field])
    if len(payloads) != rows.num_rows:
        raise InvalidParameter("one payload per row is needed")
    latest = _latest_per_entity(
        [_column_keys(rows.column(k), k) for k in join_keys],
        _micros(rows.column(timestamp_field), timestamp_field),
    )
    return [EncodedRow(entity, us, payloads[i]) for entity, (us, i) in latest.items()]


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


# ---------------------------------------------------------------------- SQLite
_SCHEMA = """
CREATE TABLE IF NOT EXISTS online_features (
    view TEXT NOT NULL,
    entity BLOB NOT NULL,
    event_ts INTEGER NOT NULL,
    payload BLOB NOT NULL,
    PRIMARY KEY (view, entity)
) WITHOUT ROWID
"""

_UPSERT = """
INSERT INTO online_features (view, entity, event_ts, payload) VALUES (?, ?, ?, ?)
ON CONFLICT (view, entity) DO UPDATE SET event_ts = excluded.event_ts,
    payload = excluded.payload
WHERE excluded.event_ts >= online_features.event_ts
"""


class _EncodingStore(abc.ABC):
    """What both stores share: :meth:`OnlineStore.write` is :func:`encode_rows`, then the
    store's own ``write_encoded``."""

    @abc.abstractmethod
    def write_encoded(self, view: str, encoded: Sequence[EncodedRow]) -> int:
        """See :meth:`OnlineStore.write_encoded`."""

    def write(
        self,
        view: str,
        rows: pa.Table,
        join_keys: Sequence[str],
        timestamp_field: str,
        features: Sequence[str],
    ) -> int:
        """See :meth:`OnlineStore.write`."""
        return self.write_encoded(view, encode_rows(rows, join_keys, timestamp_field, features))


class SqliteOnlineStore(_EncodingStore):
    """The embedded online store: one SQLite file in WAL mode.

    Thread-safe: each thread has its own connection (readers never wait for each other nor
    for a writer); writes take SQLite's write lock for one transaction per call.

    Args:
        path: the database file; it and its folder are created when missing.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[sqlite3.Connection] = []
        self._closed = False
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._errors():
            connection = self._connection()
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        """A new connection (subclasses may instrument it)."""
        connection = sqlite3.connect(
            self.path, timeout=30.0, isolation_level=None, check_same_thread=False
        )
        connection.execute("PRAGMA synchronous=NORMAL")
        return connection

    def _connection(self) -> sqlite3.Connection:
        if self._closed:
            raise Conflict("the online store is closed")
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._connect()
            with self._lock:
                self._connections.append(connection)
            self._local.connection = connection
        return connection

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            logger.warning("online store %s failed: %s", self.path, exc)
            raise ServiceUnavailable(
                f"the online store's SQLite database failed ({type(exc).__name__}); "
                "check the server's disk and retry"
            ) from None

    def write_encoded(self, view: str, encoded: Sequence[EncodedRow]) -> int:
        """See :meth:`OnlineStore.write_encoded`: one transaction."""
        if not encoded:
            return 0
        with self._errors():
            connection = self._connection()
            connection.execute("BEGIN IMMEDIATE")
            try:
                cursor = connection.executemany(
                    _UPSERT, [(view, r[0], r[1], r[2]) for r in encoded]
                )
                written = cursor.rowcount
                connection.execute("COMMIT")
            except BaseException:
                connection.execute("ROLLBACK")
                raise
        return written

    def read(
        self, views: Sequence[str], keys: Sequence[EntityKey]
    ) -> list[dict[str, OnlineRow | None]]:
        """See :meth:`OnlineStore.read`: one SELECT (per 30,000 bound values)."""
        entities = [encode_key(key) for key in keys]
        found: dict[tuple[str, bytes], bytes] = {}
        wanted = sorted({e for e in entities if e is not None})
        views = list(dict.fromkeys(views))
        if wanted and views:
            with self._errors():
                connection = self._connection()
                limit = connection.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
                per_query = max(1, min(limit, _SQLITE_VARIABLES) - len(views))
                for batch in _chunks(wanted, per_query):
                    query = (
                        "SELECT view, entity, payload FROM online_features WHERE view IN "  # nosec B608 - placeholders only
                        f"({','.join('?' * len(views))}) AND entity IN "
                        f"({','.join('?' * len(batch))})"
                    )
                    for view, entity, payload in connection.execute(query, [*views, *batch]):
                        found[view, entity] = payload
        decode = RowDecoder()
        rows = {
            where: decode(parsed)
            for where, parsed in zip(found, _parse_payloads(list(found.values())), strict=True)
        }
        return [
            {view: rows.get((view, entity)) if entity is not None else None for view in views}
            for entity in entities
        ]

    def delete_view(self, view: str) -> int:
        """See :meth:`OnlineStore.delete_view`."""
        with self._errors():
            cursor = self._connection().execute(
                "DELETE FROM online_features WHERE view = ?", (view,)
            )
            return cursor.rowcount

    def count(self, view: str) -> int:
        """See :meth:`OnlineStore.count`."""
        with self._errors():
            (n,) = (
                self._connection()
                .execute("SELECT count(*) FROM online_features WHERE view = ?", (view,))
                .fetchone()
            )
        return int(n)

    def ping(self) -> None:
        """See :meth:`OnlineStore.ping`."""
        with self._errors():
            self._connection().execute("SELECT 1 FROM online_features LIMIT 1").fetchall()

    def close(self) -> None:
        """See :meth:`OnlineStore.close`."""
        self._closed = True
        with self._lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            connection.close()


# ---------------------------------------------------------------------- Redis
#: KEYS[1]: the view's set of entity hashes. ARGV[1]: the view (the hash field); ARGV[2]:
#: the prefix of entity hashes; ARGV[3]: the rows, each "<entity key JSON>\n<payload>\n"
#: (JSON holds no raw newline). One argument for a whole chunk: packing an argument per row
#: cost redis-py more than the script's own work. A payload starts with "[<event micros>,",
#: so both times are read from the payloads. The entity hashes are named here, not in KEYS:
#: a single Redis (Redis Cluster is not supported by this store anyway).
_WRITE_SCRIPT = """
local field = ARGV[1]
local prefix = ARGV[2]
local written = 0
for entity, payload in string.gmatch(ARGV[3], '([^\\n]*)\\n([^\\n]*)\\n') do
  local key = prefix .. entity
  local old = redis.call('HGET', key, field)
  if not old then
    redis.call('HSET', key, field, payload)
    redis.call('SADD', KEYS[1], key)
    written = written + 1
  elseif tonumber(string.match(old, '^%[(%-?%d+)'))
      <= tonumber(string.match(payload, '^%[(%-?%d+)')) then
    redis.call('HSET', key, field, payload)
    written = written + 1
  end
end
return written
"""

#: KEYS: entity hashes; ARGV: views. Returns one JSON array of len(KEYS) * len(ARGV) rows
#: (null where missing), entity-major: Redis concatenates what Python would parse reply by
#: reply, and one JSON parse reads it (twice as fast as a pipeline of HMGETs in redis-py).
_READ_SCRIPT = """
local rows = {}
local n = 0
for i = 1, #KEYS do
  local got = redis.call('HMGET', KEYS[i], unpack(ARGV))
  for j = 1, #ARGV do
    n = n + 1
    rows[n] = got[j] or 'null'
  end
end
return '[' .. table.concat(rows, ',') .. ']'
"""

#: KEYS[1]: the view's set; KEYS[2..]: some of its entity hashes. ARGV[1]: the view.
_DELETE_SCRIPT = """
local deleted = 0
for i = 2, #KEYS do
  deleted = deleted + redis.call('HDEL', KEYS[i], ARGV[1])
  redis.call('SREM', KEYS[1], KEYS[i])
end
return deleted
"""


def _describe(url: str) -> str:
    """host:port/db of a Redis URL, without its credentials.

    Raises:
        InvalidParameter: the URL's port is not a number.
    """
    parts = urlsplit(url)
    try:
        port = parts.port or 6379
    except ValueError:
        raise InvalidParameter(
            "the online store's Redis URL has a bad port; use redis://host:port/db"
        ) from None
    return f"{parts.hostname or 'localhost'}:{port}{parts.path[:40]}"


class RedisOnlineStore(_EncodingStore):
    """The production online store: one Redis hash per entity, a field per view.

    Layout, under ``prefix``: ``e:<entity key>`` is a hash (field: view name, value: the
    row); ``v:<view>`` is the set of the entity hashes holding that view, which makes
    :meth:`count` exact and :meth:`delete_view` touch only that view's fields. Writes run a
    server-side script that keeps each field's newest row (atomic per call, 2,000 rows a
    call); a read is one server-side script that HMGETs every entity, one round trip.

    Thread-safe (redis-py's connection pool).

    Args:
        url: ``redis://[user:password@]host:port/db`` (or ``rediss://``).
        prefix: the namespace of every key this store makes.
    """

    def __init__(self, url: str, *, prefix: str = "shamal:features:") -> None:
        self._where = _describe(url)
        self._prefix = prefix.encode()
        self._closed = False
        try:
            self._client = self._connect(url)
        except ValueError:
            raise InvalidParameter(
                f"the online store's Redis URL for {self._where} is malformed; "
                "use redis://[user:password@]host:port/db"
            ) from None
        self._write_script = self._client.register_script(_WRITE_SCRIPT)
        self._delete_script = self._client.register_script(_DELETE_SCRIPT)

    def _connect(self, url: str) -> redis.Redis:
        """The client (subclasses may instrument it)."""
        import redis

        return redis.Redis.from_url(
            url, socket_connect_timeout=_REDIS_CONNECT_SECONDS, socket_timeout=30.0
        )

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        import redis

        if self._closed:
            raise Conflict("the online store is closed")
        try:
            yield
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise ServiceUnavailable(
                f"cannot reach the online store's Redis at {self._where} "
                f"({type(exc).__name__}); check that it runs and retry"
            ) from None

    def _entity_key(self, entity: bytes) -> bytes:
        return self._prefix + b"e:" + entity

    def _view_key(self, view: str) -> bytes:
        return self._prefix + b"v:" + view.encode()

    def write_encoded(self, view: str, encoded: Sequence[EncodedRow]) -> int:
        """See :meth:`OnlineStore.write_encoded`: one script call per 2,000 rows."""
        view_key = self._view_key(view)
        written = 0
        with self._errors():
            for batch in _chunks(encoded, _CHUNK):
                rows = b"".join(b"%s\n%s\n" % (row[0], row[2]) for row in batch)
                args: list[str | bytes] = [view, self._prefix + b"e:", rows]
                written += int(self._write_script(keys=[view_key], args=args))
        return written

    def read(
        self, views: Sequence[str], keys: Sequence[EntityKey]
    ) -> list[dict[str, OnlineRow | None]]:
        """See :meth:`OnlineStore.read`: one script call (HMGET of every entity's hash)."""
        entities = [encode_key(key) for key in keys]
        views = list(dict.fromkeys(views))
        wanted = list(dict.fromkeys(e for e in entities if e is not None))
        if not wanted or not views:
            return [dict.fromkeys(views) for _ in entities]
        with self._errors():
            # EVAL, not EVALSHA: one round trip even when the server's script cache is cold.
            reply = self._client.eval(
                _READ_SCRIPT, len(wanted), *(self._entity_key(e) for e in wanted), *views
            )
        decode = RowDecoder()
        flat = [decode(row) for row in orjson.loads(reply)]
        width = len(views)
        found = {
            entity: dict(zip(views, flat[i * width : (i + 1) * width], strict=True))
            for i, entity in enumerate(wanted)
        }
        return [
            dict(found[entity]) if entity is not None else dict.fromkeys(views)
            for entity in entities
        ]

    def delete_view(self, view: str) -> int:
        """See :meth:`OnlineStore.delete_view`: the view's set, 2,000 entities a call."""
        view_key = self._view_key(view)
        deleted = 0
        with self._errors():
            while True:
                members: list[bytes] = self._client.srandmember(view_key, _CHUNK)  # type: ignore[assignment]
                if not members:
                    break
                deleted += int(self._delete_script(keys=[view_key, *members], args=[view]))
        return deleted

    def count(self, view: str) -> int:
        """See :meth:`OnlineStore.count`."""
        with self._errors():
            return int(self._client.scard(self._view_key(view)))

    def ping(self) -> None:
        """See :meth:`OnlineStore.ping`."""
        with self._errors():
            self._client.ping()

    def close(self) -> None:
        """See :meth:`OnlineStore.close`."""
        self._closed = True
        self._client.close()


def open_online_store(url: str, *, home: Path) -> OnlineStore:
    """The online store a URL names.

    Args:
        url: ``sqlite`` (the file ``home / "online-features.db"``), ``sqlite:///abs/path.db``,
            or ``redis://host:port/db`` (``rediss://`` for TLS).
        home: the server's home folder.

    Raises:
        InvalidParameter: the URL names no store this server offers.
    """
    if url == "sqlite":
        return SqliteOnlineStore(home / "online-features.db")
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite://") :])
        if not path.is_absolute() or path.name in {"", ".", ".."}:
            raise InvalidParameter(
                "an online store URL sqlite:///... needs an absolute file path, "
                "e.g. sqlite:////var/lib/shamal/online.db"
            )
        return SqliteOnlineStore(path)
    if url.startswith(("redis://", "rediss://")):
        return RedisOnlineStore(url)
    scheme = url.split(":", 1)[0][:20]
    raise InvalidParameter(
        f"the online store URL scheme {scheme!r} is not offered; use 'sqlite', "
        "'sqlite:///abs/path.db' or 'redis://host:port/db'"
    )
