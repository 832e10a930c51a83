"""Reading a source file as Arrow batches, and writing them as one Parquet part.

Sources are hostile (hostile-inputs.md §14): everything is read in bounded batches, never whole;
the column count is capped; an unreadable file is a clear error that names the format and
where it failed, without the file's values (a row may hold personal data).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.ipc as paipc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from shamal.errors import InvalidParameter

__all__ = ["FORMATS", "MAX_COLUMNS", "WrittenPart", "file_digest", "read_batches", "write_part"]

FORMATS = ("csv", "parquet", "jsonl", "arrow")
MAX_COLUMNS = 4096
#: Rows per batch read from Parquet; text formats read blocks of ``_BLOCK`` bytes. Arrow's
#: CSV reader holds about forty blocks' worth of memory while it streams (parsed blocks read
#: ahead): 4 MiB blocks keep that near 160 MiB (16 MiB blocks: 650 MiB, for no gain in speed).
_BATCH_ROWS = 65_536
_BLOCK = 4 << 20
_HASH_CHUNK = 1 << 20
_LOCATION = re.compile(r"(row|line|column|offset)\s*#?\s*\d+", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class WrittenPart:
    """A Parquet file written from a source: its rows, size and schema."""

    path: Path
    rows: int
    size: int
    schema: tuple[dict[str, Any], ...]


def _unreadable(fmt: str, exc: Exception) -> InvalidParameter:
    """The error for an unreadable source: where it failed when Arrow says so, never the
    values it read there."""
    where = sorted({m.group(0).lower() for m in _LOCATION.finditer(str(exc))})
    at = f" (at {', '.join(where[:3])})" if where else ""
    kind = type(exc).__name__.removeprefix("Arrow")
    return InvalidParameter(f"the {fmt} source cannot be read: {kind}{at}; check its format")


def _check_width(schema: pa.Schema, fmt: str) -> None:
    if len(schema) > MAX_COLUMNS:
        raise InvalidParameter(
            f"the {fmt} source has {len(schema):,} columns; at most {MAX_COLUMNS:,} are taken"
        )
    names = [field.name for field in schema]
    if any(not name for name in names) or len(set(names)) != len(names):
        raise InvalidParameter(f"the {fmt} source has empty or repeated column names")


def _csv(path: Path) -> Iterator[pa.RecordBatch]:
    reader = pacsv.open_csv(path, read_options=pacsv.ReadOptions(block_size=_BLOCK))
    _check_width(reader.schema, "csv")
    yield from reader


def _jsonl(path: Path) -> Iterator[pa.RecordBatch]:
    reader = pajson.open_json(path, read_options=pajson.ReadOptions(block_size=_BLOCK))
    _check_width(reader.schema, "jsonl")
    yield from reader


def _parquet(path: Path) -> Iterator[pa.RecordBatch]:
    source = pq.ParquetFile(path)
    _check_width(source.schema_arrow, "parquet")
    yield from source.iter_batches(batch_size=_BATCH_ROWS)


def _arrow(path: Path) -> Iterator[pa.RecordBatch]:
    with path.open("rb") as handle:
        try:
            reader: Any = paipc.open_file(handle)
            _check_width(reader.schema, "arrow")
            for index in range(reader.num_record_batches):
                yield reader.get_batch(index)
            return
        except pa.ArrowInvalid:
            handle.seek(0)
        stream = paipc.open_stream(handle)
        _check_width(stream.schema, "arrow")
        yield from stream


_READERS: dict[str, Callable[[Path], Iterator[pa.RecordBatch]]] = {
    "csv": _csv,
    "jsonl": _jsonl,
    "parquet": _parquet,
    "arrow": _arrow,
}


def read_batches(path: Path, fmt: str) -> Iterator[pa.RecordBatch]:
    """The source's rows as Arrow batches of bounded size.

    Raises:
        InvalidParameter: an unknown format, or a file that is not what it says (where it
            failed, never what it held).
    """
    reader = _READERS.get(fmt)
    if reader is None:
        raise InvalidParameter(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    try:
        yield from reader(path)
    except (pa.ArrowException, OSError, ValueError) as exc:
        if isinstance(exc, InvalidParameter):
            raise
        raise _unreadable(fmt, exc) from None


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
