"""Rows for the search tests, inserted with the ORM models (no service layer)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Select
from sqlalchemy.orm import Session

from shamal.db import Database, open_database, upgrade
from shamal.db.models import (
    DatasetRow,
    ExperimentRow,
    ExperimentTagRow,
    LatestMetricRow,
    ParamRow,
    RunInputRow,
    RunRow,
    RunTagRow,
)


@contextmanager
def migrated(url: str) -> Iterator[Database]:
    """A migrated database at ``url``, disposed afterwards."""
    db = open_database(url)
    upgrade(db)
    try:
        yield db
    finally:
        db.dispose()


def add_experiment(
    s: Session,
    experiment_id: int,
    name: str,
    *,
    created: int = 0,
    updated: int = 0,
    stage: str = "active",
    tags: Mapping[str, str] | None = None,
) -> None:
    s.add(
        ExperimentRow(
            experiment_id=experiment_id,
            name=name,
            artifact_location=f"mlflow-artifacts:/{experiment_id}",
            lifecycle_stage=stage,
            creation_time=created,
            last_update_time=updated,
        )
    )
    s.flush()
    s.add_all(
        ExperimentTagRow(experiment_id=experiment_id, key=k, value=v)
        for k, v in (tags or {}).items()
    )


def add_run(
    s: Session,
    run_id: str,
    experiment_id: int,
    *,
    start: int = 0,
    end: int | None = None,
    name: str = "",
    status: str = "FINISHED",
    user: str = "",
    stage: str = "active",
    params: Mapping[str, str] | None = None,
    tags: Mapping[str, str] | None = None,
    metrics: Mapping[str, float] | None = None,
) -> None:
    s.add(
        RunRow(
            run_id=run_id,
            experiment_id=experiment_id,
            name=name or run_id,
            user_id=user,
            status=status,
            start_time=start,
            end_time=end,
            lifecycle_stage=stage,
            artifact_uri=f"mlflow-artifacts:/{experiment_id}/{run_id}/artifacts",
        )
    )
    s.flush()
    s.add_all(ParamRow(run_id=run_id, key=k, value=v) for k, v in (params or {}).items())
    s.add_all(RunTagRow(run_id=run_id, key=k, value=v) for k, v in (tags or {}).items())
    for key, value in (metrics or {}).items():
        nan = math.isnan(value)
        s.add(
            LatestMetricRow(
                run_id=run_id,
                key=key,
                step=0,
                timestamp=0,
                value=0.0 if nan else value,
                is_nan=nan,
            )
        )


def add_input(
    s: Session, run_id: str, experiment_id: int, name: str, digest: str, context: str | None
) -> None:
    """One dataset input of a run, its context stored as the store writes it (JSON tags)."""
    dataset_id = f"{name}-{digest}"[:32]
    if s.get(DatasetRow, dataset_id) is None:
        s.add(
            DatasetRow(
                dataset_id=dataset_id,
                experiment_id=experiment_id,
                name=name,
                digest=digest,
                source_type="local",
                source="{}",
            )
        )
        s.flush()
    tags = [] if context is None else [{"key": "mlflow.data.context", "value": context}]
    tags.insert(0, {"key": "other", "value": "x"})
    s.add(RunInputRow(run_id=run_id, dataset_id=dataset_id, tags=json.dumps(tags)))


def fetch(db: Database, stmt: Select[Any], attribute: str) -> list[Any]:
    """One attribute of every row the select returns, in order."""
    with db.unit_of_work(write=False) as s:
        return [getattr(row, attribute) for row in s.scalars(stmt)]
