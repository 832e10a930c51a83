"""Point-in-time correct joins of entity rows with feature views, offline, in DuckDB.

A training set is built from *entity rows* (join keys, an entity timestamp, and any other
columns such as labels) by joining each entity row, for each requested feature view, with that
view's latest feature row for the same keys as of the entity row's timestamp.

Semantics, for an entity row with keys ``K`` and timestamp ``T`` and a view with TTL ``ttl``
(seconds, or ``None`` for unlimited):

- **The row chosen** is the view's feature row with keys equal to ``K``, event time ``<= T``
  (a row stamped exactly ``T`` counts) and, with a TTL, event time ``>= T - ttl`` (inclusive),
  with the greatest event time. If there is none, the view's features are null for that entity
  row. If the latest row at or before ``T`` is older than the TTL the features are null: an
  even older row is never used instead.
- **Ties** (several feature rows with the same keys and the same event time): the row written
  last wins, that is the last in the view's input order (its files in the order given, rows in
  file order). A view with a ``sql`` transformation is ordered by the transformation's output
  (for a projection or filter over ``source``, the files' order).
- **Nulls**: feature rows with a null event time or any null join key are ignored. Entity rows
  with a null key or a null timestamp are kept, with null features. A chosen row's null
  feature values stay null (row-level semantics, as Feast): no value is taken from another row.
- **Output**: one Parquet file (zstd), or an Arrow table, with every entity row exactly once,
  in the entity rows' order (files in the order given, rows in file order), holding every
  entity column unchanged first, then each view's requested features in the order the views
  and features are given. A feature column is named ``feature``, or ``view__feature`` with
  ``full_names``; two output columns with one name are refused.
- **Time**: the entity timestamp and the views' event times may be timestamps of any unit, with
  a time zone or without (naive ones are read as UTC), or dates (midnight UTC); they are
  compared in UTC at microsecond precision.
- **Keys**: each view's join keys are columns of that name in both the view and the entity
  rows, of one type (integers of any width and sign match each other, as do decimals and
  floating point numbers among themselves).

Two methods compute the same result. **gather**, when the result and one view's features fit
well within the memory limit: DuckDB's ASOF join finds, for each entity row, the *position* of
its chosen row in each view (reading only the keys and times), and Arrow takes the features at
those positions, so feature values are never sorted or hashed; the result is assembled in
memory. **spill**, for anything larger: one ASOF join of whole rows per view and a join by row
number, inside DuckDB, which spills to a temporary directory under its memory limit, and the
result streams to the output file. ``method="auto"`` estimates gather's memory from the Parquet
metadata and picks it when it fits; gathering then leaves DuckDB the rest of the limit.

The database is confined before any user SQL runs: it may read the entity and view files and
write the output and its spill files, nothing else (no other file, URL, database or
extension), and its configuration is locked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import logging
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import duckdb
import numpy as np
import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped,unused-ignore]
import pyarrow.parquet as pq  # type: ignore[import-untyped,unused-ignore]

from shamal.datasets import check_select, quote_identifier, quote_text
from shamal.errors import InvalidParameter

__all__ = ["METHODS", "JoinLimits", "JoinResult", "ViewInput", "gather_estimate", "historical_join"]

logger = logging.getLogger(__name__)

#: Characters DuckDB's Parquet reader would expand as a glob pattern.
_GLOB: Final = frozenset("*?[]{}")
_INTEGERS: Final = frozenset(
    {
        "TINYINT",
        "SMALLINT",
        "INTEGER",
        "BIGINT",
        "HUGEINT",
        "UTINYINT",
        "USMALLINT",
        "UINTEGER",
        "UBIGINT",
        "UHUGEINT",
    }
)
_FLOATS: Final = frozenset({"FLOAT", "DOUBLE"})
#: The longest TTL, in seconds (about 3,000 years): its microseconds fit any arithmetic here.
MAX_TTL_SECONDS: Final = 10**11
#: The names of DuckDB's virtual Parquet columns that number each row by file and position.
_ORDINALS: Final = ("file_index", "file_row_number")
_ENTITY_VIEW: Final = "pit_entities"
#: The join's methods (see the module's docstring).
METHODS: Final = ("auto", "gather", "spill")
#: ``auto`` gathers when its estimate is at most this share of the memory limit (DuckDB's
#: ASOF joins of keys and times, and Arrow's buffers while a column is taken, need the rest).
GATHER_SHARE: Final = 0.6
#: The least memory DuckDB is given for gather's ASOF joins of keys and times.
MIN_DUCKDB_MB: Final = 16


@dataclass(frozen=True, slots=True)
class ViewInput:
    """One feature view as the join reads it.

    Attributes:
        name: the feature view's name (``view__feature`` with ``full_names``).
        files: the view's Parquet files in order; among rows with the same keys and event
            time, the one in a later file (or later in the same file) wins.
        join_keys: the view's key columns; the entity rows hold columns of the same names.
        timestamp_field: the view's event-time column.
        features: the feature columns to return, in order.
        ttl_seconds: how old a feature row may be, relative to the entity row's timestamp, to
            be used; ``None``: any age.
        sql: an optional transformation, one SELECT over a relation named ``source`` (the
            view's files), whose result holds the keys, the event time and the features.
    """

    name: str
    files: tuple[Path, ...]
    join_keys: tuple[str, ...]
    timestamp_field: str
    features: tuple[str, ...]
    ttl_seconds: int | None = None
    sql: str | None = None


@dataclass(frozen=True, slots=True)
class JoinLimits:
    """What one join may use.

    Attributes:
        memory_limit_mb: DuckDB's memory limit; a larger join spills to ``temp_dir``.
        temp_dir: where DuckDB spills; ``None``: a temporary directory made and removed by
            the call.
        threads: DuckDB's worker threads.
    """

    memory_limit_mb: int = 1024
    temp_dir: Path | None = None
    threads: int = 2


@dataclass(frozen=True, slots=True)
class JoinResult:
    """The training set: its file (None when it was asked for in memory), row count, column
    names in order, the table itself when asked for in memory, and the method that ran."""

    path: Path | None
    rows: int
    columns: tuple[str, ...]
    table: pa.Table | None = None
    method: str = "spill"


@dataclass(slots=True)
class _Relation:
    """A relation registered in the join's database, and its columns' DuckDB types."""

    name: str
    types: dict[str, str] = field(default_factory=dict)
    #: Its rows' places are DuckDB's file ordinals (not a numbering that may not repeat).
    ordinals: bool = False


def historical_join(
    entities: pa.Table | Sequence[Path],
    entity_timestamp: str,
    views: Sequence[ViewInput],
    out: Path | None,
    *,
    full_names: bool = False,
    limits: JoinLimits = JoinLimits(),  # noqa: B008 - frozen, so one shared default is safe
    method: str = "auto",
) -> JoinResult:
    """Join entity rows with each view's latest feature row as of the entity row's timestamp,
    as the module's docstring states, and write the result to ``out``.

    Args:
        entities: the entity rows, an Arrow table or Parquet files (read in order).
        entity_timestamp: the entity rows' timestamp column.
        views: the feature views to join, in output order.
        out: the Parquet file (zstd) to write, replaced if it exists and untouched on failure;
            None: return the result as an Arrow table instead (``JoinResult.table``).
        full_names: name feature columns ``view__feature`` rather than ``feature``.
        limits: the memory limit (DuckDB's, and gather's estimate), spill directory, threads.
        method: ``auto``, ``gather`` or ``spill`` (see the module's docstring).

    Returns:
        The file written (or the table), its row count (the entity rows'), its column names.

    Raises:
        InvalidParameter: a missing column, a non-temporal timestamp, a join key whose types
            differ, two output columns with one name, a missing file, a refused or failing
            transformation, or limits out of range; nothing is written then.
    """
    _check_request(entity_timestamp, views, limits, method)
    entity_files = None if isinstance(entities, pa.Table) else _files("entity rows", entities)
    view_files = [_files(f"view {view.name!r}", view.files) for view in views]
    out = _output(out)
    method, limits = _method(method, limits, entities, view_files, views)
    readable = [*(entity_files or ()), *(f for files in view_files for f in files)]
    with _spill_directory(limits.temp_dir) as spill:
        partial = (out.parent if out else spill) / f".pit-{uuid.uuid4().hex}.partial"
        hidden = [*readable, partial, spill]
        try:
            with _confined(limits, spill, [*readable, partial]) as con:
                job = _Join(con, entity_timestamp, views, view_files, full_names, limits.threads)
                job.open(entities)
                table = job.gather() if method == "gather" else None
                rows = table.num_rows if table is not None else job.spill(partial)
            return _deliver(JoinResult(out, rows, job.columns, table, method), partial)
        except duckdb.Error as exc:
            raise InvalidParameter(f"the join failed: {_clean(exc, hidden)}") from None
        except InvalidParameter as exc:
            # A user's transformation may name our files in an error: keep them out.
            raise InvalidParameter(_clean(exc.message, hidden)) from None
        finally:
            partial.unlink(missing_ok=True)


def _method(
    method: str,
    limits: JoinLimits,
    entities: pa.Table | Sequence[Path],
    view_files: list[list[Path]],
    views: Sequence[ViewInput],
) -> tuple[str, JoinLimits]:
    """The method to run and DuckDB's limits for it: gathering leaves DuckDB what its own
    buffers (the estimate) do not take of the memory limit, so the two stay within it."""
    if method == "spill":
        return method, limits
    try:
        need_mb = gather_estimate(entities, view_files, [v.features for v in views]) >> 20
    except (pa.ArrowException, OSError):
        # Unreadable metadata: DuckDB's reading of the files says what is wrong, clearly.
        return ("spill" if method == "auto" else method), limits
    if method == "auto":
        method = "gather" if need_mb <= limits.memory_limit_mb * GATHER_SHARE else "spill"
    if method == "spill":
        return method, limits
    rest = max(MIN_DUCKDB_MB, limits.memory_limit_mb - need_mb)
    return method, dataclasses.replace(limits, memory_limit_mb=rest)


def _output(out: Path | None) -> Path | None:
    if out is None:
        return None
    out = Path(out).resolve()
    if not out.parent.is_dir():
        raise InvalidParameter("the output file's directory does not exist; create it first.")
    return out


def _deliver(done: JoinResult, partial: Path) -> JoinResult:
    """The result as asked: a table in memory (``done.path`` None), or the file at
    ``done.path`` in place of the partial one (``partial`` holds spill's result)."""
    if done.path is None:
        table = done.table if done.table is not None else pq.read_table(partial)
        return dataclasses.replace(done, table=table)
    if done.table is not None:
        pq.write_table(done.table, partial, compression="zstd", compression_level=1)
    partial.replace(done.path)
    logger.debug("point-in-time join (%s) wrote %d rows", done.method, done.rows)
    return dataclasses.replace(done, table=None)


class _Join:
    """One join on a confined connection: the relations opened and checked, then one method."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        entity_timestamp: str,
        views: Sequence[ViewInput],
        view_files: list[list[Path]],
        full_names: bool,
        threads: int,
    ) -> None:
        self.con, self.timestamp, self.views = con, entity_timestamp, views
        self.threads = threads
        self.view_files, self.full_names = view_files, full_names
        self.prefix = ""
        self.entity = _Relation(_ENTITY_VIEW)
        self.sources: list[_Relation] = []
        self.names: list[str] = []

    @property
    def columns(self) -> tuple[str, ...]:
        return (*self.entity.types, *self.names)

    def open(self, entities: pa.Table | list[Path]) -> None:
        con, views = self.con, self.views
        self.prefix = prefix = _prefix(entities, views)
        self.entity = _open_entities(con, entities, prefix)
        _check_column(self.entity, self.timestamp, "the entity table", temporal=True)
        self.sources = [
            _open_view(con, index, view, files, prefix)
            for index, (view, files) in enumerate(zip(views, self.view_files, strict=True))
        ]
        for view, source in zip(views, self.sources, strict=True):
            _check_view(view, source, self.entity)
        self.names = _output_names(list(self.entity.types), views, self.full_names)

    def spill(self, partial: Path) -> int:
        """The join inside DuckDB, streamed to ``partial``; returns its row count."""
        steps, query = _join_steps(
            list(self.entity.types),
            self.timestamp,
            self.views,
            self.sources,
            self.names,
            self.prefix,
        )
        for step in steps:
            self.con.execute(step)
        (rows,) = self.con.execute(
            f"COPY ({query}) TO {quote_text(str(partial))} "  # nosec B608 - quoted names only
            "(FORMAT parquet, COMPRESSION zstd, COMPRESSION_LEVEL 1)"
        ).fetchone() or (0,)
        return int(rows)

    def gather(self) -> pa.Table:
        """The join by positions: DuckDB finds each entity row's chosen row in each view,
        Arrow takes the features there; the result in memory."""
        con, q, prefix = self.con, quote_identifier, self.prefix
        con.execute(_entity_step(self.timestamp, prefix, numbered=True))
        pos = q(prefix + "pos")
        entity_columns = ", ".join(q(c) for c in self.entity.types)
        result = con.sql(f"SELECT {entity_columns} FROM e0 ORDER BY {pos}").to_arrow_table()  # nosec B608
        if not self.views:
            return result
        reads = []  # per view: the query that reads its features in position order
        for i, (view, source) in enumerate(zip(self.views, self.sources, strict=True)):
            relation, place, order = self._positions(i, source)
            con.execute(
                f"CREATE TEMP VIEW v{i} AS "
                f"{_latest_rows(i, view, relation, prefix, position=place)}"
            )
            features = ", ".join(q(f) for f in view.features)
            reads.append(f"SELECT {features} FROM {q(relation)}{order}")  # nosec B608
        picks = con.sql(_picks(self.views, prefix)).to_arrow_table()
        names = iter(self.names)
        # Arrow's take is single-threaded and bound by memory latency: a column per thread.
        with ThreadPoolExecutor(self.threads, thread_name_prefix="pit-take") as pool:
            for i, read in enumerate(reads):
                picked = picks.column(i).combine_chunks()
                values = con.sql(read).to_arrow_table()
                taken = list(pool.map(functools.partial(_take, picked), values.columns))
                del values
                for column in taken:
                    result = result.append_column(next(names), column)
        return result

    def _positions(self, i: int, source: _Relation) -> tuple[str, str, str]:
        """A relation of view ``i``'s rows, an expression for a row's position in it, and the
        ORDER BY (if any) that reads its rows back in that order."""
        q, prefix = quote_identifier, self.prefix
        if source.ordinals:
            counts = [pq.read_metadata(f).num_rows for f in self.view_files[i]]
            starts = [0, *itertools.accumulate(counts)][:-1]
            file_, row = q(prefix + "file"), q(prefix + "row")
            # A plain scan keeps file order (preserve_insertion_order): no sort to read back.
            return source.name, f"({starts}::BIGINT[])[CAST({file_} AS BIGINT) + 1] + {row}", ""
        # A transformation (or a numbered scan) may not repeat its order: run it once.
        held = f"pit_held_{i}"
        self.con.execute(
            f"CREATE TEMP TABLE {held} AS SELECT *, row_number() OVER () - 1 AS "  # nosec B608
            f"{q(prefix + 'pos')} FROM {q(source.name)}"
        )
        position = q(prefix + "pos")
        return held, position, f" ORDER BY {position}"


def _check_request(
    entity_timestamp: str, views: Sequence[ViewInput], limits: JoinLimits, method: str
) -> None:
    if method not in METHODS:
        raise InvalidParameter(f"method must be one of {', '.join(METHODS)}.")
    if not isinstance(entity_timestamp, str) or not entity_timestamp:
        raise InvalidParameter("entity_timestamp must name the entity rows' timestamp column.")
    if not 16 <= limits.memory_limit_mb <= 1_048_576:
        raise InvalidParameter("memory_limit_mb must be between 16 and 1048576.")
    if not 1 <= limits.threads <= 256:
        raise InvalidParameter("threads must be between 1 and 256.")
    for view in views:
        ttl = view.ttl_seconds
        if ttl is not None and (
            isinstance(ttl, bool) or not isinstance(ttl, int) or not 0 <= ttl <= MAX_TTL_SECONDS
        ):
            raise InvalidParameter(
                f"view {view.name!r}: ttl_seconds must be None or an integer from 0 to "
                f"{MAX_TTL_SECONDS}."
            )
        if not view.files:
            raise InvalidParameter(f"view {view.name!r} has no Parquet files.")
        _check_sql(view)


def _check_sql(view: ViewInput) -> None:
    if view.sql is not None:
        try:
            check_select(view.sql)
        except InvalidParameter as exc:
            raise InvalidParameter(f"view {view.name!r}: {exc.message}") from None


def _files(what: str, paths: Sequence[Path]) -> list[Path]:
    if isinstance(paths, str | Path) or not paths:
        raise InvalidParameter(f"{what}: give a non-empty sequence of Parquet files.")
    files = [Path(p).resolve() for p in paths]
    for number, path in enumerate(files, start=1):
        if _GLOB & set(str(path)):
            raise InvalidParameter(f"{what}: file {number} has glob characters in its name.")
        if not path.is_file():
            raise InvalidParameter(f"{what}: file {number} of {len(files)} does not exist.")
    return files


@contextlib.contextmanager
def _spill_directory(given: Path | None) -> Iterator[Path]:
    if given is not None:
        path = Path(given).resolve()
        if not path.is_dir():
            raise InvalidParameter("temp_dir does not exist; create it or leave it None.")
        yield path
        return
    made = Path(tempfile.mkdtemp(prefix="shamal-pit-"))
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


@contextlib.contextmanager
def _confined(
    limits: JoinLimits, spill: Path, paths: list[Path]
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A private in-memory database that may touch ``paths`` and ``spill`` and nothing else."""
    con = duckdb.connect(
        ":memory:",
        config={
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
            "allow_community_extensions": False,
            "memory_limit": f"{limits.memory_limit_mb}MB",
            "threads": limits.threads,
            "temp_directory": str(spill),
        },
    )
    try:
        listing = ", ".join(quote_text(str(p)) for p in paths)
        directory = quote_text(str(spill).rstrip("/") + "/")
        for setting in (
            "SET preserve_insertion_order = true",
            "SET TimeZone = 'UTC'",
            "SET python_enable_replacements = false",
            f"SET allowed_paths = [{listing}]",
            f"SET allowed_directories = [{directory}]",
            "SET enable_external_access = false",
            "SET lock_configuration = true",
        ):
            con.execute(setting)
        yield con
    finally:
        con.close()


def _clean(exc: BaseException | str, paths: Sequence[Path]) -> str:
    """An error's first line, without the server's file names."""
    text = str(exc).strip()
    text = text.splitlines()[0] if text else type(exc).__name__
    for path in sorted(paths, key=lambda p: len(str(p)), reverse=True):
        text = text.replace(str(path), "<file>")
    return text[:300]


def _prefix(entities: pa.Table | list[Path], views: Sequence[ViewInput]) -> str:
    """A prefix for the join's own columns that no user column starts with (a random part
    covers the columns not known before the files are read)."""
    names = [*entities.column_names] if isinstance(entities, pa.Table) else []
    for view in views:
        names.extend([*view.join_keys, view.timestamp_field, *view.features])
    prefix = f"__pit{uuid.uuid4().hex[:12]}"
    while any(name.startswith(prefix) for name in names):
        prefix += "_"
    return prefix + "_"


def _describe(con: duckdb.DuckDBPyConnection, relation: str) -> dict[str, str]:
    rows = con.execute(f"DESCRIBE {quote_identifier(relation)}").fetchall()
    return {str(row[0]): str(row[1]) for row in rows}


def _parquet_scan(files: Sequence[Path]) -> str:
    listing = ", ".join(quote_text(str(p)) for p in files)
    # can_have_nan: Parquet statistics leave NaN out; without it DuckDB may prune such rows.
    return f"read_parquet([{listing}], union_by_name = true, can_have_nan = true)"


def _ordered_scan(
    con: duckdb.DuckDBPyConnection, files: Sequence[Path], prefix: str
) -> tuple[str, bool]:
    """A SELECT of every column of the files plus ``{prefix}file`` and ``{prefix}row``, which
    number the rows in input order; and whether those are DuckDB's file ordinals."""
    scan = _parquet_scan(files)
    columns = con.execute(f"DESCRIBE SELECT * FROM {scan}").fetchall()  # nosec B608
    file_, row = quote_identifier(prefix + "file"), quote_identifier(prefix + "row")
    if any(str(c[0]) in _ORDINALS for c in columns):
        # A data column hides DuckDB's virtual ordinals: number the single-threaded,
        # order-preserving scan instead.
        logger.debug("Parquet columns shadow the file ordinals; numbering the scan")
        return f"SELECT *, 0 AS {file_}, row_number() OVER () AS {row} FROM {scan}", False  # nosec B608
    return f"SELECT *, file_index AS {file_}, file_row_number AS {row} FROM {scan}", True  # nosec B608


def _open_entities(
    con: duckdb.DuckDBPyConnection, entities: pa.Table | list[Path], prefix: str
) -> _Relation:
    """Register the entity rows as a view holding their columns and the two ordinals."""
    file_ = quote_identifier(prefix + "file")
    if isinstance(entities, pa.Table):
        numbered = entities.append_column(
            prefix + "row", pa.array(np.arange(entities.num_rows, dtype=np.int64))
        )
        con.register(prefix + "arrow", numbered)
        source = quote_identifier(prefix + "arrow")
        con.execute(
            f"CREATE VIEW {_ENTITY_VIEW} AS SELECT *, 0 AS {file_} FROM {source}"  # nosec B608
        )
    else:
        scan, _ = _ordered_scan(con, entities, prefix)
        con.execute(f"CREATE VIEW {_ENTITY_VIEW} AS {scan}")
    types = _describe(con, _ENTITY_VIEW)
    return _Relation(_ENTITY_VIEW, {k: v for k, v in types.items() if not k.startswith(prefix)})


def _open_view(
    con: duckdb.DuckDBPyConnection, index: int, view: ViewInput, files: list[Path], prefix: str
) -> _Relation:
    """Register a view's rows (after its transformation) with their ordinals."""
    name = f"pit_view_{index}"
    scan, ordinals = _ordered_scan(con, files, prefix)
    if view.sql is None:
        body = scan
    else:
        file_, row = quote_identifier(prefix + "file"), quote_identifier(prefix + "row")
        text = duckdb.extract_statements(view.sql)[0].query.strip().rstrip(";")
        # The user's query sees `source` (without our ordinals) and runs confined; its output
        # order is the tie order. Newlines keep a trailing comment from eating our text.
        ordinals = False
        body = (
            f"WITH source AS (SELECT * EXCLUDE ({file_}, {row}) FROM ({scan})) "  # nosec B608
            f"SELECT *, 0 AS {file_}, row_number() OVER () AS {row} FROM (\n{text}\n)"
        )
    try:
        con.execute(f"CREATE VIEW {name} AS {body}")  # nosec B608 - quoted names only
    except duckdb.Error as exc:
        what = "transformation" if view.sql is not None else "files"
        raise InvalidParameter(
            f"view {view.name!r}: the {what} failed: {_clean(exc, files)}"
        ) from None
    types = _describe(con, name)
    return _Relation(name, {k: v for k, v in types.items() if not k.startswith(prefix)}, ordinals)


def _check_column(relation: _Relation, column: str, where: str, *, temporal: bool) -> None:
    kind = relation.types.get(column)
    if kind is None:
        raise InvalidParameter(f"{where} holds no column {column!r}; check its name.")
    if temporal and not _is_temporal(kind):
        raise InvalidParameter(
            f"{where}: column {column!r} is {kind}, not a timestamp or date; "
            "give a timestamp column."
        )


def _is_temporal(kind: str) -> bool:
    return kind == "DATE" or kind.startswith("TIMESTAMP")


def _family(kind: str) -> str:
    if kind in _INTEGERS:
        return "integer"
    if kind.startswith("DECIMAL"):
        return "decimal"
    if kind in _FLOATS:
        return "float"
    return kind


def _check_view(view: ViewInput, source: _Relation, entity: _Relation) -> None:
    where = f"view {view.name!r}"
    _check_column(source, view.timestamp_field, where, temporal=True)
    for feature in view.features:
        _check_column(source, feature, where, temporal=False)
    for key in view.join_keys:
        _check_column(source, key, where, temporal=False)
        if key not in entity.types:
            raise InvalidParameter(
                f"the entity table holds no column {key!r}, a join key of {where}; add it."
            )
        theirs, ours = source.types[key], entity.types[key]
        if _family(theirs) != _family(ours):
            raise InvalidParameter(
                f"join key {key!r} is {ours} in the entity rows but {theirs} in {where}; "
                "cast one side so the types match."
            )


def _output_names(entity_columns: list[str], views: Sequence[ViewInput], full: bool) -> list[str]:
    seen = dict.fromkeys(entity_columns, "an entity column")
    names = []
    for view in views:
        for feature in view.features:
            name = f"{view.name}__{feature}" if full else feature
            if name in seen:
                hint = "" if full else "; pass full_names=True to name features view__feature"
                raise InvalidParameter(
                    f"output column {name[:200]!r} of view {view.name!r} clashes with "
                    f"{seen[name]}{hint}."
                )
            seen[name] = f"a feature of view {view.name!r}"
            names.append(name)
    return names


def _utc(column: str) -> str:
    """An expression for a temporal column as a naive timestamp in UTC."""
    # TIMESTAMPTZ casts to UTC wall time (the session's zone is UTC); dates become midnight.
    return f"CAST({column} AS TIMESTAMP)"


def _join_steps(
    entity_columns: list[str],
    entity_timestamp: str,
    views: Sequence[ViewInput],
    sources: list[_Relation],
    names: list[str],
    prefix: str,
) -> tuple[list[str], str]:
    """The join as statements and a final query: the entity rows numbered in a table, one
    ASOF LEFT JOIN per view into a narrow table (the row's number and the view's features),
    then the entity rows with every view's features by that number, in entity order.

    Each join lands in a table of its own because DuckDB cannot stream an ASOF join into
    another join or a sort within its memory limit, while each step alone spills; a step's
    table holds only its own view's features, so no step copies what the ones before found.
    """
    q = quote_identifier
    order = q(prefix + "ord")
    steps = [_entity_step(entity_timestamp, prefix)]
    results: list[str] = []
    joins: list[str] = []
    for i, (view, source) in enumerate(zip(views, sources, strict=True)):
        steps.append(f"CREATE TEMP VIEW v{i} AS {_latest_rows(i, view, source.name, prefix)}")
        picked = [q(f"{prefix}v{i}_{j}") for j in range(len(view.features))]
        steps.append(f"CREATE TEMP TABLE r{i} AS {_asof(i, view, picked, prefix)}")
        joins.append(f"JOIN r{i} ON r{i}.{order} = e0.{order}")
        results.extend(f"r{i}.{p}" for p in picked)
    selected = [f"e0.{q(c)}" for c in entity_columns] + [
        f"{r} AS {q(n)}" for r, n in zip(results, names, strict=True)
    ]
    final = (
        f"SELECT {', '.join(selected)} FROM e0 {' '.join(joins)} "  # nosec B608 - quoted names
        f"ORDER BY e0.{order}"
    )
    return steps, final


def _gather_pool() -> pa.MemoryPool:
    """The memory pool gather's columns are taken into: jemalloc where pyarrow has it. It keeps
    and reuses the pages a view's columns free for the next view's, where mimalloc (pyarrow's
    default here) gave them back to the system and faulted them in again: on a 2-CPU machine
    that was a sixth of a 1,000,000-row, 100-feature join."""
    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:  # a pyarrow built without jemalloc
        return pa.default_memory_pool()


def _take(picked: pa.Array, column: pa.ChunkedArray) -> pa.ChunkedArray:
    return pc.take(column, picked, memory_pool=_gather_pool())


def _entity_step(entity_timestamp: str, prefix: str, *, numbered: bool = False) -> str:
    """The entity rows as table ``e0``, with their time in UTC, their input order and their
    ordering key (their time, then past any place: every view row at that time counts);
    ``numbered`` adds their position (0, 1, ...) in input order."""
    q = quote_identifier
    t, file_, row = (q(prefix + n) for n in ("t", "file", "row"))
    latest = _order_key(f"epoch_us({_utc(q(entity_timestamp))})", str((1 << _PLACE_BITS) - 1))
    position = f", row_number() OVER (ORDER BY {file_}, {row}) - 1 AS {q(prefix + 'pos')}"
    return (
        f"CREATE TEMP TABLE e0 AS SELECT *, {_utc(q(entity_timestamp))} AS {t}, "  # nosec B608
        f"CAST({file_} AS BIGINT) * {1 << 40} + {row} AS {q(prefix + 'ord')}, "
        f"{latest} AS {q(prefix + 'o')}{position if numbered else ''} FROM {_ENTITY_VIEW}"
    )


#: Room for a row's place (file index and row number) below its event time in one ordering
#: key: up to 1,024 files of 2^40 rows each.
_PLACE_BITS: Final = 50


def _order_key(micros: str, place: str) -> str:
    """An event time and a place as one HUGEINT that sorts by time, then place."""
    return f"(CAST({micros} AS HUGEINT) * {1 << _PLACE_BITS} + {place})"


def _latest_rows(
    i: int, view: ViewInput, relation: str, prefix: str, *, position: str | None = None
) -> str:
    """A view's rows with renamed columns and an ordering key (event time, then place): the
    ASOF join takes the greatest key at or before an entity row's, which is the latest row,
    and of rows with the same keys and time the one written last; no pass to deduplicate.
    With ``position`` (an expression), the row's position instead of its features."""
    q = quote_identifier
    file_, row = q(prefix + "file"), q(prefix + "row")
    keys = [q(k) for k in view.join_keys]
    ts = _utc(q(view.timestamp_field))
    columns = [f"{k} AS {q(f'{prefix}k{i}_{j}')}" for j, k in enumerate(keys)]
    columns.append(f"{ts} AS {q(f'{prefix}t{i}')}")
    place = f"CAST({file_} AS HUGEINT) * {1 << 40} + {row}"
    columns.append(f"{_order_key(f'epoch_us({ts})', place)} AS {q(f'{prefix}o{i}')}")
    if position is not None:
        columns.append(f"{position} AS {q(f'{prefix}p{i}')}")
    else:
        columns += [f"{q(f)} AS {q(f'{prefix}f{i}_{j}')}" for j, f in enumerate(view.features)]
    present = " AND ".join(f"{c} IS NOT NULL" for c in [*keys, q(view.timestamp_field)])
    return f"SELECT {', '.join(columns)} FROM {q(relation)} WHERE {present}"  # nosec B608


def _asof_on(i: int, view: ViewInput, prefix: str) -> str:
    """The ASOF join of ``e0`` with view ``i``'s rows (same keys, the latest row at or
    before), to follow ``FROM e0``."""
    q = quote_identifier
    conditions = [
        f"e0.{q(k)} = v{i}.{q(f'{prefix}k{i}_{j}')}" for j, k in enumerate(view.join_keys)
    ]
    conditions.append(f"e0.{q(prefix + 'o')} >= v{i}.{q(f'{prefix}o{i}')}")
    return f"ASOF LEFT JOIN v{i} ON {' AND '.join(conditions)}"


def _fresh(i: int, view: ViewInput, prefix: str, value: str) -> str:
    """``value`` where view ``i``'s chosen row is within its TTL, else null."""
    if view.ttl_seconds is None:
        return value
    q = quote_identifier
    t, vt = q(prefix + "t"), f"v{i}.{q(f'{prefix}t{i}')}"
    # HUGEINT: the difference of two extreme timestamps overflows BIGINT microseconds.
    age = f"CAST(epoch_us(e0.{t}) AS HUGEINT) - epoch_us({vt})"
    return f"CASE WHEN {age} <= {int(view.ttl_seconds) * 1_000_000} THEN {value} END"


def _picks(views: Sequence[ViewInput], prefix: str) -> str:
    """Each entity row's chosen position in each view (null: none, or older than the TTL), a
    column per view, in the entity rows' order: one chain of ASOF joins of narrow rows."""
    q = quote_identifier
    chosen = [_fresh(i, v, prefix, f"v{i}.{q(f'{prefix}p{i}')}") for i, v in enumerate(views)]
    joins = " ".join(_asof_on(i, v, prefix) for i, v in enumerate(views))
    return f"SELECT {', '.join(chosen)} FROM e0 {joins} ORDER BY e0.{q(prefix + 'pos')}"  # nosec B608


def _asof(i: int, view: ViewInput, picked: list[str], prefix: str) -> str:
    """Each entity row's number with view ``i``'s features, nulled where older than the TTL."""
    q = quote_identifier
    values = [f"e0.{q(prefix + 'ord')}"]
    for j, name in enumerate(picked):
        value = _fresh(i, view, prefix, f"v{i}.{q(f'{prefix}f{i}_{j}')}")
        values.append(f"{value} AS {name}")
    return f"SELECT {', '.join(values)} FROM e0 {_asof_on(i, view, prefix)}"  # nosec B608


def gather_estimate(
    entities: pa.Table | Sequence[Path],
    view_files: Sequence[Sequence[Path]],
    features: Sequence[Sequence[str]],
) -> int:
    """The bytes ``gather`` holds at its peak, from the Parquet metadata: the entity rows, the
    result's feature columns, and the largest view's features read whole (a transformed view's
    output is estimated by its files' columns of those names)."""
    if isinstance(entities, pa.Table):
        rows, total = entities.num_rows, int(entities.nbytes)
    else:
        rows, total = 0, 0
        for path in entities:
            meta = pq.read_metadata(path)
            rows += meta.num_rows
            total += sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups))
    largest = 0
    for files, names in zip(view_files, features, strict=True):
        count, size = 0, 0
        for path in files:
            meta = pq.read_metadata(path)
            count += meta.num_rows
            size += _column_bytes(meta, set(names))
        largest = max(largest, size)
        total += size * rows // max(count, 1)
    return total + largest


def _column_bytes(meta: pq.FileMetaData, names: set[str]) -> int:
    """The uncompressed bytes of the named columns in a Parquet file."""
    size = 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            column = group.column(c)
            if column.path_in_schema.split(".")[0] in names:
                size += column.total_uncompressed_size
    return size
