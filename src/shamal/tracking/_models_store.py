"""SQL access for logged models (MLflow 3). ORM rows never leave this module."""

from __future__ import annotations

import math
import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Select, delete, select
from sqlalchemy.orm import Session

from shamal.db.models import (
    ExperimentRow,
    LoggedModelParamRow,
    LoggedModelRow,
    LoggedModelTagRow,
    MetricRow,
)
from shamal.errors import NotFound
from shamal.tracking._entities import LoggedModel, LoggedModelSpec, Metric
from shamal.tracking._store import _insert, parse_experiment_id


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
