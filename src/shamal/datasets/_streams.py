"""Streams into datasets: micro-batches of keyed records, and pushes, written exactly once.

Every record a stream delivers has an idempotency key (a broker's message id or sequence
number; a push's ``Idempotency-Key``). The keys of a micro-batch are recorded in the
transaction that commits its version (``data_stream_keys``), so a consumer acknowledges a
batch to its broker only after the commit, and a redelivered record whose key is committed is
acknowledged and skipped: a consumer killed between the commit and the acknowledgement, or a
retried push, writes each record once. Two writers racing with the same key: one commits, the
other's transaction fails on the key and is retried, skipping it.

A record that cannot be a row (not a JSON object, wrong columns, a value of another type) is
parked as a dead letter in the same transaction, with the reason and its digest, never its
payload; its key is committed too, so it is not retried for ever and blocks nothing.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from sqlalchemy.orm import Session

from shamal.clock import Clock, utc_now
from shamal.datasets import _ingest, _store
from shamal.datasets._batcher import STREAM_PATTERN, arrow_schema, row_digest, to_table
from shamal.datasets._entities import DataVersion, DeadLetter, WriteMode
from shamal.datasets._service import DatasetService
from shamal.db import Database
from shamal.errors import AlreadyExists, Conflict, InvalidParameter
from shamal.security import AuditContext, AuditLog, Principal, Role

__all__ = ["MAX_RECORDS", "PUSH", "StreamService", "StreamWrite", "check_stream"]

#: The stream a push's ``Idempotency-Key`` is unique within.
PUSH = "push"
#: The most records (rows and parked ones) one micro-batch may carry.
MAX_RECORDS = 10_000
_STREAM = re.compile(STREAM_PATTERN)
_ATTEMPTS = 3


def check_stream(stream: str) -> str:
    """``stream`` if it names a stream (``redis:events``, ``amqp:orders``): printable, and
    without ``@``, so never a URL with credentials in it."""
    if _STREAM.match(stream):
        return stream
    raise InvalidParameter(
        "a stream is named 'scheme:name' (printable, at most 255 characters, no '@'): never "
        "a URL with credentials"
    )


@dataclass(frozen=True, slots=True)
class StreamWrite:
    """What a micro-batch or push did: the version it wrote (or, replayed, the version
    that holds it), the rows written, the records skipped as already committed, the records
    parked."""

    version: DataVersion | None
    written: int = 0
    skipped: int = 0
    parked: int = 0
    replayed: bool = False


def _first_of_each(
    records: Sequence[tuple[str, Any]], dead: Sequence[DeadLetter], done: set[str]
) -> tuple[list[tuple[str, Any]], list[DeadLetter]]:
    """The records and dead letters whose keys are not ``done``, each key once."""
    seen = set(done)
    fresh: list[tuple[str, Any]] = []
    for key, row in records:
        if key not in seen:
            seen.add(key)
            fresh.append((key, row))
    letters: list[DeadLetter] = []
    for letter in dead:
        if letter.key not in seen:
            seen.add(letter.key)
            letters.append(letter)
    return fresh, letters


class StreamService:
    """Micro-batches and pushes into dataset versions, exactly once by key."""

    def __init__(
        self,
        db: Database,
        audit: AuditLog,
        datasets: DatasetService,
        work_dir: Path,
        clock: Clock = utc_now,
    ) -> None:
        self._db = db
        self._audit = audit
        self._datasets = datasets
        self._work_dir = work_dir
        self._clock = clock

    def _member(self, s: Session, principal: Principal, name: str) -> _store.DataSetRef:
        return self._datasets._ref(s, principal, name, Role.MEMBER)

    # ------------------------------------------------------------------ micro-batches
    def write_records(
        self,
        ctx: AuditContext,
        name: str,
        stream: str,
        records: Sequence[tuple[str, Any]],
        dead: Sequence[DeadLetter] = (),
    ) -> StreamWrite:
        """Append ``records`` (key, row: a JSON object) to ``name`` as one version, exactly
        once by key within ``stream``; park ``dead`` (records the consumer could not decode)
        and every row that does not fit the dataset's columns.

        Raises:
            InvalidParameter: a malformed stream name, too many records.
            NotFound / PermissionDenied: not the caller's dataset, or a role below member.
            Conflict: other writers kept committing the same keys.
        """
        check_stream(stream)
        if len(records) + len(dead) > MAX_RECORDS:
            raise InvalidParameter(f"a micro-batch carries at most {MAX_RECORDS:,} records")
        for _attempt in range(_ATTEMPTS):
            try:
                return self._write_once(ctx, name, stream, records, dead)
            except AlreadyExists:
                continue  # another writer committed some of these keys: now they are skipped
        raise Conflict("other writers keep committing the same records; retry the batch")

    def _write_once(
        self,
        ctx: AuditContext,
        name: str,
        stream: str,
        records: Sequence[tuple[str, Any]],
        dead: Sequence[DeadLetter],
    ) -> StreamWrite:
        principal = ctx.require_principal()
        with self._db.unit_of_work(write=False) as s:
            ref = self._member(s, principal, name)
            done = _store.committed_keys(
                s, ref.id, stream, [k for k, _ in records] + [d.key for d in dead]
            )
            base = _store.latest_valid(s, ref)
        fresh, letters = _first_of_each(records, dead, done)
        skipped = len(records) + len(dead) - len(fresh) - len(letters)
        converted = to_table(fresh, arrow_schema(base.schema) if base is not None else None)
        parked = [*letters, *converted.dead]
        if converted.table is None:
            self._park(ctx, ref, stream, parked, skipped)
            return StreamWrite(None, 0, skipped, len(parked))

        def within(s: Session, version: DataVersion) -> None:
            now = self._clock()
            _store.record_keys(s, ref.id, stream, converted.keys, version.version, now)
            if parked:
                _store.park(s, ref.id, stream, parked, now)
                self._audit.record(s, ctx, f"dataset/{name}", stream=stream, parked=len(parked))

        if base is not None and not _same_columns(base, converted.table.schema):
            # Typed as Arrow inferred them (a nested type), and not as the dataset's: the
            # same rows would fail every time, so they are parked rather than retried.
            reason = "the record's values do not have the dataset's column types"
            rows = dict(fresh)
            every = [DeadLetter(k, reason, row_digest(rows[k]), 0) for k in converted.keys]
            self._park(ctx, ref, stream, [*parked, *every], skipped)
            return StreamWrite(None, 0, skipped, len(parked) + len(every))
        version = self._datasets.ingest_batches(
            ctx,
            name,
            converted.table.to_batches(max_chunksize=65_536),
            source={"kind": "stream", "stream": stream, "records": len(converted.keys)},
            mode=WriteMode.APPEND,
            within=within,
        )
        return StreamWrite(version, len(converted.keys), skipped, len(parked))

    def _park(
        self,
        ctx: AuditContext,
        ref: _store.DataSetRef,
        stream: str,
        letters: Sequence[DeadLetter],
        skipped: int,
    ) -> None:
        """Park ``letters`` (no version) and audit it, or audit a batch that was all skipped."""

        def work(s: Session) -> None:
            if letters:
                _store.park(s, ref.id, stream, letters, self._clock())
            self._audit.record(
                s, ctx, f"dataset/{ref.name}", stream=stream, parked=len(letters), skipped=skipped
            )

        self._db.run(work)

    # ------------------------------------------------------------------ pushes
    def _replay(self, principal: Principal, name: str, key: str) -> StreamWrite | None:
        with self._db.unit_of_work(write=False) as s:
            ref = self._member(s, principal, name)
            found, number = _store.key_version(s, ref.id, PUSH, key)
            if not found:
                return None
            version = None if number is None else _store.version(s, ref, number)
        return StreamWrite(version, 0, 0, 0, replayed=True)

    def _push(
        self, ctx: AuditContext, name: str, key: str, batches: Iterable[pa.RecordBatch], fmt: str
    ) -> StreamWrite:
        principal = ctx.require_principal()
        replayed = self._replay(principal, name, key)
        if replayed is not None:
            return replayed

        def within(s: Session, version: DataVersion) -> None:
            _store.record_keys(s, version_ref.id, PUSH, [key], version.version, self._clock())

        with self._db.unit_of_work(write=False) as s:
            version_ref = self._member(s, principal, name)
        try:
            version = self._datasets.ingest_batches(
                ctx,
                name,
                batches,
                source={"kind": "push", "format": fmt},
                mode=WriteMode.APPEND,
                within=within,
            )
        except AlreadyExists:
            # The same push, committed by a concurrent retry: answer with its version.
            again = self._replay(principal, name, key)
            if again is None:
                raise
            return again
        return StreamWrite(version, version.parts[-1].rows)

    def push_rows(self, ctx: AuditContext, name: str, key: str, rows: Sequence[Any]) -> StreamWrite:
        """Append ``rows`` (JSON objects) as one version, once per ``key``: a retried push
        answers with the version the first one wrote. All or nothing: a row that does not fit
        the dataset's columns refuses the push (the row and column named, not the value).

        Raises:
            InvalidParameter: no rows, or a row that does not fit.
        """
        if not rows:
            raise InvalidParameter("a push carries at least one row")
        principal = ctx.require_principal()
        with self._db.unit_of_work(write=False) as s:
            base = _store.latest_valid(s, self._member(s, principal, name))
        converted = to_table(
            [(str(i), row) for i, row in enumerate(rows)],
            arrow_schema(base.schema) if base is not None else None,
        )
        if converted.dead or converted.table is None:
            first = converted.dead[0]
            raise InvalidParameter(
                f"row {int(first.key) + 1} of the push cannot be written: {first.reason}; "
                "nothing was written"
            )
        return self._push(ctx, name, key, converted.table.to_batches(max_chunksize=65_536), "json")

    def push_arrow(
        self, ctx: AuditContext, name: str, key: str, chunks: Iterable[bytes]
    ) -> StreamWrite:
        """Append an Arrow IPC stream's rows as one version, once per ``key`` (see
        :meth:`push_rows`). The body is spooled to a private folder and read in batches."""
        self._work_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="push-", dir=self._work_dir))
        try:
            path = folder / "body.arrow"
            with path.open("wb") as handle:
                for chunk in chunks:
                    handle.write(chunk)
            return self._push(ctx, name, key, _read(path), "arrow")
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    # ------------------------------------------------------------------ dead letters
    def dead_letters(self, principal: Principal, name: str, limit: int = 100) -> list[DeadLetter]:
        """The dataset's parked records, newest first (members: a reason may name columns)."""
        if not 1 <= limit <= 1000:
            raise InvalidParameter("limit must be between 1 and 1000")
        with self._db.unit_of_work(write=False) as s:
            return _store.dead_letters(s, self._member(s, principal, name), limit)


def _read(path: Path) -> Iterator[pa.RecordBatch]:
    yield from _ingest.read_batches(path, "arrow")


def _same_columns(base: DataVersion, schema: pa.Schema) -> bool:
    """Whether rows of ``schema`` append to ``base`` (names and types, in order)."""
    have = [(str(c.get("name")), str(c.get("type"))) for c in base.schema]
    return have == [(field.name, str(field.type)) for field in schema]
