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
from typing import Any, Protocol

__all__ = [
    "Delivery",
    "Event",
    "EventKind",
    "EventPage",
    "NewEvent",
    "SendResult",
    "Webhook",
    "WebhookSender",
    "delivery_id",
]


class EventKind(enum.StrEnum):
    """Every kind of event the platform emits, and the payload each carries.

    - ``dataset_version_created``: ``dataset``, ``version``, ``team``, ``rows``, ``digest``
    - ``dataset_version_validated``: ``dataset``, ``version``, ``team``, ``passed``

      Both also carry ``job`` (the first 12 characters of the job's id) when a job wrote
      the version with its own token.
    - ``model_version_registered``: ``name``, ``version``, ``run_id``, ``source``
    - ``model_alias_moved``: ``name``, ``alias``, ``version`` (None: deleted), ``previous``
    - ``job_finished``: ``job_id``, ``name``, ``team``, ``state``, ``exit_code``, ``reason``
    - ``deployment_changed``: ``deployment``, ``team``, ``change``
    - ``deployment_rolled_back``: ``deployment``, ``team``, ``reason``
    - ``drift_detected``: ``monitor``, ``deployment``, ``team``, ``features``
    - ``slo_breached``: ``deployment``, ``team``, ``revision``, ``version``, ``reason``
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
    SLO_BREACHED = "slo_breached"
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


@dataclass(frozen=True, slots=True)
class EventPage:
    """A page of the stream: ``events`` (ascending ids) and ``next_after``, the position to
    read on from (the last id looked at, which passes a filter's misses too)."""

    events: tuple[Event, ...]
    next_after: int


@dataclass(frozen=True, slots=True)
class Webhook:
    """A subscription that POSTs matching events to ``url``. Its secret is never part of it:
    it is shown once, when the webhook is made.

    ``team`` is None for a platform webhook (an admin's), which is offered every event; a
    team's webhook is offered only that team's events. ``position`` is the id of the last
    event it has been offered; events are delivered in id order.

    ``format`` is what a delivery's body is: ``"shamal"`` (the event's JSON) or
    ``"mlflow"`` (MLflow 3's payload, made through MLflow's webhooks API, whose events it
    keeps in ``mlflow_events`` as ``"entity.action"``).
    """

    id: str
    name: str
    team: str | None
    url: str
    filter: str
    active: bool
    allow_private: bool
    position: int
    created_by: str
    created_at: datetime
    updated_at: datetime
    format: str = "shamal"
    description: str | None = None
    mlflow_events: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "team": self.team,
            "url": self.url,
            "filter": self.filter,
            "active": self.active,
            "allow_private": self.allow_private,
            "position": self.position,
            "created_by": self.created_by,
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
            "format": self.format,
            "description": self.description,
        }


def delivery_id(webhook_id: str, event_id: int) -> str:
    """The id a receiver dedupes on: the same for every attempt of one event to one webhook."""
    return f"{webhook_id}-{event_id}"


@dataclass(frozen=True, slots=True)
class Delivery:
    """One attempt to deliver one event to one webhook (the delivery log keeps each).

    ``dead``: this attempt failed and was the last; the webhook moved on without the event.
    ``next_attempt_at``: when the next attempt is due (a failure with attempts left).
    ``error`` is short and never holds the secret or the URL.
    """

    id: int
    webhook_id: str
    event_id: int
    attempt: int
    status_code: int | None
    ok: bool
    dead: bool
    error: str
    next_attempt_at: datetime | None
    delivered_at: datetime | None
    created_at: datetime

    @property
    def delivery_id(self) -> str:
        return delivery_id(self.webhook_id, self.event_id)

    def to_json(self) -> dict[str, Any]:
        def iso(at: datetime | None) -> str | None:
            return None if at is None else at.isoformat()

        return {
            "id": self.id,
            "delivery_id": self.delivery_id,
            "webhook_id": self.webhook_id,
            "event_id": self.event_id,
            "attempt": self.attempt,
            "status_code": self.status_code,
            "ok": self.ok,
            "dead": self.dead,
            "error": self.error,
            "next_attempt_at": iso(self.next_attempt_at),
            "delivered_at": iso(self.delivered_at),
            "created_at": self.created_at.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class SendResult:
    """What one HTTP delivery came to: ``ok`` (a 2xx answer), the status (None: no answer)
    and a short error for the log (empty when ok; never the secret)."""

    ok: bool
    status: int | None
    error: str = ""


class WebhookSender(Protocol):
    """Carries one signed delivery to a receiver.

    ``send`` POSTs ``body`` (the event's JSON) to ``url``, signed with ``secret``, naming
    ``delivery_id`` (stable across retries of one event, so receivers can dedupe). It never
    raises for a failed delivery (an unreachable host, a timeout, a non-2xx answer): it
    returns ``SendResult(ok=False, ...)``. It follows no redirects. Thread-safe.
    """

    def send(self, url: str, secret: str, body: bytes, delivery_id: str) -> SendResult: ...
