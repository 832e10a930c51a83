"""Monitoring: drift, data quality and performance of deployed models, closing the loop.

The pure statistics live in :mod:`shamal.monitoring.core`; monitors, their results and the
actions they take (events, retraining, rollback) are built on it here:

- a **reference profile** (:class:`ReferenceProfile`) of a registered model version holds
  sketches of its training dataset version's columns and of its predictions, built by
  :class:`ReferenceService` (streamed, bounded memory) or uploaded by a training job;
- a **monitor** (:class:`Monitor`, made from a :class:`MonitorSpec`) reads its deployment's
  sample log on a schedule, compares each window with the reference and stores a
  :class:`MonitorResult` and one :class:`SeriesPoint` per column; on drift it emits
  ``drift_detected`` and applies its :class:`OnDrift` policy (retrain, roll back, alert).
  :class:`MonitorService` holds the rules; its ``run_due`` is the scheduler loop's task.

The entities and rules load with the package; the services (database, datasets, pipelines)
on first use. The router under ``/api/v1/monitors`` is :mod:`shamal.monitoring.api`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shamal import lazy
from shamal.monitoring._columns import SampleColumns, Sampled, signature_names, split_samples
from shamal.monitoring._entities import (
    ColumnRole,
    DriftAction,
    Monitor,
    MonitorResult,
    MonitorSpec,
    OnDrift,
    ReferenceColumn,
    ReferenceProfile,
    RunOutcome,
    SeriesPoint,
)
from shamal.monitoring._rules import (
    CORRECTIONS,
    MAX_WINDOW,
    MIN_SCHEDULE_S,
    TESTS,
    check_monitor_name,
    next_due,
    parse_on_drift,
    parse_schedule,
)
from shamal.monitoring._sdk import upload_predictions

if TYPE_CHECKING:
    from shamal.monitoring._references import ReferenceService
    from shamal.monitoring._service import MonitorService, MonitorServices

_WHERE: dict[str, tuple[str, str | None]] = {
    "MonitorService": ("_service", "MonitorService"),
    "MonitorServices": ("_service", "MonitorServices"),
    "ReferenceService": ("_references", "ReferenceService"),
}

__all__ = [
    "upload_predictions",
    "CORRECTIONS",
    "MAX_WINDOW",
    "MIN_SCHEDULE_S",
    "TESTS",
    "ColumnRole",
    "DriftAction",
    "Monitor",
    "MonitorResult",
    "MonitorService",
    "MonitorServices",
    "MonitorSpec",
    "OnDrift",
    "ReferenceColumn",
    "ReferenceProfile",
    "ReferenceService",
    "RunOutcome",
    "SampleColumns",
    "Sampled",
    "SeriesPoint",
    "check_monitor_name",
    "next_due",
    "parse_on_drift",
    "parse_schedule",
    "signature_names",
    "split_samples",
]


def __getattr__(name: str) -> Any:
    return lazy.attribute(__name__, _WHERE, name, globals())
