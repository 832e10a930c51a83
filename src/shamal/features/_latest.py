"""The newest row of each entity in a feature view, for materialization into the online store.

DuckDB reads the view's Parquet files (through the view's SQL transformation, if any, over a
relation named ``source``), keeps rows whose event time lies in the window ``(start, end]``
and whose keys are all set, and keeps per key the row of the greatest event time; ties go to
the row written last (the later file, then the later row), as in a point-in-time join. The
result is written as one Parquet file in key order, so a materialization cut into chunks of
it cuts the same chunks again when it is resumed.
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import duckdb

from shamal.datasets import check_select, quote_identifier, quote_text
from shamal.errors import InvalidParameter

__all__ = ["LatestRows", "compose_sql", "latest_rows", "select_rows"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LatestRows:
    path: Path
    rows: int


def compose_sql(chain: Sequence[str | None]) -> str | None:
    """One query of a chain of transformations, innermost first: each reads the one before
    it as ``source`` (the first reads the dataset's files)."""
    composed: str | None = None
    for sql in chain:
        if sql is None:
            continue
        check_select(sql)
        composed = sql if composed is None else f"WITH source AS ({composed}) SELECT * FROM ({sql})"  # nosec B608 - user SQL checked as one SELECT, run confined
    return composed


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


class _Confined:
    """A DuckDB connection with a view ``__scan`` over ``files`` (plus a file index and each
    row's number in its file) and ``source`` over the same rows, that may then read only
    those files, write only ``out`` and spill only to its own folder."""

    def __init__(self, files: Sequence[Path], out: Path, memory_limit_mb: int) -> None:
        if not files:
            raise InvalidParameter("the dataset version holds no files")
        self.spill = Path(tempfile.mkdtemp(prefix="duck-"))
        self.out = out
        self.con = duckdb.connect()
        allowed = ", ".join(quote_text(str(p)) for p in (*files, out))
        try:
            for setting in (
                f"SET memory_limit = '{int(memory_limit_mb)}MB'",
                f"SET temp_directory = {quote_text(str(self.spill))}",
                "SET threads = 2",
                "SET TimeZone = 'UTC'",
                "SET python_enable_replacements = false",
                "SET preserve_insertion_order = true",
                f"SET allowed_paths = [{allowed}]",
                f"SET allowed_directories = [{quote_text(str(self.spill) + '/')}]",
                "SET enable_external_access = false",
            ):
                self.con.execute(setting)
            scans = " UNION ALL ".join(
                f"SELECT *, {index} AS __file FROM read_parquet({quote_text(str(path))}, "  # nosec B608 - quoted paths
                "file_row_number = true)"
                for index, path in enumerate(files)
            )
            self.con.execute(f"CREATE VIEW __scan AS {scans}")
            self.con.execute(
                "CREATE VIEW source AS SELECT * EXCLUDE (__file, file_row_number) FROM __scan"
            )
            self.con.execute("SET lock_configuration = true")
        except duckdb.Error as exc:
            self.close()
            raise InvalidParameter(
                f"the dataset's files cannot be read: {_first_line(exc)}"
            ) from None

    def copy(self, query: str, parameters: dict[str, object] | None = None) -> int:
        """Write ``query``'s rows to ``out``; how many."""
        try:
            self.con.execute(
                f"COPY ({query}) TO {quote_text(str(self.out))} (FORMAT parquet, COMPRESSION zstd)",
                parameters or {},
            )
            found = self.con.execute(
                f"SELECT count(*) FROM read_parquet({quote_text(str(self.out))})"  # nosec B608 - quoted path
            ).fetchone()
        except duckdb.Error as exc:
            self.out.unlink(missing_ok=True)
            raise InvalidParameter(f"the query failed: {_first_line(exc)}") from None
        return int(found[0]) if found else 0

    def close(self) -> None:
        self.con.close()
        shutil.rmtree(self.spill, ignore_errors=True)


#: DuckDB types whose JSON is what the online store's own encoder writes for them (DOUBLE:
#: DuckDB writes the shortest text that reads back as the same double, as orjson does).
_JSON_EXACT = frozenset(
    {"BIGINT", "INTEGER", "SMALLINT", "TINYINT", "DOUBLE", "BOOLEAN", "VARCHAR"}
)
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


_INTEGERS = frozenset({"BIGINT", "INTEGER", "SMALLINT", "TINYINT"})


def _types(duck: _Confined, body: str, names: Sequence[str]) -> dict[str, str]:
    """The DuckDB types of ``names`` in ``body``'s rows (empty when it cannot tell)."""
    listed = ", ".join(quote_identifier(n) for n in names)
    try:
        described = duck.con.execute(f"DESCRIBE SELECT {listed} FROM ({body})").fetchall()  # nosec B608 - quoted names
    except duckdb.Error:
        return {}
    return {str(row[0]): str(row[1]) for row in described}


def _encoded_sql(
    duck: _Confined,
    body: str,
    join_keys: Sequence[str],
    timestamp_field: str,
    features: Sequence[str],
) -> str | None:
    """Columns of each row as the online store keeps it, made column by column by DuckDB:
    ``__payload``, its JSON (``[<event micros>,{feature: value, ...}]``), ``__micros``, and
    with integer join keys ``__entity``, the key's JSON. Only when every feature's JSON is
    exactly what the online store's own encoder writes; None otherwise (timestamps, other
    types, odd names: encoded in Python). A row holding a NaN or an infinity gets a NULL
    payload, and is encoded in Python too."""
    types = _types(duck, body, [*join_keys, *features])
    if not features or any(
        not _PLAIN_NAME.fullmatch(f) or types.get(f) not in _JSON_EXACT for f in features
    ):
        return None
    columns = [f"epoch_us(CAST({quote_identifier(timestamp_field)} AS TIMESTAMPTZ)) AS __micros"]
    if all(types.get(k) in _INTEGERS for k in join_keys):
        parts = " || ',' || ".join(f"CAST({quote_identifier(k)} AS VARCHAR)" for k in join_keys)
        columns.append(f"'[' || {parts} || ']' AS __entity")
    doubles = [quote_identifier(f) for f in features if types[f] == "DOUBLE"]
    finite = " AND ".join(f"({d} IS NULL OR isfinite({d}))" for d in doubles) or "true"
    packed = ", ".join(f"{f} := {quote_identifier(f)}" for f in features)
    micros = f"epoch_us(CAST({quote_identifier(timestamp_field)} AS TIMESTAMPTZ))"
    columns.append(
        f"CASE WHEN {finite} THEN '[' || CAST({micros} AS VARCHAR) || ',' || "
        f"CAST(to_json(struct_pack({packed})) AS VARCHAR) || ']' END AS __payload"
    )
    return ", ".join(columns)


def select_rows(files: Sequence[Path], sql: str, out: Path, *, memory_limit_mb: int) -> Path:
    """Write the rows of one user SELECT over ``files`` (named ``source``) to ``out``.

    Raises:
        InvalidParameter: anything but one SELECT; a query that fails or reads elsewhere.
    """
    check_select(sql)
    duck = _Confined(files, out, memory_limit_mb)
    try:
        duck.copy(f"SELECT * FROM ({sql})")  # nosec B608 - user SQL checked as one SELECT, run confined
    finally:
        duck.close()
    return out


def latest_rows(
    files: Sequence[Path],
    join_keys: Sequence[str],
    timestamp_field: str,
    features: Sequence[str],
    out: Path,
    *,
    sql: str | None = None,
    window: tuple[datetime | None, datetime],
    memory_limit_mb: int = 1024,
) -> LatestRows:
    """Write the newest row per key of event time in ``window`` (start exclusive, end
    inclusive) with the keys, the event time and ``features``, to ``out`` in key order.

    Raises:
        InvalidParameter: a missing column, a transformation that is not one SELECT, fails
            or reads another file; an event-time column that is not a time.
    """
    if sql is not None:
        check_select(sql)
    duck = _Confined(files, out, memory_limit_mb)
    try:
        body = "SELECT * FROM __scan"
        if sql is not None:
            # A transformed view: ties go to the order its query returns rows in.
            body = f"SELECT *, 0 AS __file, row_number() OVER () AS file_row_number FROM ({sql})"  # nosec B608 - user SQL checked, run confined
        keys = ", ".join(quote_identifier(k) for k in join_keys)
        ts = quote_identifier(timestamp_field)
        columns = ", ".join(quote_identifier(c) for c in (*join_keys, timestamp_field, *features))
        conditions = [f"{quote_identifier(k)} IS NOT NULL" for k in join_keys]
        conditions.append(f"CAST({ts} AS TIMESTAMPTZ) <= CAST($end AS TIMESTAMPTZ)")
        parameters: dict[str, object] = {"end": window[1]}
        if window[0] is not None:
            conditions.append(f"CAST({ts} AS TIMESTAMPTZ) > CAST($start AS TIMESTAMPTZ)")
            parameters["start"] = window[0]
        encoded = _encoded_sql(duck, body, join_keys, timestamp_field, features)
        if encoded is not None:
            columns += f", {encoded}"
        query = (
            f"SELECT {columns} FROM ({body}) WHERE {' AND '.join(conditions)} "  # nosec B608 - quoted names, values bound
            f"QUALIFY row_number() OVER (PARTITION BY {keys} ORDER BY {ts} DESC, "
            f"__file DESC, file_row_number DESC) = 1 ORDER BY {keys}"
        )
        rows = duck.copy(query, parameters)
    finally:
        duck.close()
    return LatestRows(out, rows)
