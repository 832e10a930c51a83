"""SQL access for experiments, runs and their data, and logged models (MLflow 3). ORM rows never
leave this module."""

from __future__ import annotations

import json
import math
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    Select,
    String,
    any_,
    bindparam,
    delete,
    func,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session
from sqlalchemy.sql.expression import ClauseElement

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
    RunModelLinkRow,
    RunRow,
    RunTagRow,
)
from shamal.errors import AlreadyExists, InvalidParameter, NotFound
from shamal.tracking._entities import (
    Dataset,
    DatasetInput,
    Experiment,
    HistoryRow,
    LoggedModel,
    LoggedModelSpec,
    Metric,
    Run,
    RunInfo,
)
from shamal.tracking._prepared import PreparedStatement, Row
from shamal.tracking._sampling import sampled_positions

ARTIFACT_SCHEME = "mlflow-artifacts:/"


#: How many params and tags one object may hold (their sizes: see ``_service``). MLflow sets
#: no such counts; these leave room for every real use we know of (a sweep's config
#: flattened into params, a CI's tags) and bound what one run costs each search page. Writers
#: take the object's row before they count (:func:`_lock_counted`), so none passes a limit.
MAX_PARAMS_PER_RUN = 2_000
MAX_TAGS_PER_RUN = 1_000
MAX_TAGS_PER_EXPERIMENT = 1_000


def _check_count(
    s: Session, table: Any, where: ColumnElement[bool], limit: int, what: str, owner: str
) -> None:
    """Raise InvalidParameter (the transaction then rolls back) when the object holds more
    than ``limit`` rows of ``table`` after a write."""
    _refuse_over(
        s.scalar(select(func.count()).select_from(table).where(where)) or 0, limit, what, owner
    )


def _lock_counted(s: Session, key: Any, value: str | int) -> None:
    """Take the row of the object whose rows a write adds and counts (``key == value``), so
    that writers at its limit count one after another and none passes it: FOR NO KEY UPDATE
    on PostgreSQL (rows that point at the object may still be added meanwhile), nothing on
    SQLite, where writers take turns already."""
    s.execute(select(key).where(key == value).with_for_update(key_share=True))


def _refuse_over(count: int, limit: int, what: str, owner: str) -> None:
    if count > limit:
        raise InvalidParameter(
            f"A {owner} may have at most {limit} {what}; this request would make it {count}."
        )


def _insert(s: Session, table: Any) -> Any:
    """The dialect's INSERT, which knows ON CONFLICT."""
    return _dialect_insert(s.get_bind().dialect.name, table)


def _dialect_insert(dialect: str, table: Any) -> Any:
    if dialect == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


# ---------------------------------------------------------------------- experiments
def _experiment(row: ExperimentRow, tags: Mapping[str, str]) -> Experiment:
    return Experiment(
        experiment_id=str(row.experiment_id),
        name=row.name,
        artifact_location=row.artifact_location,
        lifecycle_stage=row.lifecycle_stage,
        creation_time=row.creation_time,
        last_update_time=row.last_update_time,
        tags=dict(tags),
        team_id=row.team_id,
    )


def _experiment_tags(s: Session, ids: Sequence[int]) -> dict[int, dict[str, str]]:
    tags: dict[int, dict[str, str]] = defaultdict(dict)
    if ids:
        rows = s.execute(
            select(
                ExperimentTagRow.experiment_id, ExperimentTagRow.key, ExperimentTagRow.value
            ).where(ExperimentTagRow.experiment_id.in_(list(ids)))
        )
        for eid, key, value in rows:
            tags[eid][key] = value
    return tags


def insert_experiment(
    s: Session, name: str, tags: Mapping[str, str], team_id: str | None, now: int
) -> Experiment:
    if s.scalar(select(ExperimentRow.experiment_id).where(ExperimentRow.name == name)) is not None:
        # A stock server's words (a concurrent create still loses on the unique constraint).
        raise AlreadyExists(f"Experiment(name={name}) already exists.")
    row = ExperimentRow(
        name=name,
        artifact_location="",
        lifecycle_stage="active",
        creation_time=now,
        last_update_time=now,
        team_id=team_id,
    )
    s.add(row)
    s.flush()
    row.artifact_location = f"{ARTIFACT_SCHEME}{row.experiment_id}"
    _refuse_over(len(tags), MAX_TAGS_PER_EXPERIMENT, "tags", "experiment")
    for key, value in tags.items():
        s.add(ExperimentTagRow(experiment_id=row.experiment_id, key=key, value=value))
    s.flush()
    return _experiment(row, tags)


def parse_experiment_id(value: str) -> int:
    """The integer an experiment id stands for.

    Raises:
        InvalidParameter: not an integer ("abc", "1.5"), as a stock server answers.
        NotFound: an integer no experiment can have (negative, over 18 digits).
    """
    digits = value.removeprefix("-")
    if not digits.isascii() or not digits.isdigit():
        raise InvalidParameter(
            f"Invalid experiment ID '{value[:40]}'. Experiment ID must be a valid integer."
        )
    if digits != value or len(digits) > 18:
        raise NotFound(f"No Experiment with id={value[:40]} exists")
    return int(value)


def _experiment_row(s: Session, experiment_id: str, *, lock: bool = False) -> ExperimentRow:
    row = s.get(ExperimentRow, parse_experiment_id(experiment_id), with_for_update=lock)
    if row is None:
        raise NotFound(f"No Experiment with id={experiment_id} exists")
    return row


def get_experiment(s: Session, experiment_id: str) -> Experiment:
    row = _experiment_row(s, experiment_id)
    return _experiment(row, _experiment_tags(s, [row.experiment_id])[row.experiment_id])


def get_experiment_by_name(s: Session, name: str) -> Experiment:
    row = s.scalar(select(ExperimentRow).where(ExperimentRow.name == name))
    if row is None:
        raise NotFound(f"Could not find experiment with name '{name}'")
    return _experiment(row, _experiment_tags(s, [row.experiment_id])[row.experiment_id])


def visible_experiments(query: Select[Any], team_ids: list[str] | None) -> Select[Any]:
    """Only experiments without a team or of the given teams (None: no restriction)."""
    if team_ids is None:
        return query
    return query.where(ExperimentRow.team_id.is_(None) | ExperimentRow.team_id.in_(team_ids))


def readable_experiment_ids(
    s: Session, experiment_ids: Sequence[int], team_ids: list[str] | None
) -> list[int]:
    """Those of ``experiment_ids`` that exist and are visible to ``team_ids`` (see
    :func:`visible_experiments`), in the order given."""
    if not experiment_ids:
        return []
    query = select(ExperimentRow.experiment_id).where(
        ExperimentRow.experiment_id.in_(list(experiment_ids))
    )
    found = set(s.scalars(visible_experiments(query, team_ids)))
    return [e for e in experiment_ids if e in found]


def page_of_experiments(
    s: Session, query: Select[Any], offset: int, limit: int
) -> list[Experiment]:
    rows = list(s.scalars(query.offset(offset).limit(limit)))
    tags = _experiment_tags(s, [r.experiment_id for r in rows])
    return [_experiment(r, tags[r.experiment_id]) for r in rows]


def update_experiment(
    s: Session,
    experiment_id: str,
    *,
    name: str | None = None,
    stage: str | None = None,
    now: int,
) -> None:
    row = _experiment_row(s, experiment_id, lock=True)
    if name is not None:
        row.name = name
    if stage is not None:
        row.lifecycle_stage = stage
        s.execute(
            update(RunRow)
            .where(RunRow.experiment_id == row.experiment_id)
            .values(lifecycle_stage=stage, deleted_time=now if stage == "deleted" else None)
        )
    row.last_update_time = now
    s.flush()


def set_experiment_tag(s: Session, experiment_id: str, key: str, value: str | None) -> None:
    """Set a tag (``value`` None: delete it).

    Raises:
        NotFound: no such experiment; deleting a tag the experiment does not have.
    """
    row = _experiment_row(s, experiment_id)
    _lock_counted(s, ExperimentRow.experiment_id, row.experiment_id)
    result = s.execute(
        delete(ExperimentTagRow).where(
            ExperimentTagRow.experiment_id == row.experiment_id, ExperimentTagRow.key == key
        )
    )
    if value is None and not getattr(result, "rowcount", 0):
        raise NotFound(f"No tag with name: {key} in experiment with id {experiment_id}")
    if value is not None:
        s.add(ExperimentTagRow(experiment_id=row.experiment_id, key=key, value=value))
        s.flush()
        _check_count(
            s,
            ExperimentTagRow,
            ExperimentTagRow.experiment_id == row.experiment_id,
            MAX_TAGS_PER_EXPERIMENT,
            "tags",
            "experiment",
        )
    s.flush()


# ---------------------------------------------------------------------- runs
def _info(row: RunRow) -> RunInfo:
    return RunInfo(
        run_id=row.run_id,
        experiment_id=str(row.experiment_id),
        run_name=row.name,
        user_id=row.user_id,
        status=row.status,
        start_time=row.start_time,
        end_time=row.end_time,
        artifact_uri=row.artifact_uri,
        lifecycle_stage=row.lifecycle_stage,
    )


def insert_run(
    s: Session,
    experiment_id: str,
    name: str,
    user_id: str,
    start_time: int,
    tags: Mapping[str, str],
) -> RunInfo:
    exp = _experiment_row(s, experiment_id)
    if exp.lifecycle_stage != "active":
        raise InvalidParameter(f"The experiment {experiment_id} must be in the 'active' state.")
    run_id = uuid.uuid4().hex
    row = RunRow(
        run_id=run_id,
        experiment_id=exp.experiment_id,
        name=name,
        user_id=user_id,
        status="RUNNING",
        start_time=start_time,
        end_time=None,
        lifecycle_stage="active",
        artifact_uri=f"{exp.artifact_location}/{run_id}/artifacts",
    )
    s.add(row)
    s.flush()
    _refuse_over(len(tags), MAX_TAGS_PER_RUN, "tags", "run")
    if tags:
        s.execute(
            _insert(s, RunTagRow),
            [{"run_id": run_id, "key": k, "value": v} for k, v in tags.items()],
        )
    return _info(row)


def run_row(s: Session, run_id: str, *, lock: bool = False) -> tuple[RunInfo, str | None]:
    """The run's info and its experiment's team (for the access check)."""
    if not run_id or len(run_id) > 64:
        raise NotFound(f"Run with id={run_id[:64]} not found")
    query = (
        select(RunRow, ExperimentRow.team_id)
        .join(ExperimentRow, ExperimentRow.experiment_id == RunRow.experiment_id)
        .where(RunRow.run_id == run_id)
    )
    if lock:
        query = query.with_for_update(of=RunRow)
    found = s.execute(query).first()
    if found is None:
        raise NotFound(f"Run with id={run_id} not found")
    return _info(found[0]), found[1]


def _run_access_query(_dialect: str) -> ClauseElement:
    return (
        select(RunRow.lifecycle_stage, ExperimentRow.team_id)
        .join(ExperimentRow, ExperimentRow.experiment_id == RunRow.experiment_id)
        .where(RunRow.run_id == bindparam("run_id"))
    )


_RUN_ACCESS = PreparedStatement(_run_access_query, ["run_id"])


def run_access(s: Session, run_id: str) -> tuple[str, str | None]:
    """The run's lifecycle stage and its experiment's team: what logging to it checks."""
    if not run_id or len(run_id) > 64:
        raise NotFound(f"Run with id={run_id[:64]} not found")
    found = _RUN_ACCESS.execute(s.connection(), [(run_id,)]).first()
    if found is None:
        raise NotFound(f"Run with id={run_id} not found")
    stage, team_id = tuple(found)
    return stage, team_id


def update_run(s: Session, run_id: str, values: Mapping[str, Any]) -> RunInfo:
    s.execute(update(RunRow).where(RunRow.run_id == run_id).values(**values))
    return run_row(s, run_id)[0]


def _among_runs(s: Session, column: Any, run_ids: Sequence[str]) -> ColumnElement[bool]:
    """``column IN run_ids``. On PostgreSQL as ``= ANY`` of one array parameter, not one
    parameter per id: for a 1,000-run page the statement stays short, so the driver caches
    it instead of parsing a thousand placeholders on every call (4 ms less a query)."""
    if s.get_bind().dialect.name == "postgresql":
        ids = bindparam(None, list(run_ids), type_=postgresql.ARRAY(String()))
        return cast(ColumnElement[bool], column == any_(ids))
    return cast(ColumnElement[bool], column.in_(list(run_ids)))


def runs_with_data(s: Session, rows: Sequence[RunRow]) -> list[Run]:
    """Whole runs for a page of rows: a handful of queries, not one per run, reading plain
    rows (no ORM objects: a 1,000-run page has thousands of metrics, params and tags)."""
    ids = [r.run_id for r in rows]
    if not ids:
        return []
    metrics: dict[str, list[Metric]] = defaultdict(list)
    latest = LatestMetricRow
    for run_id, key, number, is_nan, timestamp, step in s.execute(
        select(
            latest.run_id, latest.key, latest.value, latest.is_nan, latest.timestamp, latest.step
        ).where(_among_runs(s, latest.run_id, ids))
    ):
        metrics[run_id].append(Metric(key, math.nan if is_nan else number, timestamp, step))
    params: dict[str, dict[str, str]] = defaultdict(dict)
    for run_id, key, value in s.execute(
        select(ParamRow.run_id, ParamRow.key, ParamRow.value).where(
            _among_runs(s, ParamRow.run_id, ids)
        )
    ):
        params[run_id][key] = value
    tags: dict[str, dict[str, str]] = defaultdict(dict)
    for run_id, key, value in s.execute(
        select(RunTagRow.run_id, RunTagRow.key, RunTagRow.value).where(
            _among_runs(s, RunTagRow.run_id, ids)
        )
    ):
        tags[run_id][key] = value
    inputs = _dataset_inputs(s, ids)
    links = _model_links(s, ids)
    return [
        Run(
            info=_info(r),
            metrics=tuple(sorted(metrics[r.run_id], key=lambda m: m.key)),
            params=params[r.run_id],
            tags=tags[r.run_id],
            dataset_inputs=tuple(inputs[r.run_id]),
            model_inputs=tuple(m for m, d, _ in links[r.run_id] if d == "input"),
            model_outputs=tuple((m, step) for m, d, step in links[r.run_id] if d == "output"),
        )
        for r in rows
    ]


def get_run(s: Session, run_id: str) -> Run:
    row = s.get(RunRow, run_id) if run_id and len(run_id) <= 64 else None
    if row is None:
        raise NotFound(f"Run with id={run_id[:64]} not found")
    return runs_with_data(s, [row])[0]


def page_of_runs(s: Session, query: Select[Any], offset: int, limit: int) -> list[Run]:
    return runs_with_data(s, list(s.scalars(query.offset(offset).limit(limit))))


# ---------------------------------------------------------------------- logging
def log_params(s: Session, run_id: str, params: Sequence[tuple[str, str]]) -> None:
    """Params are write-once: the same value again is a no-op, another value a 400."""
    if not params:
        return
    wanted: dict[str, str] = {}
    for key, value in params:
        if wanted.setdefault(key, value) != value:
            raise InvalidParameter(f"Duplicate parameter key '{key}' with different values.")
    _lock_counted(s, RunRow.run_id, run_id)
    query = select(ParamRow.key, ParamRow.value).where(
        ParamRow.run_id == run_id, ParamRow.key.in_(list(wanted))
    )
    existing: dict[str, str] = {row.key: row.value for row in s.execute(query)}
    for key, old in existing.items():
        if old != wanted[key]:
            raise InvalidParameter(
                f"Changing param values is not allowed. Param with key='{key}' was already "
                f"logged with value='{old[:100]}' for run ID='{run_id}'. Attempted logging "
                f"new value '{wanted[key][:100]}'."
            )
    fresh = [
        {"run_id": run_id, "key": k, "value": v} for k, v in wanted.items() if k not in existing
    ]
    if fresh:
        s.execute(_insert(s, ParamRow).on_conflict_do_nothing(), fresh)
        _check_count(s, ParamRow, ParamRow.run_id == run_id, MAX_PARAMS_PER_RUN, "params", "run")


def set_tags(s: Session, run_id: str, tags: Sequence[tuple[str, str]]) -> None:
    """Tags overwrite; the last value of a key in one call wins."""
    latest = dict(tags)
    if not latest:
        return
    _lock_counted(s, RunRow.run_id, run_id)
    stmt = _insert(s, RunTagRow)
    stmt = stmt.on_conflict_do_update(
        index_elements=["run_id", "key"], set_={"value": stmt.excluded.value}
    )
    s.execute(stmt, [{"run_id": run_id, "key": k, "value": v} for k, v in latest.items()])
    _check_count(s, RunTagRow, RunTagRow.run_id == run_id, MAX_TAGS_PER_RUN, "tags", "run")


def delete_tag(s: Session, run_id: str, key: str) -> None:
    result = s.execute(delete(RunTagRow).where(RunTagRow.run_id == run_id, RunTagRow.key == key))
    if not getattr(result, "rowcount", 0):
        raise NotFound(f"No tag with name: {key} in run with id {run_id}")


_METRIC_COLUMNS = (
    "run_id",
    "key",
    "step",
    "timestamp",
    "value",
    "is_nan",
    "model_id",
    "dataset_name",
    "dataset_digest",
)
# A point without its links to a model and a dataset: the columns of latest_metrics too.
_POINT_COLUMNS = _METRIC_COLUMNS[:6]


def _append_points(columns: Sequence[str]) -> Callable[[str], ClauseElement]:
    def build(dialect: str) -> ClauseElement:
        stmt = _dialect_insert(dialect, MetricRow.__table__)
        values: dict[str, Any] = {c: bindparam(c) for c in columns}
        appended: ClauseElement = stmt.values(values).on_conflict_do_nothing()
        return appended

    return build


def _move_latest(dialect: str) -> ClauseElement:
    stmt = _dialect_insert(dialect, LatestMetricRow.__table__)
    target = LatestMetricRow.__table__.c
    moved: ClauseElement = stmt.values(
        {c: bindparam(c) for c in _POINT_COLUMNS}
    ).on_conflict_do_update(
        index_elements=["run_id", "key"],
        set_={c: stmt.excluded[c] for c in ("step", "timestamp", "value", "is_nan")},
        where=tuple_(stmt.excluded.step, stmt.excluded.timestamp, stmt.excluded.value)
        > tuple_(target.step, target.timestamp, target.value),
    )
    return moved


_APPEND_POINTS = PreparedStatement(_append_points(_METRIC_COLUMNS), _METRIC_COLUMNS)
# Most batches name no model and no dataset: binding three NULLs a point costs SQLite about a
# third more per row than leaving the columns to their default.
_APPEND_PLAIN_POINTS = PreparedStatement(_append_points(_POINT_COLUMNS), _POINT_COLUMNS)
_MOVE_LATEST = PreparedStatement(_move_latest, _POINT_COLUMNS)


def log_metrics(s: Session, run_id: str, metrics: Sequence[Metric]) -> None:
    """Append points (an identical point again is a no-op) and move each key's latest value.

    A NaN is stored as value 0.0 with ``is_nan`` set (SQLite keeps no NaN); the latest
    point of a key is the greatest (step, timestamp, value) of that stored form.
    """
    if not metrics:
        return
    points: list[Row] = []  # (run_id, key, step, timestamp, value, is_nan)
    linked = False  # whether any point names a model or a dataset
    newest: dict[str, Row] = {}  # one candidate per key: an upsert may not touch a row twice
    for m in metrics:
        nan = math.isnan(m.value)
        value = 0.0 if nan else m.value
        point = (run_id, m.key, m.step, m.timestamp, value, nan)
        points.append(point)
        if not linked:
            linked = (m.model_id, m.dataset_name, m.dataset_digest) != (None, None, None)
        best = newest.get(m.key)
        if best is None or (m.step, m.timestamp, value) > (best[2], best[3], best[4]):
            newest[m.key] = point
    connection = s.connection()
    if linked:
        links = [(m.model_id, m.dataset_name, m.dataset_digest) for m in metrics]
        _APPEND_POINTS.execute(connection, [p + ln for p, ln in zip(points, links, strict=True)])
    else:
        _APPEND_PLAIN_POINTS.execute(connection, points)
    _MOVE_LATEST.execute(connection, list(newest.values()))


_HISTORY_ORDER = (MetricRow.step, MetricRow.timestamp, MetricRow.value, MetricRow.is_nan)


def _history_query(after: bool) -> Callable[[str], ClauseElement]:
    def build(_dialect: str) -> ClauseElement:
        query = select(*_HISTORY_ORDER).where(
            MetricRow.run_id == bindparam("run_id"), MetricRow.key == bindparam("key")
        )
        if after:
            # Keyset paging on the primary key's order: a page costs its own rows,
            # wherever it starts (an OFFSET walks every point before it).
            query = query.where(
                tuple_(*_HISTORY_ORDER)
                > tuple_(
                    bindparam("step"), bindparam("timestamp"), bindparam("value"), bindparam("nan")
                )
            )
        # SQLite's compiler gives a bound LIMIT an OFFSET parameter of its own; binding that
        # OFFSET here (always 0) keeps one parameter list on both dialects.
        return query.order_by(*_HISTORY_ORDER).limit(bindparam("limit")).offset(bindparam("offset"))

    return build


_HISTORY_FIRST = PreparedStatement(
    _history_query(after=False), ["run_id", "key", "limit", "offset"]
)
_HISTORY_AFTER = PreparedStatement(
    _history_query(after=True),
    ["run_id", "key", "step", "timestamp", "value", "nan", "limit", "offset"],
)


def metric_history(
    s: Session, run_id: str, key: str, after: HistoryRow | None, limit: int
) -> list[HistoryRow]:
    """Up to ``limit`` points of a metric after the point ``after`` (from the first when
    None), in (step, timestamp, value, is_nan) order: the primary key's, so the read is one
    index range. Plain driver rows; see :data:`HistoryRow`.
    """
    connection = s.connection()
    if after is None:
        result = _HISTORY_FIRST.execute(connection, [(run_id, key, limit, 0)])
    else:
        step, timestamp, value, nan = after
        result = _HISTORY_AFTER.execute(
            connection, [(run_id, key, step, timestamp, value, bool(nan), limit, 0)]
        )
    try:
        return cast("list[HistoryRow]", result.cursor.fetchall())
    finally:
        result.close()


def metric_points(
    s: Session, run_id: str, key: str, first: int | None, last: int | None
) -> list[tuple[int, float]]:
    """Every non-NaN point of a metric with ``first <= step <= last`` (either bound may be
    None), as plain driver rows ``(step, value)`` in (step, timestamp) order: one range of
    the primary key, two columns only (a chart's read of a million points)."""
    query = select(MetricRow.step, MetricRow.value).where(
        MetricRow.run_id == run_id, MetricRow.key == key, MetricRow.is_nan.is_(False)
    )
    if first is not None:
        query = query.where(MetricRow.step >= first)
    if last is not None:
        query = query.where(MetricRow.step <= last)
    order = query.order_by(MetricRow.step, MetricRow.timestamp, MetricRow.value)
    result = s.connection().execute(order)
    try:
        return cast("list[tuple[int, float]]", result.cursor.fetchall())
    finally:
        result.close()


def sampled_metric_history(
    s: Session, run_id: str, key: str, steps: tuple[int, int] | None, max_results: int
) -> list[Metric]:
    """The points of one run's metric that a sampled read keeps (see
    :func:`~shamal.tracking._sampling.sampled_positions`), between ``steps`` (inclusive) when
    given, in (step, timestamp, value, is-NaN) order: the primary key's."""
    where = [MetricRow.run_id == run_id, MetricRow.key == key]
    if steps is not None:
        where += [MetricRow.step >= steps[0], MetricRow.step <= steps[1]]
    order = (MetricRow.step, MetricRow.timestamp, MetricRow.value, MetricRow.is_nan)
    columns = (MetricRow.step, MetricRow.timestamp, MetricRow.value, MetricRow.is_nan)
    total = s.scalar(select(func.count()).select_from(MetricRow).where(*where)) or 0
    positions = sampled_positions(total, max_results)
    if len(positions) == total:  # every point: no need to number them
        rows = s.execute(select(*columns).where(*where).order_by(*order)).all()
    else:
        numbered = (
            select(*columns, (func.row_number().over(order_by=order) - 1).label("position"))
            .where(*where)
            .subquery()
        )
        rows = s.execute(
            select(numbered.c.step, numbered.c.timestamp, numbered.c.value, numbered.c.is_nan)
            .where(numbered.c.position.in_(positions))
            .order_by(numbered.c.position)
        ).all()
    return [
        Metric(key, math.nan if nan else value, ts, step, run_id=run_id)
        for step, ts, value, nan in rows
    ]


# ---------------------------------------------------------------------- inputs and outputs
def _dataset_inputs(s: Session, run_ids: Sequence[str]) -> dict[str, list[DatasetInput]]:
    found: dict[str, list[DatasetInput]] = defaultdict(list)
    rows = s.execute(
        select(RunInputRow.run_id, RunInputRow.tags, DatasetRow)
        .join(DatasetRow, DatasetRow.dataset_id == RunInputRow.dataset_id)
        .where(_among_runs(s, RunInputRow.run_id, run_ids))
    )
    for run_id, tags, d in rows:
        dataset = Dataset(d.name, d.digest, d.source_type, d.source, d.schema, d.profile)
        pairs = tuple((t["key"], t["value"]) for t in json.loads(tags))
        found[run_id].append(DatasetInput(dataset, pairs))
    return found


#: The context tag of a run's dataset input ("training", "eval"), as MLflow names it.
DATASET_CONTEXT_TAG = "mlflow.data.context"


def dataset_summaries(
    s: Session, experiment_ids: Sequence[int], limit: int
) -> list[tuple[str, str, str, str | None]]:
    """(experiment id, name, digest, context) of the datasets the runs of these experiments
    read, each once, at most ``limit``: what MLflow's UI lists to filter runs by dataset."""
    if not experiment_ids:
        return []
    rows = s.execute(
        select(DatasetRow.experiment_id, DatasetRow.name, DatasetRow.digest, RunInputRow.tags)
        .join(RunInputRow, RunInputRow.dataset_id == DatasetRow.dataset_id)
        .where(DatasetRow.experiment_id.in_(experiment_ids))
        .order_by(DatasetRow.experiment_id, DatasetRow.name, DatasetRow.digest)
    )
    found: dict[tuple[str, str, str, str | None], None] = {}
    for experiment_id, name, digest, tags in rows:
        context = next(
            (t["value"] for t in json.loads(tags) if t["key"] == DATASET_CONTEXT_TAG), None
        )
        found.setdefault((str(experiment_id), name, digest, context), None)
        if len(found) >= limit:
            break
    return list(found)


def _model_links(s: Session, run_ids: Sequence[str]) -> dict[str, list[tuple[str, str, int]]]:
    found: dict[str, list[tuple[str, str, int]]] = defaultdict(list)
    rows = s.execute(
        select(
            RunModelLinkRow.run_id,
            RunModelLinkRow.model_id,
            RunModelLinkRow.direction,
            RunModelLinkRow.step,
        ).where(_among_runs(s, RunModelLinkRow.run_id, run_ids))
    )
    for run_id, model_id, direction, step in rows:
        found[run_id].append((model_id, direction, step))
    return found


def log_inputs(s: Session, run_id: str, experiment_id: str, inputs: Iterable[DatasetInput]) -> None:
    exp_id = parse_experiment_id(experiment_id)
    for item in inputs:
        d = item.dataset
        dataset_id = s.scalar(
            select(DatasetRow.dataset_id).where(
                DatasetRow.experiment_id == exp_id,
                DatasetRow.name == d.name,
                DatasetRow.digest == d.digest,
            )
        )
        if dataset_id is None:
            dataset_id = uuid.uuid4().hex
            s.add(
                DatasetRow(
                    dataset_id=dataset_id,
                    experiment_id=exp_id,
                    name=d.name,
                    digest=d.digest,
                    source_type=d.source_type,
                    source=d.source,
                    schema=d.schema,
                    profile=d.profile,
                )
            )
            s.flush()
        tags = json.dumps([{"key": k, "value": v} for k, v in item.tags])
        s.execute(
            _insert(s, RunInputRow).on_conflict_do_nothing(),
            [{"run_id": run_id, "dataset_id": dataset_id, "tags": tags}],
        )


def _like_literal(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def runs_reading(
    s: Session, uri: str, team_ids: list[str] | None, limit: int
) -> list[tuple[RunInfo, DatasetInput]]:
    """Runs of experiments visible to ``team_ids`` (as :func:`visible_experiments`) with an
    input whose source is a JSON object whose ``uri`` is ``uri``, newest first: the text is
    narrowed in SQL, then each candidate's source parsed and compared exactly."""
    pattern = "%" + _like_literal(json.dumps(uri)) + "%"
    query = (
        select(RunRow, RunInputRow.tags, DatasetRow)
        .join(RunInputRow, RunInputRow.run_id == RunRow.run_id)
        .join(DatasetRow, DatasetRow.dataset_id == RunInputRow.dataset_id)
        .join(ExperimentRow, ExperimentRow.experiment_id == RunRow.experiment_id)
        .where(DatasetRow.source.like(pattern, escape="\\"))
        .order_by(RunRow.start_time.desc(), RunRow.run_id)
    )
    if team_ids is not None:
        query = query.where(ExperimentRow.team_id.is_(None) | ExperimentRow.team_id.in_(team_ids))
    found: list[tuple[RunInfo, DatasetInput]] = []
    for run, tags, d in s.execute(query.limit(limit * 4)):
        try:
            named = json.loads(d.source).get("uri")
        except (ValueError, AttributeError):
            continue
        if named != uri:
            continue
        dataset = Dataset(d.name, d.digest, d.source_type, d.source, d.schema, d.profile)
        pairs = tuple((t["key"], t["value"]) for t in json.loads(tags))
        found.append((_info(run), DatasetInput(dataset, pairs)))
        if len(found) == limit:
            break
    return found


def link_models(s: Session, run_id: str, links: Iterable[tuple[str, str, int]]) -> None:
    rows = [{"run_id": run_id, "model_id": m, "direction": d, "step": step} for m, d, step in links]
    if rows:
        s.execute(_insert(s, RunModelLinkRow).on_conflict_do_nothing(), rows)


# ---------------------------------------------------------------- logged models (MLflow 3)


def _logged_models(s: Session, rows: Sequence[LoggedModelRow]) -> list[LoggedModel]:
    ids = [r.model_id for r in rows]
    tags: dict[str, dict[str, str]] = defaultdict(dict)
    params: dict[str, dict[str, str]] = defaultdict(dict)
    metrics: dict[str, list[Metric]] = defaultdict(list)
    if ids:
        for mid, key, value in s.execute(
            select(
                LoggedModelTagRow.model_id, LoggedModelTagRow.key, LoggedModelTagRow.value
            ).where(LoggedModelTagRow.model_id.in_(ids))
        ):
            tags[mid][key] = value
        for mid, key, value in s.execute(
            select(
                LoggedModelParamRow.model_id, LoggedModelParamRow.key, LoggedModelParamRow.value
            ).where(LoggedModelParamRow.model_id.in_(ids))
        ):
            params[mid][key] = value
        for m in s.scalars(select(MetricRow).where(MetricRow.model_id.in_(ids))):
            assert m.model_id is not None
            metrics[m.model_id].append(
                Metric(
                    m.key,
                    math.nan if m.is_nan else m.value,
                    m.timestamp,
                    m.step,
                    m.run_id,
                    m.model_id,
                    m.dataset_name,
                    m.dataset_digest,
                )
            )
    return [
        LoggedModel(
            model_id=r.model_id,
            experiment_id=str(r.experiment_id),
            name=r.name,
            artifact_location=r.artifact_location,
            creation_timestamp_ms=r.creation_timestamp_ms,
            last_updated_timestamp_ms=r.last_updated_timestamp_ms,
            status=r.status,
            model_type=r.model_type,
            source_run_id=r.source_run_id,
            source_run_verified=r.source_run_verified,
            status_message=r.status_message,
            creator_id=r.creator_id,
            tags=tags[r.model_id],
            params=params[r.model_id],
            metrics=tuple(metrics[r.model_id]),
        )
        for r in rows
    ]


def insert_logged_model(
    s: Session, experiment_id: str, spec: LoggedModelSpec, creator_id: str, now: int
) -> LoggedModel:
    exp = s.get(ExperimentRow, parse_experiment_id(experiment_id))
    if exp is None:
        raise NotFound(f"No Experiment with id={experiment_id} exists")
    model_id = f"m-{uuid.uuid4().hex}"
    row = LoggedModelRow(
        model_id=model_id,
        experiment_id=exp.experiment_id,
        name=spec.name,
        artifact_location=f"{exp.artifact_location}/models/{model_id}/artifacts",
        creation_timestamp_ms=now,
        last_updated_timestamp_ms=now,
        status="LOGGED_MODEL_PENDING",
        model_type=spec.model_type,
        source_run_id=spec.source_run_id,
        source_run_verified=spec.source_run_verified,
        creator_id=creator_id,
    )
    s.add(row)
    s.flush()
    set_logged_model_params(s, model_id, spec.params)
    set_logged_model_tags(s, model_id, spec.tags)
    return _logged_models(s, [row])[0]


def logged_model_row(s: Session, model_id: str) -> tuple[LoggedModel, str | None]:
    """The model and its experiment's team (for the access check)."""
    found = s.execute(
        select(LoggedModelRow, ExperimentRow.team_id)
        .join(ExperimentRow, ExperimentRow.experiment_id == LoggedModelRow.experiment_id)
        .where(LoggedModelRow.model_id == model_id, LoggedModelRow.lifecycle_stage == "active")
    ).first()
    if found is None:
        raise NotFound(f"Logged model with ID '{model_id[:80]}' not found.")
    return _logged_models(s, [found[0]])[0], found[1]


def update_logged_model(s: Session, model_id: str, values: Mapping[str, Any]) -> None:
    row = s.get(LoggedModelRow, model_id)
    if row is None:
        raise NotFound(f"Logged model with ID '{model_id[:80]}' not found.")
    for key, value in values.items():
        setattr(row, key, value)
    s.flush()


def set_logged_model_params(s: Session, model_id: str, params: Mapping[str, str]) -> None:
    if params:
        s.execute(
            _insert(s, LoggedModelParamRow).on_conflict_do_nothing(),
            [{"model_id": model_id, "key": k, "value": v} for k, v in params.items()],
        )


def set_logged_model_tags(s: Session, model_id: str, tags: Mapping[str, str]) -> None:
    if tags:
        stmt = _insert(s, LoggedModelTagRow)
        stmt = stmt.on_conflict_do_update(
            index_elements=["model_id", "key"], set_={"value": stmt.excluded.value}
        )
        s.execute(stmt, [{"model_id": model_id, "key": k, "value": v} for k, v in tags.items()])


def append_to_tag_list(s: Session, model_id: str, key: str, entry: Mapping[str, Any]) -> None:
    """Add ``entry`` to the JSON list the logged model's tag ``key`` holds (made if absent;
    a value that is not a JSON list starts a new one), once: the model's row is locked, so
    two versions registered at once both stay."""
    row = s.get(LoggedModelRow, model_id, with_for_update=True, populate_existing=True)
    if row is None:
        raise NotFound(f"Logged model with ID '{model_id[:80]}' not found.")
    held = s.scalar(
        select(LoggedModelTagRow.value).where(
            LoggedModelTagRow.model_id == model_id, LoggedModelTagRow.key == key
        )
    )
    try:
        entries = json.loads(held) if held else []
    except ValueError:
        entries = []
    if not isinstance(entries, list):
        entries = []
    if entry not in entries:
        entries.append(dict(entry))
    set_logged_model_tags(s, model_id, {key: json.dumps(entries)})


def delete_logged_model_tag(s: Session, model_id: str, key: str) -> None:
    result = s.execute(
        delete(LoggedModelTagRow).where(
            LoggedModelTagRow.model_id == model_id, LoggedModelTagRow.key == key
        )
    )
    if not getattr(result, "rowcount", 0):
        raise NotFound(f"No tag with key '{key[:80]}' on logged model '{model_id[:80]}'.")


def page_of_logged_models(
    s: Session, query: Select[Any], offset: int, limit: int
) -> list[LoggedModel]:
    return _logged_models(s, list(s.scalars(query.offset(offset).limit(limit))))
