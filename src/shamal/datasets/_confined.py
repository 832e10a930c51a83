"""A DuckDB connection that sees one dataset version and nothing else.

Expectations, custom SQL included, run on a private in-memory database holding one view,
``data``, over the version's Parquet files. Once the view exists the connection is shut:

- only those files may be read (``allowed_paths``); every other file, directory, URL and
  database is refused (``enable_external_access = false``), so ``COPY``, ``ATTACH``,
  ``read_csv('/etc/passwd')`` or ``read_parquet`` of another path fail;
- no extension is installed or loaded on demand (nothing is ever downloaded), and Python
  objects in scope are not scanned as tables;
- the configuration is locked, so a query cannot ``SET`` its way back out.

Custom SQL must besides be a single ``SELECT`` (or ``WITH ... SELECT``) statement, as DuckDB's
own parser classifies it; every query runs under one deadline for the whole validation.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final, TypeVar

import duckdb
import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]

from shamal.errors import InvalidParameter

__all__ = [
    "MEMORY_LIMIT",
    "THREADS",
    "ConfinedDatabase",
    "check_select",
    "quote_identifier",
    "quote_text",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Characters DuckDB's Parquet reader expands as a glob pattern.
_GLOB: Final = frozenset("*?[]{}")
_BATCH_ROWS: Final = 65_536
#: DuckDB's own bound on what one validation holds in memory, and its threads.
MEMORY_LIMIT: Final = "512MB"
THREADS: Final = 2
_SETTINGS: Final = (
    "SET TimeZone = 'UTC'",
    "SET enable_external_access = false",
    "SET python_enable_replacements = false",
    "SET lock_configuration = true",
)


def quote_identifier(name: str) -> str:
    """A column name as a SQL identifier, whatever characters it holds."""
    return '"' + name.replace('"', '""') + '"'


def quote_text(text: str) -> str:
    """A string as a SQL literal."""
    return "'" + text.replace("'", "''") + "'"


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def check_select(sql: str) -> None:
    """Refuse anything but one read-only query: a single SELECT or WITH ... SELECT statement.

    Raises:
        InvalidParameter: the text does not parse, holds no statement or several, or a
            statement of another type (COPY, CREATE, INSERT, ATTACH, PRAGMA, SET ...).
    """
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise InvalidParameter(f"the SQL does not parse: {_first_line(exc)}") from None
    if len(statements) != 1:
        raise InvalidParameter(
            f"the SQL must be exactly one SELECT statement; it holds {len(statements)}."
        )
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        raise InvalidParameter(
            f"the SQL must be a SELECT (or WITH ... SELECT) query, not {kind.name}."
        )


class ConfinedDatabase:
    """An in-memory DuckDB with one view, ``data``, over the given Parquet files; use it as a
    context manager. Not thread-safe.

    Args:
        paths: the Parquet files of one dataset version (at least one).
        timeout_s: the time every query together may take; a query still running then is
            interrupted.

    Raises:
        InvalidParameter: no files, a file that does not exist, or a name with glob characters.
    """

    def __init__(self, paths: Sequence[Path], *, timeout_s: float) -> None:
        if not paths:
            raise InvalidParameter("validation needs at least one Parquet file.")
        files = [Path(p).resolve() for p in paths]
        for number, path in enumerate(files, start=1):
            if not path.is_file():
                raise InvalidParameter(f"Parquet file {number} of {len(files)} does not exist.")
            if _GLOB & set(str(path)):
                raise InvalidParameter(f"Parquet file {number} has glob characters in its name.")
        self._names = [str(p) for p in files]
        self._deadline = time.monotonic() + timeout_s
        self._timeout_s = timeout_s
        self._con = duckdb.connect(
            ":memory:",
            config={
                "autoinstall_known_extensions": False,
                "autoload_known_extensions": False,
                "allow_community_extensions": False,
                # Validation stays within a bound of its own whatever the version's size:
                # DuckDB streams the scan and fails clearly rather than growing past it.
                "memory_limit": MEMORY_LIMIT,
                "threads": THREADS,
            },
        )
        try:
            listing = ", ".join(quote_text(name) for name in self._names)
            # can_have_nan: Parquet min/max statistics leave NaN out, and DuckDB otherwise
            # prunes row groups by them, losing NaN rows from `x > 5` or `isnan(x)`.
            # The paths are quoted literals (quote_text), never raw text.
            self._con.execute(
                f"CREATE VIEW data AS SELECT * FROM read_parquet([{listing}], "  # nosec B608
                "union_by_name = true, can_have_nan = true)"
            )
            self._con.execute(f"SET allowed_paths = [{listing}]")
            for setting in _SETTINGS:
                self._con.execute(setting)
        except duckdb.Error as exc:
            self._con.close()
            raise InvalidParameter(f"the Parquet files do not open: {self._clean(exc)}") from None

    def __enter__(self) -> ConfinedDatabase:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._con.close()

    def _clean(self, exc: BaseException) -> str:
        """An error's first line, with the server's file names taken out."""
        text = _first_line(exc)
        for name in self._names:
            text = text.replace(name, "<data>")
        return text

    def _run(self, what: str, work: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise InvalidParameter(f"validation ran past its {self._timeout_s:g} s limit.")
        timer = threading.Timer(left, self._con.interrupt)
        timer.start()
        try:
            return work(self._con)
        except (duckdb.Error, pa.ArrowException, OSError) as exc:
            # An interrupt surfaces as DuckDB's error, or as Arrow's while batches stream.
            if isinstance(exc, duckdb.InterruptException) or time.monotonic() >= self._deadline:
                raise InvalidParameter(
                    f"{what} ran past the validation's {self._timeout_s:g} s limit."
                ) from None
            raise InvalidParameter(f"{what} failed: {self._clean(exc)}") from None
        finally:
            timer.cancel()

    def row(self, what: str, sql: str, parameters: Sequence[Any] = ()) -> tuple[Any, ...]:
        """The one row a query of ours returns (an aggregate)."""

        def fetch(con: duckdb.DuckDBPyConnection) -> tuple[Any, ...]:
            # fetchall, not fetchone: a result left unfinished blocks the connection.
            (found,) = con.execute(sql, list(parameters)).fetchall()
            return tuple(found)

        return self._run(what, fetch)

    def rows(self, what: str, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        """The column names and rows a query of ours returns."""

        def fetch(con: duckdb.DuckDBPyConnection) -> tuple[list[str], list[tuple[Any, ...]]]:
            cursor = con.execute(sql)
            names = [d[0] for d in cursor.description or ()]
            return names, [tuple(r) for r in cursor.fetchall()]

        return self._run(what, fetch)

    def user_query(
        self, what: str, sql: str, limit: int
    ) -> tuple[int, list[str], list[tuple[Any, ...]]]:
        """Run a user's read-only query: how many rows it returns, and the first ``limit``.

        Raises:
            InvalidParameter: the SQL is not a single SELECT, or it fails (a refused file
                access among other things), or it runs past the deadline.
        """
        try:
            check_select(sql)
        except InvalidParameter as exc:
            raise InvalidParameter(f"{what}: {exc.message}") from None

        def fetch(con: duckdb.DuckDBPyConnection) -> tuple[int, list[str], list[tuple[Any, ...]]]:
            # Streamed as Arrow batches: the query runs once, exactly as written, and only
            # the first rows become Python values.
            reader = con.sql(sql).to_arrow_reader(_BATCH_ROWS)
            count, first = 0, list[tuple[Any, ...]]()
            for batch in reader:
                if len(first) < limit:
                    head = batch.slice(0, limit - len(first))
                    first.extend(zip(*(column.to_pylist() for column in head.columns), strict=True))
                count += batch.num_rows
            return count, list(reader.schema.names), first

        return self._run(what, fetch)
