"""What a run's artifact looks like in the UI: a bounded head of its bytes read as text, a
table (CSV, TSV, JSON lines, Parquet), an image, or none of these (its size only).

Pure: bytes in, a :class:`Preview` out; the page module reads the file with the caller's
access and decides what to serve.
"""

from __future__ import annotations

import csv
import io
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

#: What a text preview shows: the file's first 64 KiB.
TEXT_BYTES = 64 * 1024
#: What a CSV, TSV or JSON-lines preview reads to find its first rows.
TABLE_BYTES = 1024 * 1024
#: Parquet is read whole (its footer is at the end): only files up to this size.
PARQUET_BYTES = 16 * 1024 * 1024
#: Images larger than this are offered for download, not shown.
IMAGE_BYTES = 16 * 1024 * 1024
TABLE_ROWS = 100
#: Only these are ever served inline; SVG (which can hold script) is not among them.
IMAGE_TYPES = {
    "png": "image/png",
    "jpg": "image/jpeg",
    "jpeg": "image/jpeg",
    "gif": "image/gif",
    "webp": "image/webp",
}
_DELIMITED = {"csv": ",", "tsv": "\t"}
_JSON_LINES = frozenset({"jsonl", "ndjson"})


def suffix(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    return name.rsplit(".", 1)[-1].lower() if "." in name else ""


def human_size(size: int | None) -> str:
    """``size`` bytes as people read it (``1.5 MiB``); empty for a folder."""
    if size is None:
        return ""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"  # pragma: no cover - the loop always answers


def head(chunks: Iterator[bytes], limit: int) -> tuple[bytes, bool]:
    """The first ``limit`` bytes of ``chunks`` and whether there were more; the stream is
    closed either way."""
    data = bytearray()
    try:
        for chunk in chunks:
            data += chunk
            if len(data) > limit:
                return bytes(data[:limit]), True
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    return bytes(data), False


@dataclass
class Preview:
    """What the preview page shows of one file: ``kind`` is ``image``, ``table``, ``text``
    or ``binary`` (size and a download link only)."""

    kind: str
    size: int
    text: str = ""
    truncated: bool = False
    columns: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)


def _cell(value: object) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, default=str, sort_keys=True)


def _delimited(data: bytes, delimiter: str, truncated: bool) -> tuple[list[str], list[list[str]]]:
    text = data.decode("utf-8", errors="replace")
    if truncated:  # the last line may be cut
        text = text.rsplit("\n", 1)[0]
    reader = csv.reader(io.StringIO(text), delimiter=delimiter)
    lines = [row for _, row in zip(range(TABLE_ROWS + 1), reader, strict=False)]
    if not lines:
        raise ValueError("no whole line in the head of the file")
    return lines[0], lines[1:]


def _json_lines(data: bytes, truncated: bool) -> tuple[list[str], list[list[str]]]:
    lines = data.decode("utf-8", errors="replace").splitlines()
    if truncated:
        lines = lines[:-1]
    records: list[dict[str, object]] = []
    for line in lines:
        if len(records) == TABLE_ROWS:
            break
        if not line.strip():
            continue
        parsed = json.loads(line)
        records.append(parsed if isinstance(parsed, dict) else {"value": parsed})
    if not records:
        raise ValueError("no whole line in the head of the file")
    columns = list(dict.fromkeys(str(k) for r in records for k in r))
    return columns, [[_cell(r.get(c, "")) for c in columns] for r in records]


def _parquet(data: bytes) -> tuple[list[str], list[list[str]]]:
    import pyarrow.parquet as pq  # optional: only a Parquet preview needs it

    table = pq.read_table(io.BytesIO(data)).slice(0, TABLE_ROWS)
    columns = [str(c) for c in table.column_names]
    return columns, [[_cell(r.get(c)) for c in columns] for r in table.to_pylist()]


def _table(data: bytes, kind: str, truncated: bool) -> tuple[list[str], list[list[str]]]:
    """(columns, the first rows) of a table file.

    Raises:
        ValueError: it does not parse as its kind (the page then shows it as text).
    """
    if kind in _DELIMITED:
        try:
            return _delimited(data, _DELIMITED[kind], truncated)
        except csv.Error as exc:
            raise ValueError(str(exc)) from exc
    if kind in _JSON_LINES:
        try:
            return _json_lines(data, truncated)
        except RecursionError as exc:
            raise ValueError("nested too deeply") from exc
    try:
        return _parquet(data)
    except Exception as exc:  # pyarrow's own errors are many; any means "not readable"
        raise ValueError("not a Parquet file this server can read") from exc


def _table_bytes(kind: str, size: int) -> int | None:
    """How much of a table file to read; None when it is not a table or too large."""
    if kind in _DELIMITED or kind in _JSON_LINES:
        return TABLE_BYTES
    if kind == "parquet" and size <= PARQUET_BYTES:
        return PARQUET_BYTES
    return None


def preview_of(path: str, size: int, chunks: Iterator[bytes]) -> Preview:
    """What to show of the file ``path`` of ``size`` bytes, which are ``chunks`` (read only
    as far as its kind needs; the stream is closed)."""
    kind = suffix(path)
    if kind in IMAGE_TYPES and size <= IMAGE_BYTES:
        head(chunks, 0)
        return Preview("image", size)
    limit = _table_bytes(kind, size)
    data, truncated = head(chunks, limit if limit is not None else TEXT_BYTES)
    if limit is not None:
        try:
            columns, rows = _table(data, kind, truncated)
            return Preview("table", size, columns=columns, rows=rows)
        except ValueError:
            logger.debug("%s does not parse as a table; shown as text", path)
        data, truncated = data[:TEXT_BYTES], truncated or len(data) > TEXT_BYTES
    if b"\x00" in data[:8192]:
        return Preview("binary", size)
    return Preview("text", size, data.decode("utf-8", errors="replace"), truncated)
