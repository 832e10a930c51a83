"""Stream records into rows: the micro-batcher of a consumer, and rows checked against a
dataset's columns. Pure: no broker, database or web framework.

A consumer adds each delivered :class:`Message` to a :class:`MicroBatcher`, which closes a
batch by size (``max_rows``) or age (``max_seconds``) and drops a key seen twice in one batch
(both deliveries are acknowledged with the batch). :func:`decode` turns payloads into rows,
parking what is not a JSON object. On the server, :func:`to_table` makes the rows one Arrow
table of the dataset's columns, parking each row that does not fit (wrong columns, a value
of the wrong type). A parked record's reason names the column and the type, never a value.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from shamal.datasets._entities import DeadLetter

__all__ = [
    "MAX_BATCH_BYTES",
    "MAX_KEY",
    "MAX_PAYLOAD",
    "STREAM_PATTERN",
    "Batch",
    "Converted",
    "Message",
    "MicroBatcher",
    "arrow_schema",
    "decode",
    "row_digest",
    "to_table",
]

#: The largest payload taken as a record (a larger one is parked).
MAX_PAYLOAD = 1 << 20
#: Payload bytes that close a batch whatever its row count (under the server's request limit,
#: so a batch rarely needs splitting; memory stays bounded by it, not by ``max_rows``).
MAX_BATCH_BYTES = 8 << 20
#: The longest idempotency key (a longer one is hashed to fit).
MAX_KEY = 256
#: What a stream's keys are unique within: ``scheme:name``, printable, no ``@`` (so never a
#: URL's user info), or ``push``.
STREAM_PATTERN = r"^(push|[a-z][a-z0-9+.-]{0,15}:[\x21-\x3f\x41-\x7e]{1,238})$"
_TZ_TIMESTAMP = re.compile(r"^timestamp\[(s|ms|us|ns), tz=([A-Za-z0-9_/+:-]+)\]$")
_CONVERT_ERRORS = (pa.ArrowException, TypeError, ValueError, OverflowError)


@dataclass(frozen=True, slots=True)
class Message:
    """One delivery from a broker: its idempotency key, its payload, and what the broker
    needs to acknowledge it (``token``)."""

    key: str
    payload: bytes
    token: Any = None


@dataclass(slots=True)
class Batch:
    """A closed micro-batch: ``unique`` messages by first delivery of each key, and every
    delivery (``all``) to acknowledge once the batch is committed."""

    unique: list[Message] = field(default_factory=list)
    all: list[Message] = field(default_factory=list)


def stream_name(scheme: str, name: str) -> str:
    """``scheme:name`` when it fits :data:`STREAM_PATTERN`, else ``scheme:sha256-...``."""
    candidate = f"{scheme}:{name}"
    if re.match(STREAM_PATTERN, candidate):
        return candidate
    return f"{scheme}:sha256-{hashlib.sha256(name.encode('utf-8', 'surrogatepass')).hexdigest()}"


def fit_key(key: str) -> str:
    """``key`` as stored: itself when short enough, else its sha256."""
    if len(key) <= MAX_KEY and key.isprintable():
        return key
    return "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


class MicroBatcher:
    """Collects messages into batches closed at ``max_rows`` distinct records, ``max_bytes``
    of their payloads, or ``max_seconds`` after the first one arrived, whichever comes
    first."""

    def __init__(
        self,
        max_rows: int,
        max_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        max_bytes: int = MAX_BATCH_BYTES,
    ) -> None:
        if max_rows < 1 or max_seconds <= 0 or max_bytes < 1:
            raise ValueError("max_rows and max_bytes must be at least 1 and max_seconds above 0")
        self.max_rows = max_rows
        self.max_seconds = max_seconds
        self.max_bytes = max_bytes
        self._clock = clock
        self._batch = Batch()
        self._keys: set[str] = set()
        self._bytes = 0
        self._opened: float | None = None

    def add(self, message: Message) -> bool:
        """Add a delivery; False when its key is already in the batch (a duplicate)."""
        if self._opened is None:
            self._opened = self._clock()
        self._batch.all.append(message)
        if message.key in self._keys:
            return False
        self._keys.add(message.key)
        self._batch.unique.append(message)
        self._bytes += len(message.payload)
        return True

    @property
    def pending(self) -> int:
        return len(self._batch.all)

    def time_left(self) -> float:
        """Seconds until the open batch is due by age (``max_seconds`` when none is open)."""
        if self._opened is None:
            return self.max_seconds
        return max(0.0, self._opened + self.max_seconds - self._clock())

    def due(self) -> bool:
        if not self._batch.all:
            return False
        full = len(self._batch.unique) >= self.max_rows or self._bytes >= self.max_bytes
        return full or self.time_left() <= 0

    def room(self) -> int:
        """How many more distinct records the open batch takes."""
        if self._bytes >= self.max_bytes:
            return 0
        return max(0, self.max_rows - len(self._batch.unique))

    def take(self) -> Batch:
        """The open batch, closed; a new one opens with the next message."""
        batch, self._batch, self._keys, self._opened = self._batch, Batch(), set(), None
        self._bytes = 0
        return batch


def _digest(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


def row_digest(row: Any) -> str:
    """sha256 of a row's canonical JSON (how a parked row is found at its producer)."""
    text = json.dumps(row, sort_keys=True, separators=(",", ":"), default=str)
    return _digest(text.encode())


def _decoded(message: Message) -> tuple[dict[str, Any] | None, str]:
    if len(message.payload) > MAX_PAYLOAD:
        return None, f"the payload is over {MAX_PAYLOAD:,} bytes"
    try:
        value = json.loads(message.payload.decode("utf-8"))
    except UnicodeDecodeError:
        return None, "the payload is not UTF-8"
    except json.JSONDecodeError as exc:
        return None, f"the payload is not JSON (line {exc.lineno}, column {exc.colno})"
    except RecursionError:
        return None, "the payload nests too deeply"
    if not isinstance(value, dict):
        return None, "the payload is not a JSON object (one object is one row)"
    return value, ""


def decode(
    messages: Sequence[Message],
) -> tuple[list[tuple[str, dict[str, Any]]], list[DeadLetter]]:
    """The rows of ``messages`` (one JSON object each) by key, and the messages parked."""
    rows: list[tuple[str, dict[str, Any]]] = []
    dead: list[DeadLetter] = []
    for message in messages:
        row, reason = _decoded(message)
        if row is None:
            dead.append(
                DeadLetter(message.key, reason, _digest(message.payload), len(message.payload))
            )
        else:
            rows.append((message.key, row))
    return rows, dead


def _arrow_type(text: str) -> pa.DataType | None:
    zoned = _TZ_TIMESTAMP.match(text)
    if zoned:
        return pa.timestamp(zoned.group(1), tz=zoned.group(2))
    try:
        return pa.type_for_alias(text)
    except (ValueError, KeyError):
        return None


def arrow_schema(columns: Sequence[dict[str, Any]]) -> pa.Schema | None:
    """The Arrow schema of a version's columns, or None if a type has no plain name
    (nested types): the rows are then typed as Arrow infers, and the write checks them."""
    fields = []
    for column in columns:
        kind = _arrow_type(str(column.get("type", "")))
        if kind is None:
            return None
        fields.append(pa.field(str(column["name"]), kind, bool(column.get("nullable", True))))
    return pa.schema(fields)


@dataclass(frozen=True, slots=True)
class Converted:
    """Rows made a table of the dataset's columns (None: no row fit), their keys in order,
    and the rows parked."""

    table: pa.Table | None
    keys: list[str]
    dead: list[DeadLetter]


def _infer(rows: Sequence[dict[str, Any]]) -> pa.Schema | None:
    first = next((row for row in rows if isinstance(row, dict) and row), None)
    if first is None:
        return None
    alike = [row for row in rows if isinstance(row, dict) and row.keys() == first.keys()]
    for sample in (alike, [first]):
        try:
            return pa.Table.from_pylist(list(sample)).schema
        except _CONVERT_ERRORS:
            continue
    return None


def _value(value: Any, kind: pa.DataType) -> pa.Array:
    try:
        return pa.array([value], type=kind)
    except _CONVERT_ERRORS:
        if not isinstance(value, str):
            raise
        return pa.array([value]).cast(kind)  # ISO dates and times, numbers as text


def _shape_problem(row: Any, schema: pa.Schema) -> str:
    """Why ``row`` has not the columns of ``schema`` ("" when it has); names no value."""
    if not isinstance(row, dict):
        return "the record is not a JSON object"
    if row.keys() == set(schema.names):
        return ""
    missing = [name for name in schema.names if name not in row]
    extra = len([name for name in row if name not in schema.names])
    said = [f"missing {', '.join(map(repr, missing[:5]))}" if missing else ""]
    said.append(f"{extra} unexpected" if extra else "")
    return f"the record's columns differ from the dataset's ({'; '.join(filter(None, said))})"


def _plain(value: Any, kind: pa.DataType) -> bool:
    """Whether ``value``'s JSON type may become ``kind`` (Arrow itself would truncate 1.5
    to 1 in an integer column, and take true as 1)."""
    if value is None or isinstance(value, bool):
        return value is None or bool(pa.types.is_boolean(kind))
    if pa.types.is_integer(kind):
        return isinstance(value, int | str) or (isinstance(value, float) and value.is_integer())
    allowed: tuple[type, ...] | None = None
    if pa.types.is_boolean(kind):
        allowed = ()
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        allowed = (str,)
    elif pa.types.is_floating(kind):
        allowed = (int, float, str)
    return allowed is None or isinstance(value, allowed)


def _gate_problem(row: dict[str, Any], schema: pa.Schema) -> str:
    for column in schema:
        if not _plain(row[column.name], column.type):
            return f"column {column.name!r} is not a {column.type}"
    return ""


def _type_problem(row: dict[str, Any], schema: pa.Schema) -> str:
    for column in schema:
        try:
            _value(row[column.name], column.type)
        except _CONVERT_ERRORS:
            return f"column {column.name!r} is not a {column.type}"
    return ""


def _parked(key: str, row: Any, reason: str) -> DeadLetter:
    return DeadLetter(key, reason, row_digest(row), len(json.dumps(row, default=str)))


def _as_table(rows: Sequence[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    try:  # the common case: every value converts as it is, in one call
        return pa.Table.from_pylist(list(rows), schema=schema)
    except _CONVERT_ERRORS:
        arrays = [
            pa.concat_arrays([_value(row[column.name], column.type) for row in rows])
            for column in schema
        ]
        return pa.Table.from_arrays(arrays, schema=schema)


def to_table(records: Sequence[tuple[str, Any]], schema: pa.Schema | None) -> Converted:
    """``records`` (key, row) as one table of ``schema`` (None: inferred from the rows);
    a row that does not fit (wrong columns, a value of another type) is parked."""
    if schema is None:
        schema = _infer([row for _key, row in records])
    if schema is None:
        return Converted(
            None, [], [_parked(k, r, "the record is not a JSON object") for k, r in records]
        )
    dead: list[DeadLetter] = []
    fit: list[tuple[str, dict[str, Any]]] = []
    for key, row in records:
        reason = _shape_problem(row, schema) or _gate_problem(row, schema)
        if reason:
            dead.append(_parked(key, row, reason))
        else:
            fit.append((key, row))
    if not fit:
        return Converted(None, [], dead)
    try:
        table = pa.Table.from_pylist([row for _key, row in fit], schema=schema)
    except _CONVERT_ERRORS:  # some value will not convert: find which rows, one by one
        return _one_by_one(fit, schema, dead)
    return Converted(table, [key for key, _row in fit], dead)


def _one_by_one(
    fit: list[tuple[str, dict[str, Any]]], schema: pa.Schema, dead: list[DeadLetter]
) -> Converted:
    typed = []
    for key, row in fit:
        reason = _type_problem(row, schema)
        if reason:
            dead.append(_parked(key, row, reason))
        else:
            typed.append((key, row))
    if not typed:
        return Converted(None, [], dead)
    return Converted(_as_table([row for _key, row in typed], schema), [k for k, _ in typed], dead)
