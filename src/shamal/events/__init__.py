"""Events: one durable, ordered stream of what happened on the platform (an outbox in the
metadata database), the consumers that act on it, and what carries it out (webhooks, a
message broker)."""

from __future__ import annotations

from shamal.events._entities import Event, EventKind, NewEvent
from shamal.events._filters import EventFilter

__all__ = ["Event", "EventFilter", "EventKind", "NewEvent"]
