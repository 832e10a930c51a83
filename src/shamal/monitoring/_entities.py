"""What monitoring hands out: reference profiles, monitors, their results and time series.

All frozen; ``to_json`` gives the API's shape. Sketches are the pure core's
:class:`~shamal.monitoring.core.ColumnSketch`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shamal.monitoring.core import ColumnSketch

__all__ = [
    "ColumnRole",
    "DriftAction",
    "Monitor",
    "MonitorResult",
    "MonitorSpec",
    "OnDrift",
    "ReferenceColumn",
    "ReferenceProfile",
    "RunOutcome",
    "SeriesPoint",
]


class ColumnRole(enum.StrEnum):
    """What a reference column is to the model."""

    FEATURE = "feature"
    PREDICTION = "prediction"
    LABEL = "label"


class DriftAction(enum.StrEnum):
    """What a monitor does, beyond its drift event, when it finds drift."""

    NONE = "none"
    RETRAIN = "retrain"
    ROLLBACK = "rollback"


@dataclass(frozen=True, slots=True)
class OnDrift:
    """The policy: ``retrain:PIPELINE`` starts that pipeline, ``rollback`` rolls the
    deployment's canary back, ``none`` only emits the event."""

    action: DriftAction = DriftAction.NONE
    pipeline: str | None = None

    def __str__(self) -> str:
        if self.action is DriftAction.RETRAIN:
            return f"retrain:{self.pipeline}"
        return self.action.value


@dataclass(frozen=True, slots=True)
class ReferenceColumn:
    """One column of a reference profile: its role and its sketch."""

    name: str
    role: ColumnRole
    sketch: ColumnSketch

    def to_json(self) -> dict[str, Any]:
        return {"role": self.role.value, "sketch": self.sketch.to_json()}


@dataclass(frozen=True, slots=True)
class ReferenceProfile:
    """The reference of a registered model version: sketches of its training dataset
    version's columns and of its predictions on them (never rows)."""

    model: str
    version: int
    dataset: str | None
    dataset_version: int | None
    rows: int
    columns: Mapping[str, ReferenceColumn]
    chunks: Mapping[str, Any] | None
    created_by: str
    created_at: datetime
    updated_at: datetime

    def sketches(self, roles: frozenset[ColumnRole] | None = None) -> dict[str, ColumnSketch]:
        """The sketches of the columns of ``roles`` (None: every role)."""
        return {
            name: c.sketch for name, c in self.columns.items() if roles is None or c.role in roles
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "version": self.version,
            "dataset": self.dataset,
            "dataset_version": self.dataset_version,
            "rows": self.rows,
            "columns": {name: c.to_json() for name, c in sorted(self.columns.items())},
            "chunks": dict(self.chunks) if self.chunks is not None else None,
            "created_by": self.created_by,
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class MonitorSpec:
    """What ``shamal monitor create`` asks for.

    Attributes:
        deployment: the deployment watched (its team owns the monitor).
        schedule_s: seconds between runs.
        name: the monitor's name (default ``DEPLOYMENT-drift``).
        reference: (model, version) whose profile is the reference (default: the
            deployment's first primary version).
        columns: the columns compared (default: every feature and prediction column of
            the reference that the samples carry).
        tests: column -> test name (default: the core's size-aware choice).
        threshold: one threshold for every column (default: each test's own).
        correction: multiple-testing correction across columns.
        drift_share: the share of drifted columns that makes the dataset drifted.
        window: at most this many rows per run (the oldest unread first).
        on_drift: the policy applied when a run finds drift.
        retrain_params: the parameters a retraining run is started with.
        alert_url: a webhook URL told of every drift event of this monitor.
    """

    deployment: str
    schedule_s: int
    name: str | None = None
    reference: tuple[str, int] | None = None
    columns: tuple[str, ...] = ()
    tests: Mapping[str, str] = field(default_factory=dict)
    threshold: float | None = None
    correction: str = "none"
    drift_share: float = 0.5
    window: int = 1000
    on_drift: OnDrift = field(default_factory=OnDrift)
    alert_url: str | None = None
    retrain_params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Monitor:
    """A monitor as stored: its spec, schedule, position in the sample log and health."""

    name: str
    deployment: str
    team: str
    reference_model: str
    reference_version: int
    columns: tuple[str, ...]
    tests: Mapping[str, str]
    threshold: float | None
    correction: str
    drift_share: float
    window: int
    on_drift: OnDrift
    schedule_s: int
    paused: bool
    cursor: int
    next_run_at: datetime
    last_run_at: datetime | None
    last_error: str | None
    webhook_id: str | None
    created_by: str
    created_at: datetime
    updated_at: datetime
    retrain_params: Mapping[str, Any] = field(default_factory=dict)
    label_cursor: int = 0
    #: The reference follows the deployment's primary (none was named at creation): a new
    #: primary with a reference profile becomes the reference, and only the samples the
    #: primary answered are judged.
    follows: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "deployment": self.deployment,
            "team": self.team or None,
            "reference": {
                "model": self.reference_model,
                "version": self.reference_version,
                "follows_primary": self.follows,
            },
            "columns": list(self.columns),
            "tests": dict(self.tests),
            "threshold": self.threshold,
            "correction": self.correction,
            "drift_share": self.drift_share,
            "window": self.window,
            "on_drift": str(self.on_drift),
            "retrain_params": dict(self.retrain_params),
            "schedule_s": self.schedule_s,
            "paused": self.paused,
            "cursor": self.cursor,
            "next_run_at": self.next_run_at.isoformat(),
            "last_run_at": self.last_run_at.isoformat() if self.last_run_at else None,
            "last_error": self.last_error,
            "webhook_id": self.webhook_id,
            "created_by": self.created_by,
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class MonitorResult:
    """One run that read samples: the drift report (with quality issues) and the actions
    taken. ``report`` is the core's DriftReport JSON plus ``quality`` and ``missing``."""

    id: str
    monitor: str
    at: datetime
    first_sample: int
    last_sample: int
    samples: int
    rows: int
    drifted: bool
    share: float
    report: Mapping[str, Any]
    actions: tuple[Mapping[str, Any], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "monitor": self.monitor,
            "at": self.at.isoformat(),
            "first_sample": self.first_sample,
            "last_sample": self.last_sample,
            "samples": self.samples,
            "rows": self.rows,
            "drifted": self.drifted,
            "share": self.share,
            "report": dict(self.report),
            "actions": [dict(a) for a in self.actions],
        }


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    """One column's drift at one run: a point of its time series."""

    column: str
    at: datetime
    result_id: str
    test: str
    statistic: float | None
    p_value: float | None
    threshold: float
    drifted: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "column": self.column,
            "at": self.at.isoformat(),
            "result_id": self.result_id,
            "test": self.test,
            "statistic": self.statistic,
            "p_value": self.p_value,
            "threshold": self.threshold,
            "drifted": self.drifted,
        }


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """What one run did: its result (None when there was nothing new to read) and why."""

    monitor: str
    result: MonitorResult | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "monitor": self.monitor,
            "result": self.result.to_json() if self.result else None,
            "reason": self.reason,
        }
