"""Statements of the logging hot path, compiled once per dialect and run on the driver.

A ``log-batch`` carries up to 1,000 metrics. Through the ORM's bulk insert, and even
through Core, SQLAlchemy processes every row's parameters in Python, which costs more
than SQLite's own insert. These statements are still built with SQLAlchemy (the SQL
text depends only on the statement, never on values) and every value is still a bound
parameter: only the compilation and the per-row processing are skipped. Rows must hold
values the driver takes as they are (str, int, float, bool, None).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection, CursorResult
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ClauseElement

Row = tuple[Any, ...]


class PreparedStatement:
    """A statement whose parameters are the names ``params``, in that order.

    Args:
        build: makes the statement for a dialect name (``"sqlite"``, ``"postgresql"``),
            with one bound parameter per name in ``params`` and no other.
        params: the parameter names; rows given to :meth:`execute` follow this order.

    Thread-safe: the compiled text is cached per dialect (compiling twice in a race
    is harmless, both give the same text).
    """

    def __init__(self, build: Callable[[str], ClauseElement], params: Sequence[str]) -> None:
        self._build = build
        self._params = tuple(params)
        self._compiled: dict[str, tuple[str, bool]] = {}

    def _sql(self, dialect: Dialect) -> tuple[str, bool]:
        found = self._compiled.get(dialect.name)
        if found is None:
            compiled = self._build(dialect.name).compile(dialect=dialect)
            if not isinstance(compiled, SQLCompiler):
                raise TypeError(f"not a SQL statement: {compiled!r}")
            order = compiled.positiontup
            if order is not None and tuple(order) != self._params:
                raise AssertionError(f"parameters {order} are not {self._params}")
            if order is None and set(compiled.binds) != set(self._params):
                raise AssertionError(f"parameters {set(compiled.binds)} are not {self._params}")
            found = (compiled.string, order is not None)
            self._compiled[dialect.name] = found
        return found

    def execute(self, connection: Connection, rows: Sequence[Row]) -> CursorResult[Any]:
        """Run the statement once per row (one row: a plain execute)."""
        sql, positional = self._sql(connection.dialect)
        params: list[Any] = (
            list(rows) if positional else [dict(zip(self._params, r, strict=True)) for r in rows]
        )
        return connection.exec_driver_sql(sql, params)
