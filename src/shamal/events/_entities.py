"""What the event stream carries: frozen values, no ORM rows.

An :class:`Event` is one fact the platform recorded in the same transaction as the change it
describes (the outbox): its ``id`` orders the stream, gapless per database, and is what a
consumer's position and a delivery's idempotency key refer to.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

__all__ = ["Event", "EventKind", "NewEvent"]


class EventKind(enum.StrEnum):
    """Every kind of event the platform emits, and the payload each carries.

    - ``dataset_version_created``: ``dataset``, ``version``, ``team``, ``rows``, ``digest``
    - ``dataset_version_validated``: ``dataset``, ``version``, ``team``, ``passed``
    - ``model_version_registered``: ``name``, ``version``, ``run_id``, ``source``
    - ``model_alias_moved``: ``name``, ``alias``, ``version`` (None: deleted), ``previous``
    - ``job_finished``: ``job_id``, ``name``, ``team``, ``state``, ``exit_code``, ``reason``
    - ``deployment_changed``: ``deployment``, ``team``, ``change``
    - ``deployment_rolled_back``: ``deployment``, ``team``, ``reason``
    - ``drift_detected``: ``monitor``, ``deployment``, ``team``, ``features``
    - ``schedule_fired``: ``pipeline``, ``schedule``, ``tick`` (ISO time)
    - ``pipeline_run_finished``: ``pipeline``, ``run_id``, ``state``
    """

    DATASET_VERSION_CREATED = "dataset_version_created"
    DATASET_VERSION_VALIDATED = "dataset_version_validated"
    MODEL_VERSION_REGISTERED = "model_version_registered"
    MODEL_ALIAS_MOVED = "model_alias_moved"
    JOB_FINISHED = "job_finished"
    DEPLOYMENT_CHANGED = "deployment_changed"
    DEPLOYMENT_ROLLED_BACK = "deployment_rolled_back"
    DRIFT_DETECTED = "drift_detected"
    SCHEDULE_FIRED = "schedule_fired"
    PIPELINE_RUN_FINISHED = "pipeline_run_finished"


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event about to be written: what a domain hands the outbox.

    ``subject`` names the object (``data:/customers/3``, ``models:/churn/2``,
    ``jobs:/<id>``, ``deployments:/fraud-api``); ``team`` is whose it is (None: the
    platform's), which decides who may see it; ``actor`` is who caused it.
    """

    kind: EventKind
    subject: str
    team: str | None
    actor: str
    payload: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Event:
    """One recorded event. ``id`` orders the stream (ascending, never reused)."""

    id: int
    kind: EventKind
    subject: str
    team: str | None
    actor: str
    payload: Mapping[str, Any]
    created_at: datetime

    def to_json(self) -> dict[str, Any]:
        """The event as JSON: what webhooks, brokers and the API carry."""
        return {
            "id": self.id,
            "kind": self.kind.value,
            "subject": self.subject,
            "team": self.team,
            "actor": self.actor,
            "payload": dict(self.payload),
            "created_at": self.created_at.isoformat(),
        }
