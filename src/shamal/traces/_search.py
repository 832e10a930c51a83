"""Compile a parsed trace search (``tracking.TRACES``) into SQLAlchemy conditions and an order.

Every value reaches the database as a bound parameter. A clause on a tag, a metadata key or
a span matches a trace that has such a row (``!=`` included: a trace without the key never
matches it), as on a stock server; ``name`` is the ``mlflow.traceName`` tag, and ``run_id``
the ``mlflow.sourceRun`` metadata or a link made by ``link-to-run``. Every order ends with
the trace id, so offset pages are stable. ``trace.text`` reads each span's search text
(MLflow's span dict as JSON, what a stock server searches), never its OTLP JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, SQLColumnExpression, func, not_, or_, select
from sqlalchemy.sql.elements import UnaryExpression

from shamal.db.models import (
    TraceMetadataRow,
    TraceRow,
    TraceRunLinkRow,
    TraceSpanRow,
    TraceTagRow,
)
from shamal.errors import InvalidParameter
from shamal.traces._entities import SOURCE_RUN_METADATA, TRACE_NAME_TAG
from shamal.tracking import Comparison, OrderBy, compare, sort_key

_END_TIME = TraceRow.request_time + func.coalesce(TraceRow.execution_duration, 0)

#: Attribute keys that are columns of ``traces``: (column, numeric).
_COLUMNS: dict[str, tuple[SQLColumnExpression[Any], bool]] = {
    "request_id": (TraceRow.trace_id, False),
    "client_request_id": (TraceRow.client_request_id, False),
    "status": (TraceRow.state, False),
    "timestamp_ms": (TraceRow.request_time, True),
    "execution_time_ms": (TraceRow.execution_duration, True),
    "end_time_ms": (_END_TIME, True),
}
_SPAN_COLUMNS: dict[str, SQLColumnExpression[Any]] = {
    "name": TraceSpanRow.name,
    "type": TraceSpanRow.span_type,
    "status": TraceSpanRow.status,
}
#: Sort keys: (column, nullable).
_ORDER: dict[str, tuple[SQLColumnExpression[Any], bool]] = {
    "experiment_id": (TraceRow.experiment_id, False),
    "timestamp_ms": (TraceRow.request_time, False),
    "execution_time_ms": (TraceRow.execution_duration, True),
    "end_time_ms": (_END_TIME, False),
    "status": (TraceRow.state, False),
    "request_id": (TraceRow.trace_id, False),
    "client_request_id": (TraceRow.client_request_id, True),
}


def _keyed(table: Any, key: str, c: Comparison) -> ColumnElement[bool]:
    """EXISTS a (key, value) row of the trace that satisfies ``c``; for ``IS [NOT] NULL``,
    whether the trace has the key at all."""
    owner = table.trace_id == TraceRow.trace_id
    if c.op in ("IS NULL", "IS NOT NULL"):
        has_key = select(table.key).where(owner, table.key == key).exists()
        return not_(has_key) if c.op == "IS NULL" else has_key
    matches = compare(table.value, c.op, c.value, numeric=False)
    return select(table.key).where(owner, table.key == key, matches).exists()


def _run_matches(c: Comparison) -> ColumnElement[bool]:
    linked = compare(TraceRunLinkRow.run_id, c.op, c.value, numeric=False)
    return or_(
        _keyed(TraceMetadataRow, SOURCE_RUN_METADATA, c),
        select(TraceRunLinkRow.run_id)
        .where(TraceRunLinkRow.trace_id == TraceRow.trace_id, linked)
        .exists(),
    )


def _any_span(matches: ColumnElement[bool]) -> ColumnElement[bool]:
    """EXISTS a span of the trace that ``matches``."""
    owner = TraceSpanRow.trace_id == TraceRow.trace_id
    return select(TraceSpanRow.span_id).where(owner, matches).exists()


def _attribute(c: Comparison) -> ColumnElement[bool]:
    if c.key == "name":
        return _keyed(TraceTagRow, TRACE_NAME_TAG, c)
    if c.key == "run_id":
        return _run_matches(c)
    if c.key == "text":
        return _any_span(compare(TraceSpanRow.search_text, c.op, c.value, numeric=False))
    if c.key not in _COLUMNS:  # the grammar lets through only the keys above
        raise InvalidParameter("unsupported trace search key")
    column, numeric = _COLUMNS[c.key]
    return compare(column, c.op, c.value, numeric=numeric)


def condition(c: Comparison) -> ColumnElement[bool]:
    """The SQL condition of one clause of a trace filter."""
    if c.entity == "tag":
        return _keyed(TraceTagRow, c.key, c)
    if c.entity == "metadata":
        return _keyed(TraceMetadataRow, c.key, c)
    if c.entity == "span":
        return _any_span(compare(_SPAN_COLUMNS[c.key], c.op, c.value, numeric=False))
    return _attribute(c)


def ordering(order_by: Sequence[OrderBy]) -> list[UnaryExpression[Any]]:
    """ORDER BY terms: the given keys (newest first when none), then the trace id."""
    terms = []
    for item in order_by:
        if item.entity != "attribute" or item.key not in _ORDER:
            raise InvalidParameter("unsupported trace sort key")
        column, nullable = _ORDER[item.key]
        terms.append(sort_key(column, item.ascending, nullable=nullable))
    if not order_by:
        terms.append(sort_key(TraceRow.request_time, False, nullable=False))
    terms.append(sort_key(TraceRow.trace_id, True, nullable=False))
    return terms
