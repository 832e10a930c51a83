"""Events: one durable, ordered stream of what happened on the platform (an outbox in the
metadata database), the consumers that act on it, and what carries it out (webhooks, a
message broker).

Domains record events with :func:`emit` in the transaction of their change; readers,
consumers and webhooks go through :class:`EventService`.
"""

from __future__ import annotations

from shamal.events._delivery import MLFLOW_FORMAT, SHAMAL_FORMAT, RetryPolicy
from shamal.events._entities import (
    Delivery,
    Event,
    EventKind,
    EventPage,
    NewEvent,
    SendResult,
    Webhook,
    WebhookSender,
    delivery_id,
)
from shamal.events._filters import EventFilter
from shamal.events._mlflow import example_event, mlflow_filter, parse_mlflow_event
from shamal.events._outbox import emit
from shamal.events._outlets import EventOutlets
from shamal.events._service import (
    MAX_LIST,
    MAX_URL,
    EventService,
    WebhookChange,
    WebhookShape,
)

__all__ = [
    "MAX_LIST",
    "MAX_URL",
    "MLFLOW_FORMAT",
    "SHAMAL_FORMAT",
    "Delivery",
    "Event",
    "EventFilter",
    "EventKind",
    "EventOutlets",
    "EventPage",
    "EventService",
    "NewEvent",
    "RetryPolicy",
    "SendResult",
    "Webhook",
    "WebhookChange",
    "WebhookSender",
    "WebhookShape",
    "delivery_id",
    "emit",
    "example_event",
    "mlflow_filter",
    "parse_mlflow_event",
]
