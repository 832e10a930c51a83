"""Reading a source file as Arrow batches, and writing them as one Parquet part.

Sources are hostile (hostile-inputs.md §14): everything is read in bounded batches, never whole;
the column count is capped; an unreadable file is a clear error that names the format and
where it failed, without the file's values (a row may hold personal data).
"""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.ipc as paipc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from shamal.errors import InvalidParameter

__all__ = [
    "FORMATS",
    "MAX_COLUMNS",
    "MAX_DEPTH",
    "MAX_ROW_BYTES",
    "Limits",
    "WrittenPart",
    "check_schema",
    "file_digest",
    "read_batches",
    "write_part",
]

FORMATS = ("csv", "parquet", "jsonl", "arrow")
MAX_COLUMNS = 4096
#: Deepest nesting of a JSON value or an Arrow/Parquet type: deeper ones are refused before
#: a parser recurses into them (Arrow's JSON parser crashes the process past a few thousand).
MAX_DEPTH = 64
#: Rows per batch read from Parquet; text formats read blocks of ``_BLOCK`` bytes, so one row
#: (one cell) of a text source is at most that long. Arrow's CSV reader holds about forty
#: blocks' worth of memory while it streams (parsed blocks read ahead), so the block size is
#: what bounds an ingestion's memory (1 MiB: about 40 MiB; 16 MiB: 650 MiB, for no gain in speed).
_BATCH_ROWS = 65_536
_BLOCK = 1 << 20
MAX_ROW_BYTES = _BLOCK
#: The most one Parquet batch is expected to hold once decoded (its rows are sized by the
#: row group's own statistics).
_BATCH_BYTES = 64 << 20
_HASH_CHUNK = 1 << 20
MAX_ROW_GROUPS = 100_000
_LOCATION = re.compile(r"(row|line|column|offset)\s*#?\s*\d+", re.IGNORECASE)
_GZIP = b"\x1f\x8b"
_ZSTD = b"\x28\xb5\x2f\xfd"


@dataclass(frozen=True, slots=True)
class Limits:
    """How far a source may expand: a compressed text source (gzip, zstd) or a Parquet file
    decodes to at most ``max_expansion`` times its size past ``allowance`` bytes."""

    max_expansion: int = 200
    allowance: int = 256 << 20

    def most(self, stored: int) -> int:
        return self.allowance + self.max_expansion * stored


@dataclass(frozen=True, slots=True)
class WrittenPart:
    """A Parquet file written from a source: its rows, size and schema."""

    path: Path
    rows: int
    size: int
    schema: tuple[dict[str, Any], ...]


def _unreadable(fmt: str, exc: Exception, rows: int) -> InvalidParameter:
    """The error for an unreadable source: where it failed when Arrow says so, never the
    values it read there."""
    text = str(exc)
    if "straddl" in text:
        return InvalidParameter(
            f"the {fmt} source has a row longer than {MAX_ROW_BYTES >> 20} MiB after row "
            f"{rows:,} (a huge cell, or an unterminated quote); split it or fix the quoting"
        )
    where = sorted({m.group(0).lower() for m in _LOCATION.finditer(text)})
    at = f" (at {', '.join(where[:3])})" if where else ""
    kind = type(exc).__name__.removeprefix("Arrow")
    return InvalidParameter(
        f"the {fmt} source cannot be read after row {rows:,}: {kind}{at}; check its format"
    )


def _depth(kind: pa.DataType) -> int:
    if kind.num_fields == 0:
        return 0
    return 1 + max(_depth(kind.field(i).type) for i in range(kind.num_fields))


def check_schema(schema: pa.Schema, fmt: str) -> None:
    if len(schema) > MAX_COLUMNS:
        raise InvalidParameter(
            f"the {fmt} source has {len(schema):,} columns; at most {MAX_COLUMNS:,} are taken"
        )
    names = [field.name for field in schema]
    if any(not name for name in names) or len(set(names)) != len(names):
        raise InvalidParameter(f"the {fmt} source has empty or repeated column names")
    if any("\x00" in name for name in names):
        raise InvalidParameter(
            f"the {fmt} source's column names hold NUL bytes (UTF-16 text?); give UTF-8"
        )
    for index, field in enumerate(schema, start=1):
        if _depth(field.type) > MAX_DEPTH:
            raise InvalidParameter(
                f"column #{index} of the {fmt} source nests deeper than {MAX_DEPTH} levels"
            )


class _Guarded(io.RawIOBase):
    """A text source as Arrow reads it: decompressed when it is gzip or zstd (told by its
    first bytes, not its name), and refused past ``limit`` decoded bytes (a bomb); JSON lines
    are besides scanned for nesting depth before Arrow parses them."""

    def __init__(self, path: Path, fmt: str, limits: Limits) -> None:
        super().__init__()
        size = path.stat().st_size
        with path.open("rb") as handle:
            magic = handle.read(4)
        raw: Any = pa.OSFile(str(path))
        self.compressed = magic.startswith(_GZIP) or magic.startswith(_ZSTD)
        if self.compressed:
            raw = pa.CompressedInputStream(raw, "gzip" if magic.startswith(_GZIP) else "zstd")
        self._raw = raw
        self._fmt = fmt
        self._limit = limits.most(size)
        self._read = 0
        self._depth = _DepthScan() if fmt == "jsonl" else None
        self._first = True

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._raw.read(len(buffer))
        if self._first and data:
            self._first = False
            _sniff(data[:4096], self._fmt)
        self._read += len(data)
        if self._read > self._limit:
            raise InvalidParameter(
                f"the {self._fmt} source expands past {self._limit >> 20:,} MiB (a "
                "decompression bomb?); split it, or ask the operator to raise "
                "data_sources.max_expansion"
            )
        if self._depth is not None:
            self._depth.feed(data)
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._raw.close()
        super().close()


def _sniff(head: bytes, fmt: str) -> None:
    if head.startswith((b"\xff\xfe", b"\xfe\xff")) or head.count(b"\x00") * 4 > len(head):
        raise InvalidParameter(
            f"the {fmt} source is not UTF-8 text (UTF-16, or binary?); convert it to UTF-8"
        )


class _DepthScan:
    """Nesting depth of JSON text, fed in chunks, vectorized: brackets outside strings."""

    _OPEN = np.frombuffer(b"{[", dtype=np.uint8)
    _CLOSE = np.frombuffer(b"}]", dtype=np.uint8)

    def __init__(self) -> None:
        self._depth = 0
        self._in_string = False
        self._escaped = False

    def feed(self, data: bytes) -> None:
        if not data:
            return
        arr = np.frombuffer(data, dtype=np.uint8)
        quotes = np.flatnonzero(arr == ord('"'))
        if self._escaped and quotes.size and quotes[0] == 0:
            quotes = quotes[1:]
        quotes = quotes[~_escaped(arr, quotes)]
        toggles = np.zeros(arr.size + 1, dtype=np.int8)
        toggles[quotes + 1] = 1
        inside = (np.cumsum(toggles[:-1]) + int(self._in_string)) % 2 == 1
        delta = np.isin(arr, self._OPEN).astype(np.int32) - np.isin(arr, self._CLOSE)
        delta[inside] = 0
        # A line starts at depth 0: depth is measured from the last newline before it.
        running = np.cumsum(delta)
        positions = np.arange(arr.size)
        last = np.maximum.accumulate(np.where(arr == ord("\n"), positions, -1))
        depth = np.where(last >= 0, running - running[np.maximum(last, 0)], running + self._depth)
        if int(depth.max()) > MAX_DEPTH:
            raise InvalidParameter(f"the jsonl source nests deeper than {MAX_DEPTH} levels")
        self._depth = int(depth[-1])
        self._in_string = (quotes.size + int(self._in_string)) % 2 == 1
        self._escaped = _trailing_backslashes(arr) % 2 == 1


def _trailing_backslashes(arr: np.ndarray[Any, Any]) -> int:
    others = np.flatnonzero(arr != ord("\\"))
    return int(arr.size if others.size == 0 else arr.size - 1 - others[-1])


def _escaped(arr: np.ndarray[Any, Any], quotes: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Which quotes are escaped: preceded by an odd run of backslashes."""
    back = (arr == ord("\\")).astype(np.int64)
    run = np.cumsum(back)
    breaks = np.where(back == 0, run, 0)
    runs = run - np.maximum.accumulate(breaks)  # backslashes ending at each position
    before = np.where(quotes > 0, runs[np.maximum(quotes - 1, 0)], 0)
    return np.asarray(before % 2 == 1)


def _text_checks(fmt: str) -> Callable[[pa.RecordBatch, int], None]:
    """Checks of each text batch: no NUL bytes in a cell, no bytes that are not UTF-8, and
    (CSV) no line break in a cell (an unterminated quote swallowing the file's end)."""

    def forbidden(column: pa.Array) -> bool:
        if fmt == "csv":
            return bool(pc.any(pc.match_substring_regex(column, "[\\x00\\r\\n]")).as_py())
        return bool(pc.any(pc.match_substring(column, "\x00")).as_py())

    def check(batch: pa.RecordBatch, rows: int) -> None:
        for index, column in enumerate(batch.columns, start=1):
            where = f"column #{index}, rows {rows + 1:,} to {rows + batch.num_rows:,}"
            if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
                raise InvalidParameter(
                    f"the {fmt} source has bytes that are not UTF-8 (at {where}); give UTF-8"
                )
            if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
                continue
            # One scan for every byte a cell may not hold; which one, only when there is one.
            if not forbidden(column):
                continue
            if pc.any(pc.match_substring(column, "\x00")).as_py():
                raise InvalidParameter(f"the {fmt} source has NUL bytes in a cell (at {where})")
            if fmt == "csv":
                raise InvalidParameter(
                    f"the {fmt} source has a line break inside a cell (at {where}): an "
                    "unterminated quote?"
                )

    return check


def _csv(path: Path, limits: Limits, text_columns: Sequence[str] = ()) -> Iterator[pa.RecordBatch]:
    ragged: list[tuple[int, int]] = []

    def on_ragged(row: Any) -> str:
        # Arrow ignores an exception raised here: note the row, let Arrow fail, then say so.
        ragged.append((row.actual_columns, row.expected_columns))
        return "error"

    rows = 0
    with _Guarded(path, "csv", limits) as stream:
        try:
            reader = pacsv.open_csv(
                stream,
                read_options=pacsv.ReadOptions(block_size=_BLOCK),
                parse_options=pacsv.ParseOptions(invalid_row_handler=on_ragged),
                # Columns named text are never inferred as numbers (a phone keeps its '+').
                convert_options=pacsv.ConvertOptions(
                    column_types=dict.fromkeys(text_columns, pa.string())
                ),
            )
            check_schema(reader.schema, "csv")
            for batch in reader:
                rows += batch.num_rows
                yield batch
        except pa.ArrowInvalid:
            if not ragged:
                raise
            actual, expected = ragged[0]
            raise InvalidParameter(
                f"the csv source has a row of {actual} cells, not {expected}, after row "
                f"{rows:,} (a ragged row); fix the row or its quoting"
            ) from None


def _jsonl(path: Path, limits: Limits) -> Iterator[pa.RecordBatch]:
    with _Guarded(path, "jsonl", limits) as stream:
        reader = pajson.open_json(stream, read_options=pajson.ReadOptions(block_size=_BLOCK))
        check_schema(reader.schema, "jsonl")
        yield from reader


def _parquet(path: Path, limits: Limits) -> Iterator[pa.RecordBatch]:
    # Text and binary columns are read as dictionaries, then checked for what they expand to
    # before they are decoded: a page of a few bytes may name one huge value a million times.
    probe = pq.ParquetFile(path)
    check_schema(probe.schema_arrow, "parquet")
    variable = [
        f.name
        for f in probe.schema_arrow
        if pa.types.is_string(f.type)
        or pa.types.is_large_string(f.type)
        or pa.types.is_binary(f.type)
        or pa.types.is_large_binary(f.type)
    ]
    source = pq.ParquetFile(path, read_dictionary=variable) if variable else probe
    groups = _row_groups(source.metadata, path.stat().st_size, limits)
    for index, group in enumerate(groups):
        # Rows per batch from the group's own size: a batch of wide rows stays small.
        per_row = max(1, group.total_byte_size // max(1, group.num_rows))
        size = max(1, min(_BATCH_ROWS, _BATCH_BYTES // per_row))
        for batch in source.iter_batches(batch_size=size, row_groups=[index]):
            yield _decoded(batch, probe.schema_arrow)


def _row_groups(meta: Any, size: int, limits: Limits) -> list[Any]:
    """The row groups of a footer that is consistent and does not claim a bomb."""
    if meta.num_row_groups > MAX_ROW_GROUPS:
        raise InvalidParameter(
            f"the parquet source has {meta.num_row_groups:,} row groups; at most "
            f"{MAX_ROW_GROUPS:,} are read"
        )
    groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
    if sum(g.num_rows for g in groups) != meta.num_rows:
        raise InvalidParameter("the parquet source's footer disagrees with its row groups")
    decoded = sum(g.total_byte_size for g in groups)
    if decoded > limits.most(size):
        raise _bomb("parquet", decoded, limits)
    return groups


def _bomb(fmt: str, decoded: int, limits: Limits) -> InvalidParameter:
    return InvalidParameter(
        f"the {fmt} source decodes to {decoded >> 20:,} MiB, past {limits.max_expansion}x its "
        "size (a decompression bomb?); split it, or ask the operator to raise "
        "data_sources.max_expansion"
    )


def _decoded(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """A batch with its dictionary columns decoded, once what they expand to is known to be
    under :data:`_BATCH_BYTES` times four."""
    expanded = 0
    for column in batch.columns:
        if pa.types.is_dictionary(column.type):
            lengths = pc.binary_length(column.dictionary).take(column.indices)
            expanded += int(pc.sum(lengths).as_py() or 0)
    if expanded > 4 * _BATCH_BYTES:
        raise InvalidParameter(
            f"the parquet source's {batch.num_rows:,} rows expand to {expanded >> 20:,} MiB "
            "(a dictionary bomb?); write it with smaller row groups or values"
        )
    return pa.RecordBatch.from_arrays(
        [
            col.cast(field.type) if pa.types.is_dictionary(col.type) else col
            for col, field in zip(batch.columns, schema, strict=True)
        ],
        schema=schema,
    )


def _arrow(path: Path, _limits: Limits) -> Iterator[pa.RecordBatch]:
    with path.open("rb") as handle:
        try:
            reader: Any = paipc.open_file(handle)
            check_schema(reader.schema, "arrow")
            for index in range(reader.num_record_batches):
                yield reader.get_batch(index)
            return
        except pa.ArrowInvalid:
            handle.seek(0)
        stream = paipc.open_stream(handle)
        check_schema(stream.schema, "arrow")
        yield from stream


_READERS: dict[str, Callable[[Path, Limits], Iterator[pa.RecordBatch]]] = {
    "csv": _csv,
    "jsonl": _jsonl,
    "parquet": _parquet,
    "arrow": _arrow,
}


def read_batches(
    path: Path, fmt: str, limits: Limits = Limits(), *, text_columns: Sequence[str] = ()
) -> Iterator[pa.RecordBatch]:
    """The source's rows as Arrow batches of bounded size; a CSV's ``text_columns`` are read
    as text, whatever they look like.

    CSV and JSON lines may be gzip or zstd compressed (told by their first bytes).

    Raises:
        InvalidParameter: an unknown format, or a file that is not what it says (where it
            failed, never what it held); a source past ``limits`` (a bomb), nested past
            :data:`MAX_DEPTH`, with a row past :data:`MAX_ROW_BYTES`, NUL bytes or bytes that
            are not UTF-8 in a text cell.
    """
    reader = _READERS.get(fmt)
    if reader is None:
        raise InvalidParameter(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    check = _text_checks(fmt) if fmt in ("csv", "jsonl") else None
    rows = 0
    try:
        batches = _csv(path, limits, text_columns) if fmt == "csv" else reader(path, limits)
        for batch in _coalesced(batches):
            if check is not None:
                check(batch, rows)
            rows += batch.num_rows
            yield batch
    except (pa.ArrowException, OSError, ValueError) as exc:
        if isinstance(exc, InvalidParameter):
            raise
        raise _unreadable(fmt, exc, rows) from None


def _coalesced(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``batches`` joined into batches of about :data:`_BATCH_ROWS` rows (at most
    :data:`_BATCH_BYTES`): text sources are read in small blocks (which bound a row's length
    and the reader's memory), but every later step (checks, profile, Parquet) pays a cost per
    batch, not only per row."""
    held: list[pa.RecordBatch] = []
    rows = size = 0
    for batch in batches:
        if held and not batch.schema.equals(held[0].schema):
            yield _joined(held)
            held, rows, size = [], 0, 0
        held.append(batch)
        rows += batch.num_rows
        size += batch.nbytes
        if rows >= _BATCH_ROWS or size >= _BATCH_BYTES:
            yield _joined(held)
            held, rows, size = [], 0, 0
    if held:
        yield _joined(held)


def _joined(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(batches) == 1:
        return batches[0]
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def _schema_json(schema: pa.Schema) -> tuple[dict[str, Any], ...]:
    return tuple(
        {"name": field.name, "type": str(field.type), "nullable": field.nullable}
        for field in schema
    )


def write_part(
    batches: Iterator[pa.RecordBatch],
    out: Path,
    on_batch: Callable[[pa.RecordBatch], pa.RecordBatch] | None = None,
) -> WrittenPart:
    """Write ``batches`` (each first passed through ``on_batch``: pseudonymization, profiling)
    as one zstd Parquet file at ``out``.

    A batch is written on a thread of its own while the next one is read and passed through
    ``on_batch`` (Arrow's writer releases the GIL): two batches are held at a time.

    Raises:
        InvalidParameter: no rows' schema could be read, or a batch's schema differs from the
            first's (a column whose type changes mid-file).
    """
    writer: pq.ParquetWriter | None = None
    rows = 0
    schema: pa.Schema | None = None
    writing: Future[None] | None = None
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="parquet-part") as pool:
        try:
            for raw in batches:
                batch = on_batch(raw) if on_batch is not None else raw
                if writer is None:
                    schema = batch.schema
                    writer = pq.ParquetWriter(
                        out, schema, compression="zstd", use_dictionary=_repetitive(batch)
                    )
                elif not batch.schema.equals(schema):
                    raise InvalidParameter(
                        f"the source's columns change type after row {rows:,}; give every row "
                        "the same types"
                    )
                if writing is not None:
                    writing.result()
                writing = pool.submit(writer.write_batch, batch)
                rows += batch.num_rows
            if writing is not None:
                writing.result()
        finally:
            if writing is not None:
                wait([writing])  # its error, if any, was raised above or yields to this one
            if writer is not None:
                writer.close()
    if writer is None or schema is None:
        raise InvalidParameter("the source holds no readable rows or columns")
    return WrittenPart(out, rows, out.stat().st_size, _schema_json(schema))


def _repetitive(batch: pa.RecordBatch) -> list[str]:
    """The columns worth dictionary-encoding: those whose first batch repeats its values
    (at most half of them distinct). Arrow would try a dictionary for every column and drop it
    for the others only after building it, the costliest part of writing them."""
    names = []
    for field, column in zip(batch.schema, batch.columns, strict=True):
        try:
            distinct = pc.count_distinct(column).as_py()
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
            continue  # a nested column: Arrow's default is kept off it
        if len(column) and distinct <= len(column) // 2:
            names.append(field.name)
    return names


def file_digest(path: Path) -> str:
    """sha256 of a file, read in chunks."""
    hasher = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()
