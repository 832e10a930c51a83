"""Pipelines as callers see them: frozen values, no ORM rows."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["CACHED_FROM_RUN_TAG", "PipelineInfo", "PipelineRun", "StepRun"]

#: On a cached step's tracking run: the tracking run of the step whose result it reused (the
#: lineage graph's ``reused`` edge).
CACHED_FROM_RUN_TAG = "shamal.pipeline.cached_from_run"


@dataclass(frozen=True, slots=True)
class PipelineInfo:
    """A registered pipeline at one version."""

    name: str
    team: str
    version: int
    owner: str
    spec: Mapping[str, Any]
    digest: str
    snapshot: str | None
    created_at: datetime
    updated_at: datetime

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "team": self.team,
            "version": self.version,
            "owner": self.owner,
            "spec": dict(self.spec),
            "digest": self.digest,
            "snapshot": self.snapshot,
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class StepRun:
    """One step of a run (or one item of a mapped step)."""

    key: str
    name: str
    index: int | None
    state: str
    args: Mapping[str, Any]
    job_id: str | None
    cache_key: str | None
    cache_parts: Mapping[str, Any] | None
    cached_from: str | None
    cache_note: str
    output: Any
    reason: str
    fan_out: int | None
    mlflow_run_id: str | None
    ready_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    def to_json(self) -> dict[str, Any]:
        def iso(t: datetime | None) -> str | None:
            return t.isoformat() if t is not None else None

        return {
            "key": self.key,
            "name": self.name,
            "index": self.index,
            "state": self.state,
            "args": dict(self.args),
            "job_id": self.job_id,
            "cache_key": self.cache_key,
            "cached_from": self.cached_from,
            "cache_note": self.cache_note,
            "output": self.output,
            "reason": self.reason,
            "fan_out": self.fan_out,
            "mlflow_run_id": self.mlflow_run_id,
            "ready_at": iso(self.ready_at),
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
        }


@dataclass(frozen=True, slots=True)
class PipelineRun:
    """One run of a pipeline version, with its steps when asked for."""

    id: str
    pipeline: str
    version: int
    params: Mapping[str, Any]
    state: str
    trigger: str
    user: str
    team: str
    retry_of: str | None
    experiment_id: str | None
    mlflow_run_id: str | None
    reason: str
    created_at: datetime
    finished_at: datetime | None
    steps: tuple[StepRun, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "pipeline": self.pipeline,
            "version": self.version,
            "params": dict(self.params),
            "state": self.state,
            "trigger": self.trigger,
            "user": self.user,
            "team": self.team,
            "retry_of": self.retry_of,
            "experiment_id": self.experiment_id,
            "mlflow_run_id": self.mlflow_run_id,
            "reason": self.reason,
            "created_at": self.created_at.isoformat(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            "steps": [s.to_json() for s in self.steps],
        }
