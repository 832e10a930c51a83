"""Compile parsed searches (``tracking._filters``) into SQLAlchemy selects.

Every user value reaches the database as a bound parameter; the SQL text depends
only on the shape of the search (entities, keys' kinds, comparators), never on the
values. Keys of metrics, params and tags are bound too. The caller applies offset
and limit; every order ends with a unique tie-break, so offset pages are stable.

Comparison semantics, the same on SQLite and PostgreSQL:

- ``=`` / ``!=`` are case-sensitive; ``LIKE`` is case-sensitive (SQLite: translated
  to ``GLOB``, whose matching is), ``ILIKE`` is case-insensitive (``lower()`` on
  SQLite covers ASCII letters only). In patterns ``%`` is any run, ``_`` one
  character and ``\\`` escapes the next character; runs of ``%`` are squeezed.
- A clause on a metric, param, tag or dataset matches when the run has a row for
  that key satisfying it: a run without the key never matches, ``!=`` included.
  ``IS NULL`` / ``IS NOT NULL`` on a param or tag ask whether it has that key at all.
  NaN metrics never match a numeric comparison; ±inf compare as infinities.
- Metric filters and sorts use ``latest_metrics`` (one row per run and key).
- ``datasets.context`` is the ``mlflow.data.context`` tag of a run input, read from
  the JSON array in ``run_inputs.tags`` (``json_each`` on SQLite,
  ``jsonb_array_elements`` on PostgreSQL).
- Sorting on a nullable column, a param or a tag puts NULLs last in both directions;
  sorting on a metric puts NaN values after the numbers, and runs without the metric
  after those, in both directions.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal

from sqlalchemy import (
    BigInteger,
    Boolean,
    ColumnElement,
    Float,
    Select,
    SQLColumnExpression,
    String,
    and_,
    case,
    cast,
    column,
    func,
    literal,
    not_,
    null,
    or_,
    select,
    true,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import aliased
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import UnaryExpression
from sqlalchemy.sql.selectable import ScalarSelect
from sqlalchemy.sql.visitors import InternalTraversal

from shamal.db.models import (
    DatasetRow,
    ExperimentRow,
    ExperimentTagRow,
    LatestMetricRow,
    LoggedModelParamRow,
    LoggedModelRow,
    LoggedModelTagRow,
    MetricRow,
    ParamRow,
    RunInputRow,
    RunRow,
    RunTagRow,
)
from shamal.errors import InvalidParameter
from shamal.tracking._filters import NULL_OPS, Comparison, DatasetFilter, Op, OrderBy

__all__ = [
    "compare",
    "experiments_query",
    "lifecycle_condition",
    "logged_models_query",
    "runs_query",
    "sort_key",
]

logger = logging.getLogger(__name__)

Lifecycle = Literal["active", "deleted", "all"]

DATASET_CONTEXT_TAG: Final = "mlflow.data.context"
_DOUBLE: Final = Float(precision=53)
_BINARY: Final[dict[Op, Callable[[Any, Any], ColumnElement[bool]]]] = {
    "=": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}


class _PerDialect(ColumnElement[bool]):
    """One boolean condition written two ways: for SQLite and for PostgreSQL (the default).

    Both spellings are ordinary SQLAlchemy expressions with bound parameters; the
    compiler picks one. Used where the two databases differ (case-sensitive LIKE,
    JSON arrays).
    """

    __visit_name__ = "shamal_per_dialect"
    _traverse_internals: Any = [
        ("sqlite", InternalTraversal.dp_clauseelement),
        ("default", InternalTraversal.dp_clauseelement),
    ]
    type = Boolean()
    _is_implicitly_boolean = True  # a predicate: no "= 1" where booleans are not native

    def __init__(self, *, sqlite: ColumnElement[bool], default: ColumnElement[bool]) -> None:
        self.sqlite = sqlite
        self.default = default

    @property
    def _from_objects(self) -> Any:
        return self.default._from_objects


@compiles(_PerDialect)
def _compile_default(element: _PerDialect, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(element.default, **kw)


@compiles(_PerDialect, "sqlite")
def _compile_sqlite(element: _PerDialect, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(element.sqlite, **kw)


def _pattern_parts(pattern: str) -> list[str]:
    """A LIKE pattern as tokens: ``"%"``, ``"_"`` or ``"\\x"`` (one literal character x).

    Consecutive ``%`` become one; a trailing lone backslash is a literal backslash.
    """
    parts: list[str] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            parts.append("\\" + (pattern[i + 1] if i + 1 < len(pattern) else "\\"))
            i += 2
            continue
        if ch == "%" and parts and parts[-1] == "%":
            i += 1
            continue
        parts.append(ch if ch in "%_" else "\\" + ch)
        i += 1
    return parts


def _like_pattern(parts: list[str]) -> str:
    """The pattern for ``LIKE ... ESCAPE '\\'``: only ``%``, ``_`` and ``\\`` stay escaped."""
    out: list[str] = []
    for part in parts:
        if part in ("%", "_") or part[1] in "%_\\":
            out.append(part)
        else:
            out.append(part[1])
    return "".join(out)


def _glob_pattern(parts: list[str]) -> str:
    """The same pattern for SQLite's case-sensitive ``GLOB``."""
    out: list[str] = []
    for part in parts:
        if part == "%":
            out.append("*")
        elif part == "_":
            out.append("?")
        elif part[1] in "*?[":
            out.append("[" + part[1] + "]")
        else:
            out.append(part[1])
    return "".join(out)


def _like(col: SQLColumnExpression[Any], pattern: str) -> ColumnElement[bool]:
    parts = _pattern_parts(pattern)
    return _PerDialect(
        sqlite=col.op("GLOB", is_comparison=True)(_glob_pattern(parts)),
        default=col.like(_like_pattern(parts), escape="\\"),
    )


def compare(
    col: SQLColumnExpression[Any], op: Op, value: str | float | tuple[str, ...], *, numeric: bool
) -> ColumnElement[bool]:
    """``col <op> value`` with the value bound; numbers are bound as doubles.

    For a numeric column, ``IN`` lists and a str value (an id) hold integers in decimal
    form, bound as integers. ``IS NULL`` / ``IS NOT NULL`` test the column itself.
    """
    if op == "IS NULL":
        return col.is_(None)
    if op == "IS NOT NULL":
        return col.is_not(None)
    if isinstance(value, tuple):
        items: list[Any] = [int(v) for v in value] if numeric else list(value)
        return col.in_(items) if op == "IN" else col.not_in(items)
    if op == "LIKE":
        return _like(col, str(value))
    if op == "ILIKE":
        return col.ilike(_like_pattern(_pattern_parts(str(value))), escape="\\")
    bound: ColumnElement[Any]
    if numeric and isinstance(value, str):
        bound = literal(int(value), BigInteger())
    elif numeric:
        bound = literal(float(value), _DOUBLE)
    else:
        bound = literal(str(value), String())
    return _BINARY[op](col, bound)


def lifecycle_condition(col: SQLColumnExpression[str], lifecycle: Lifecycle) -> ColumnElement[bool]:
    """The rows of a view: ``active``, ``deleted`` or ``all``.

    Raises:
        InvalidParameter: any other view.
    """
    if lifecycle == "all":
        return true()
    if lifecycle in ("active", "deleted"):
        return col == literal(lifecycle, String())
    raise InvalidParameter("Unknown view type.")


def sort_key(
    expr: SQLColumnExpression[Any], ascending: bool, *, nullable: bool
) -> UnaryExpression[Any]:
    """An ORDER BY term; NULLs last in both directions where the column can be NULL.

    NOT NULL columns get no NULLS LAST, so PostgreSQL can walk an index backwards.
    """
    term = expr.asc() if ascending else expr.desc()
    return term.nulls_last() if nullable else term


def _metric_matches(
    table: type[LatestMetricRow] | type[MetricRow], owner: ColumnElement[bool], c: Comparison
) -> ColumnElement[bool]:
    return (
        select(table.key)
        .where(owner, table.key == c.key, not_(table.is_nan))
        .where(compare(table.value, c.op, c.value, numeric=True))
        .exists()
    )


def _keyed_matches(
    table: type[Any], owner: ColumnElement[bool], c: Comparison
) -> ColumnElement[bool]:
    """EXISTS a (key, value) row of the owner whose value satisfies the comparison;
    for ``IS [NOT] NULL``, whether a row of that key exists at all."""
    if c.op in NULL_OPS:
        has_key = select(table.key).where(owner, table.key == c.key).exists()
        return not_(has_key) if c.op == "IS NULL" else has_key
    return (
        select(table.key)
        .where(owner, table.key == c.key, compare(table.value, c.op, c.value, numeric=False))
        .exists()
    )


def _input_context(c: Comparison) -> ColumnElement[bool]:
    """The run input's ``mlflow.data.context`` tag (JSON in ``run_inputs.tags``) matches."""
    lite = func.json_each(RunInputRow.tags).table_valued("value").alias("input_tag")
    lite_key = func.json_extract(lite.c.value, "$.key", type_=String)
    lite_value = func.json_extract(lite.c.value, "$.value", type_=String)
    pg = (
        func.jsonb_array_elements(cast(RunInputRow.tags, JSONB))
        .table_valued(column("value", JSONB))
        .alias("input_tag")
    )
    return _PerDialect(
        sqlite=select(lite.c.value)
        .select_from(lite)
        .where(lite_key == DATASET_CONTEXT_TAG, compare(lite_value, c.op, c.value, numeric=False))
        .exists(),
        default=select(pg.c.value)
        .select_from(pg)
        .where(
            pg.c.value["key"].astext == DATASET_CONTEXT_TAG,
            compare(pg.c.value["value"].astext, c.op, c.value, numeric=False),
        )
        .exists(),
    )


def _dataset_matches(c: Comparison) -> ColumnElement[bool]:
    if c.key == "context":
        condition = _input_context(c)
    else:
        condition = compare(getattr(DatasetRow, c.key), c.op, c.value, numeric=False)
    return (
        select(RunInputRow.run_id)
        .select_from(RunInputRow)
        .join(DatasetRow, DatasetRow.dataset_id == RunInputRow.dataset_id)
        .where(RunInputRow.run_id == RunRow.run_id, condition)
        .exists()
    )


_RUN_ATTRIBUTES: Final[dict[str, tuple[SQLColumnExpression[Any], bool]]] = {
    # key: (column, numeric)
    "run_id": (RunRow.run_id, False),
    "run_name": (RunRow.name, False),
    "status": (RunRow.status, False),
    "user_id": (RunRow.user_id, False),
    "artifact_uri": (RunRow.artifact_uri, False),
    "start_time": (RunRow.start_time, True),
    "end_time": (RunRow.end_time, True),
}


def _run_condition(c: Comparison) -> ColumnElement[bool]:
    if c.entity == "metric":
        return _metric_matches(LatestMetricRow, LatestMetricRow.run_id == RunRow.run_id, c)
    if c.entity == "param":
        return _keyed_matches(ParamRow, ParamRow.run_id == RunRow.run_id, c)
    if c.entity == "tag":
        return _keyed_matches(RunTagRow, RunTagRow.run_id == RunRow.run_id, c)
    if c.entity == "dataset":
        return _dataset_matches(c)
    col, numeric = _RUN_ATTRIBUTES[c.key]
    return compare(col, c.op, c.value, numeric=numeric)


def _run_order(
    stmt: Select[RunRow], order_by: Sequence[OrderBy]
) -> tuple[Select[RunRow], list[UnaryExpression[Any]]]:
    terms: list[UnaryExpression[Any]] = []
    for i, item in enumerate(order_by):
        if item.entity == "attribute":
            col, _ = _RUN_ATTRIBUTES[item.key]
            terms.append(sort_key(col, item.ascending, nullable=item.key == "end_time"))
            continue
        table = {"metric": LatestMetricRow, "param": ParamRow, "tag": RunTagRow}[item.entity]
        row: Any = aliased(table, name=f"sort_{i}")
        stmt = stmt.outerjoin(row, and_(row.run_id == RunRow.run_id, row.key == item.key))
        if item.entity != "metric":
            terms.append(sort_key(row.value, item.ascending, nullable=True))
            continue
        # Numbers first in the asked order, then NaN, then runs without the metric, in
        # either direction: a stock server's order.
        terms.append(case((row.run_id.is_(None), 2), (row.is_nan, 1), else_=0).asc())
        value = case((row.is_nan, null()), else_=row.value)
        terms.append(sort_key(value, item.ascending, nullable=True))
    return stmt, terms


def runs_query(
    experiment_ids: Sequence[int],
    filters: list[Comparison],
    order_by: list[OrderBy],
    lifecycle: Lifecycle,
) -> Select[RunRow]:
    """The runs of the experiments that match every filter, in the requested order.

    Default order ``start_time DESC, run_id ASC``; an explicit order is followed by
    ``start_time DESC`` and ``run_id ASC`` as tie-breaks (unless it sorts on them).

    Raises:
        InvalidParameter: an unknown lifecycle view.
    """
    stmt = select(RunRow).where(
        RunRow.experiment_id.in_([int(e) for e in experiment_ids]),
        lifecycle_condition(RunRow.lifecycle_stage, lifecycle),
        *(_run_condition(c) for c in filters),
    )
    stmt, terms = _run_order(stmt, order_by)
    sorted_on = {o.key for o in order_by if o.entity == "attribute"}
    if "run_id" not in sorted_on:
        if "start_time" not in sorted_on:
            terms.append(RunRow.start_time.desc())
        terms.append(RunRow.run_id.asc())
    return stmt.order_by(*terms)


_EXPERIMENT_ATTRIBUTES: Final[dict[str, tuple[SQLColumnExpression[Any], bool]]] = {
    "name": (ExperimentRow.name, False),
    "experiment_id": (ExperimentRow.experiment_id, True),
    "creation_time": (ExperimentRow.creation_time, True),
    "last_update_time": (ExperimentRow.last_update_time, True),
}


def _experiment_condition(c: Comparison) -> ColumnElement[bool]:
    if c.entity == "tag":
        owner = ExperimentTagRow.experiment_id == ExperimentRow.experiment_id
        return _keyed_matches(ExperimentTagRow, owner, c)
    col, numeric = _EXPERIMENT_ATTRIBUTES[c.key]
    return compare(col, c.op, c.value, numeric=numeric)


def experiments_query(
    filters: list[Comparison], order_by: list[OrderBy], lifecycle: Lifecycle
) -> Select[ExperimentRow]:
    """The experiments of the view that match every filter.

    Default order ``creation_time DESC``; every order ends with ``experiment_id DESC``
    (the tie-break of the MLflow contract) unless it sorts on ``experiment_id``.

    Raises:
        InvalidParameter: an unknown lifecycle view.
    """
    stmt = select(ExperimentRow).where(
        lifecycle_condition(ExperimentRow.lifecycle_stage, lifecycle),
        *(_experiment_condition(c) for c in filters),
    )
    items = order_by or [OrderBy("attribute", "creation_time", ascending=False)]
    terms = [sort_key(_EXPERIMENT_ATTRIBUTES[o.key][0], o.ascending, nullable=False) for o in items]
    if all(o.key != "experiment_id" for o in items):
        terms.append(ExperimentRow.experiment_id.desc())
    return stmt.order_by(*terms)


_MODEL_ATTRIBUTES: Final[dict[str, tuple[SQLColumnExpression[Any], bool]]] = {
    "name": (LoggedModelRow.name, False),
    "model_id": (LoggedModelRow.model_id, False),
    # Compared as text, as a stock server does (LIKE '1%' works); the search is already
    # narrowed to the listed experiments by the integer column.
    "experiment_id": (cast(LoggedModelRow.experiment_id, String()), False),
    "lifecycle_stage": (LoggedModelRow.lifecycle_stage, False),
    "model_type": (LoggedModelRow.model_type, False),
    "status": (LoggedModelRow.status, False),
    "source_run_id": (LoggedModelRow.source_run_id, False),
    "status_message": (LoggedModelRow.status_message, False),
    "artifact_location": (LoggedModelRow.artifact_location, False),
    "creation_timestamp": (LoggedModelRow.creation_timestamp_ms, True),
    "last_updated_timestamp": (LoggedModelRow.last_updated_timestamp_ms, True),
}


_MODEL_SORT_COLUMNS: Final[dict[str, tuple[SQLColumnExpression[Any], bool]]] = {
    # key: (column, nullable)
    "name": (LoggedModelRow.name, False),
    "model_id": (LoggedModelRow.model_id, False),
    "experiment_id": (LoggedModelRow.experiment_id, False),
    "creation_timestamp": (LoggedModelRow.creation_timestamp_ms, False),
    "last_updated_timestamp": (LoggedModelRow.last_updated_timestamp_ms, False),
    "status": (LoggedModelRow.status, False),
    "artifact_location": (LoggedModelRow.artifact_location, False),
    "lifecycle_stage": (LoggedModelRow.lifecycle_stage, False),
    "model_type": (LoggedModelRow.model_type, True),
    "source_run_id": (LoggedModelRow.source_run_id, True),
    "status_message": (LoggedModelRow.status_message, True),
}


def _on_datasets(datasets: Sequence[DatasetFilter]) -> ColumnElement[bool]:
    """The metric point was logged against one of the datasets (by name, and digest if given)."""
    return or_(
        *(
            and_(
                MetricRow.dataset_name == literal(d.name, String()),
                true()
                if d.digest is None
                else MetricRow.dataset_digest == literal(d.digest, String()),
            )
            for d in datasets
        )
    )


def _logged_model_condition(
    c: Comparison, datasets: Sequence[DatasetFilter]
) -> ColumnElement[bool]:
    if c.entity == "metric":
        # Any logged value of the key for this model (metrics rows carry model_id), among
        # the points of the searched datasets when the search names some.
        owner = MetricRow.model_id == LoggedModelRow.model_id
        if datasets:
            owner = and_(owner, _on_datasets(datasets))
        return _metric_matches(MetricRow, owner, c)
    if c.entity == "param":
        owner = LoggedModelParamRow.model_id == LoggedModelRow.model_id
        return _keyed_matches(LoggedModelParamRow, owner, c)
    if c.entity == "tag":
        owner = LoggedModelTagRow.model_id == LoggedModelRow.model_id
        return _keyed_matches(LoggedModelTagRow, owner, c)
    col, numeric = _MODEL_ATTRIBUTES[c.key]
    return compare(col, c.op, c.value, numeric=numeric)


def _has_metrics_on(datasets: Sequence[DatasetFilter]) -> ColumnElement[bool]:
    return (
        select(MetricRow.key)
        .where(MetricRow.model_id == LoggedModelRow.model_id, _on_datasets(datasets))
        .exists()
    )


def _latest_model_metric(item: OrderBy) -> ScalarSelect[Any]:
    """The model's latest value of the item's metric: the point with the newest timestamp,
    then the highest step, then the first run id (MLflow's rule), among the points of the
    item's dataset when it names one. NULL when the model has none, or when it is NaN.

    A scalar subquery per model, which ``ix_metrics_model_key`` (model_id, key) serves.
    """
    query = select(case((MetricRow.is_nan, null()), else_=MetricRow.value)).where(
        MetricRow.model_id == LoggedModelRow.model_id,
        MetricRow.key == literal(item.key, String()),
    )
    if item.dataset_name is not None:
        query = query.where(MetricRow.dataset_name == literal(item.dataset_name, String()))
    if item.dataset_digest is not None:
        query = query.where(MetricRow.dataset_digest == literal(item.dataset_digest, String()))
    newest = (MetricRow.timestamp.desc(), MetricRow.step.desc(), MetricRow.run_id.asc())
    return query.order_by(*newest, MetricRow.value.desc()).limit(1).scalar_subquery()


def logged_models_query(
    experiment_ids: Sequence[int],
    filters: list[Comparison],
    order_by: list[OrderBy],
    datasets: Sequence[DatasetFilter] = (),
) -> Select[LoggedModelRow]:
    """The active logged models of the experiments that match every filter.

    A metric clause matches when any logged value of that key for the model (a
    ``metrics`` row with its ``model_id``) satisfies it. With ``datasets``, as on a stock
    server, only the points logged against one of them count for the metric clauses, and
    a search without metric clauses keeps the models with any metric logged against one
    of them. A metric sort key sorts on the
    model's latest value of it (see :func:`_latest_model_metric`); models without one
    come last in both directions. As on a stock server, every order is followed by
    ``creation_timestamp DESC`` and ``model_id ASC`` (unless it sorts on them), so the
    default order is newest first.
    """
    conditions = [_logged_model_condition(c, datasets) for c in filters]
    if datasets and all(c.entity != "metric" for c in filters):
        conditions.append(_has_metrics_on(datasets))
    stmt = select(LoggedModelRow).where(
        LoggedModelRow.experiment_id.in_([int(e) for e in experiment_ids]),
        LoggedModelRow.lifecycle_stage == literal("active", String()),
        *conditions,
    )
    terms: list[UnaryExpression[Any]] = []
    for o in order_by:
        if o.entity == "metric":
            terms.append(sort_key(_latest_model_metric(o), o.ascending, nullable=True))
        else:
            col, nullable = _MODEL_SORT_COLUMNS[o.key]
            terms.append(sort_key(col, o.ascending, nullable=nullable))
    sorted_on = {o.key for o in order_by if o.entity == "attribute"}
    if "creation_timestamp" not in sorted_on:
        terms.append(LoggedModelRow.creation_timestamp_ms.desc())
    if "model_id" not in sorted_on:
        terms.append(LoggedModelRow.model_id.asc())
    return stmt.order_by(*terms)
