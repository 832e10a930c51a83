"""The outbox: how a domain records an event in the transaction of its change.

A domain calls :func:`emit` with the session of the unit of work that makes the change, as
the last statement of that work where it can: the event commits with the change or rolls
back with it, and nothing is sent anywhere from inside the transaction (consumers and
webhooks read the table afterwards).
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from shamal.clock import utc_now
from shamal.events import _store
from shamal.events._entities import NewEvent

__all__ = ["MAX_PAYLOAD_BYTES", "emit"]

logger = logging.getLogger(__name__)

#: A payload is a few names and numbers; anything larger is a bug in the emitting domain.
MAX_PAYLOAD_BYTES = 16 * 1024
MAX_SUBJECT = 300


def emit(session: Session, event: NewEvent, *, at: datetime | None = None) -> int:
    """Append ``event`` to the stream in ``session``'s (the caller's) transaction.

    The payload is stored as JSON: values JSON cannot hold (datetimes, enums) are stored
    as their text. On PostgreSQL this takes a lock that orders writers of events until the
    caller's transaction ends, so emit as late in the transaction as the change allows.

    Args:
        session: the session of the unit of work that makes the change.
        event: what happened.
        at: when (default: now, UTC).

    Returns:
        The event's id: its place in the stream.

    Raises:
        ValueError: the subject is empty or longer than 300 characters, or the payload is
            larger than 16 KiB as JSON (a programming error of the emitting domain).
    """
    if not event.subject or len(event.subject) > MAX_SUBJECT:
        raise ValueError(f"an event's subject is 1 to {MAX_SUBJECT} characters")
    encoded = json.dumps(dict(event.payload), default=str, sort_keys=True)
    if len(encoded) > MAX_PAYLOAD_BYTES:
        raise ValueError(f"an event's payload is at most {MAX_PAYLOAD_BYTES} bytes as JSON")
    payload: dict[str, Any] = json.loads(encoded)
    event_id = _store.insert_event(session, event, payload, at or utc_now())
    logger.debug("event %d %s %s", event_id, event.kind.value, event.subject)
    return event_id
