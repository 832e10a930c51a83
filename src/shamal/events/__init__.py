"""Events: one durable, ordered stream of what happened on the platform (an outbox in the
metadata database), the consumers that act on it, and what carries it out (webhooks, a
message broker).

Domains record events with :func:`emit` in the transaction of their change; readers,
consumers and webhooks go through :class:`EventService`.
"""

from __future__ import annotations

from shamal.events._delivery import RetryPolicy
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
from shamal.events._outbox import emit
from shamal.events._outlets import EventOutlets
from shamal.events._service import EventService

__all__ = [
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
    "WebhookSender",
    "delivery_id",
    "emit",
]
