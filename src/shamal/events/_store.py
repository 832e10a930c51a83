"""SQL access for the event stream. ORM rows never leave this module.

Every function takes the caller's session; the service (or, for :func:`insert_event`, the
domain that emits) owns the transaction. Leases on consumers and webhooks are taken and
given back by compare-and-set updates, so two processes never work one of them at once.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, delete, func, or_, select, text, update
from sqlalchemy.orm import Session

from shamal.db.models import EventConsumerRow, EventRow, WebhookDeliveryRow, WebhookRow
from shamal.errors import NotFound
from shamal.events._entities import Delivery, Event, EventKind, NewEvent, Webhook

logger = logging.getLogger(__name__)

#: The key of the transaction-scoped advisory lock that orders writers of events on
#: PostgreSQL (an arbitrary constant: "shamal.events" folded to 63 bits).
EVENTS_LOCK_KEY = 0x5368616D616C4576


@dataclass(frozen=True, slots=True)
class Visibility:
    """Which events a reader may see: ``teams`` None for every team's, else those team
    names; ``platform`` whether events of no team (the platform's) too."""

    teams: frozenset[str] | None
    platform: bool


EVERYTHING = Visibility(None, True)


# ------------------------------------------------------------------------------ events
def insert_event(s: Session, event: NewEvent, payload: dict[str, Any], at: datetime) -> int:
    """Append ``event`` in the caller's transaction; returns its id.

    On PostgreSQL a transaction-scoped advisory lock is taken first and held until the
    caller's transaction ends: writers of events then commit in the order of their ids, so a
    reader never sees id N+1 before N (an id taken by a transaction still open would
    otherwise appear later, behind a reader's position). SQLite has one writer at a time.
    """
    if s.get_bind().dialect.name == "postgresql":
        s.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": EVENTS_LOCK_KEY})
    row = EventRow(
        kind=event.kind.value,
        subject=event.subject,
        team_name=event.team,
        actor=event.actor,
        payload=payload,
        created_at=at,
    )
    s.add(row)
    s.flush()
    return int(row.id)


def _event(row: EventRow) -> Event:
    return Event(
        id=row.id,
        kind=EventKind(row.kind),
        subject=row.subject,
        team=row.team_name,
        actor=row.actor,
        payload=row.payload,
        created_at=row.created_at,
    )


def events_after(
    s: Session,
    after: int,
    *,
    limit: int,
    kinds: Collection[EventKind] = (),
    visible: Visibility = EVERYTHING,
) -> list[Event]:
    """Up to ``limit`` events with ids above ``after``, ascending, of ``kinds`` (all when
    empty) that ``visible`` allows."""
    query = select(EventRow).where(EventRow.id > after)
    if kinds:
        query = query.where(EventRow.kind.in_(sorted(k.value for k in kinds)))
    if visible.teams is not None:
        allowed = EventRow.team_name.in_(sorted(visible.teams))
        query = query.where(
            or_(allowed, EventRow.team_name.is_(None)) if visible.platform else allowed
        )
    elif not visible.platform:
        query = query.where(EventRow.team_name.is_not(None))
    rows = s.scalars(query.order_by(EventRow.id).limit(limit))
    return [_event(row) for row in rows]


def last_event_id(s: Session) -> int:
    """The id of the newest event (0 for none)."""
    return int(s.scalar(select(func.max(EventRow.id))) or 0)


# --------------------------------------------------------------------------- consumers
def ensure_consumer(s: Session, name: str, now: datetime) -> None:
    """Make the consumer ``name`` (at position 0) unless it exists. A unique violation means
    another process made it at the same moment: the caller retries."""
    if s.get(EventConsumerRow, name) is None:
        s.add(EventConsumerRow(name=name, position=0, updated_at=now))
        s.flush()


def claim_consumer(s: Session, name: str, owner: str, now: datetime, until: datetime) -> int | None:
    """Take the consumer's lease unless another holder's is still running; returns its
    position, or None when someone else holds it."""
    claimed = s.execute(
        update(EventConsumerRow)
        .where(
            EventConsumerRow.name == name,
            or_(EventConsumerRow.lease_owner.is_(None), EventConsumerRow.lease_until < now),
        )
        .values(lease_owner=owner, lease_until=until)
    )
    if claimed.rowcount != 1:  # type: ignore[attr-defined]
        return None
    return int(
        s.scalars(select(EventConsumerRow.position).where(EventConsumerRow.name == name)).one()
    )


def release_consumer(
    s: Session, name: str, owner: str, now: datetime, position: int | None
) -> bool:
    """Give the lease back, moving to ``position`` (None: stay). False when the lease was
    no longer ``owner``'s (it ran out and another process took it): nothing changed."""
    values: dict[str, Any] = {"lease_owner": None, "lease_until": None, "updated_at": now}
    if position is not None:
        values["position"] = position
    done = s.execute(
        update(EventConsumerRow)
        .where(EventConsumerRow.name == name, EventConsumerRow.lease_owner == owner)
        .values(**values)
    )
    return bool(done.rowcount == 1)  # type: ignore[attr-defined]


def consumer_position(s: Session, name: str) -> int | None:
    return s.scalar(select(EventConsumerRow.position).where(EventConsumerRow.name == name))


# ---------------------------------------------------------------------------- webhooks
@dataclass(frozen=True, slots=True)
class WebhookRecord:
    """A stored webhook with what only the service may see: its team's id, its sealed
    secret."""

    webhook: Webhook
    team_id: str | None
    sealed_secret: str


def _webhook(row: WebhookRow) -> WebhookRecord:
    hook = Webhook(
        id=row.id,
        name=row.name,
        team=row.team_name or None,
        url=row.url,
        filter=row.filter,
        active=row.active,
        allow_private=row.allow_private,
        position=row.position,
        created_by=row.created_by,
        created_at=row.created_at,
        updated_at=row.updated_at,
        format=row.format,
        description=row.description,
        mlflow_events=tuple(row.mlflow_events or ()),
    )
    return WebhookRecord(hook, row.team_id, row.sealed_secret)


def insert_webhook(s: Session, hook: Webhook, team_id: str | None, sealed_secret: str) -> None:
    s.add(
        WebhookRow(
            id=hook.id,
            name=hook.name,
            team_id=team_id,
            team_name=hook.team or "",
            url=hook.url,
            sealed_secret=sealed_secret,
            filter=hook.filter,
            active=hook.active,
            allow_private=hook.allow_private,
            position=hook.position,
            created_by=hook.created_by,
            created_at=hook.created_at,
            updated_at=hook.updated_at,
            format=hook.format,
            description=hook.description,
            mlflow_events=list(hook.mlflow_events) or None,
        )
    )
    s.flush()


def not_found(webhook_id: str) -> NotFound:
    return NotFound(f"webhook {webhook_id[:40]!r} does not exist")


def find_webhook(s: Session, webhook_id: str) -> WebhookRecord | None:
    row = s.get(WebhookRow, webhook_id)
    return None if row is None else _webhook(row)


def list_webhooks(
    s: Session,
    team_ids: frozenset[str] | None,
    limit: int,
    *,
    fmt: str | None = None,
    offset: int = 0,
) -> list[Webhook]:
    """Webhooks of ``team_ids`` (None: every webhook) in format ``fmt`` (None: any), by
    team, name and id, skipping the first ``offset``."""
    query = select(WebhookRow)
    if team_ids is not None:
        query = query.where(WebhookRow.team_id.in_(sorted(team_ids)))
    if fmt is not None:
        query = query.where(WebhookRow.format == fmt)
    order = (WebhookRow.team_name, WebhookRow.name, WebhookRow.id)
    rows = s.scalars(query.order_by(*order).offset(offset).limit(limit))
    return [_webhook(row).webhook for row in rows]


def update_webhook(
    s: Session, webhook_id: str, changes: dict[str, Any], sealed_secret: str | None
) -> None:
    """Set the columns in ``changes`` (of :class:`Webhook`'s fields: name, url, filter,
    description, mlflow_events, updated_at) and, when given, the sealed secret. A new name
    the team's other webhook has fails the unit of work with ``AlreadyExists``."""
    values = dict(changes)
    if "mlflow_events" in values:
        values["mlflow_events"] = list(values["mlflow_events"]) or None
    if sealed_secret is not None:
        values["sealed_secret"] = sealed_secret
    s.execute(update(WebhookRow).where(WebhookRow.id == webhook_id).values(**values))


def active_webhook_ids(s: Session) -> list[str]:
    return list(
        s.scalars(select(WebhookRow.id).where(WebhookRow.active.is_(True)).order_by(WebhookRow.id))
    )


def set_active(s: Session, webhook_id: str, active: bool, now: datetime) -> None:
    s.execute(
        update(WebhookRow).where(WebhookRow.id == webhook_id).values(active=active, updated_at=now)
    )


def remove_webhook(s: Session, webhook_id: str) -> None:
    s.execute(delete(WebhookDeliveryRow).where(WebhookDeliveryRow.webhook_id == webhook_id))
    s.execute(delete(WebhookRow).where(WebhookRow.id == webhook_id))


def claim_webhook(s: Session, webhook_id: str, owner: str, now: datetime, until: datetime) -> bool:
    """Take the webhook's delivery lease (only an active webhook's) unless another process's
    is still running."""
    claimed = s.execute(
        update(WebhookRow)
        .where(
            WebhookRow.id == webhook_id,
            WebhookRow.active.is_(True),
            or_(WebhookRow.lease_owner.is_(None), WebhookRow.lease_until < now),
        )
        .values(lease_owner=owner, lease_until=until)
    )
    return bool(claimed.rowcount == 1)  # type: ignore[attr-defined]


def advance_webhook(
    s: Session, webhook_id: str, owner: str, position: int, until: datetime | None
) -> bool:
    """Move the webhook to ``position`` while ``owner`` holds its lease, renewing the lease
    to ``until`` (None: give it back). False when the lease is no longer ``owner``'s:
    nothing changed."""
    values: dict[str, Any] = {"position": position, "lease_until": until}
    if until is None:
        values["lease_owner"] = None
    done = s.execute(
        update(WebhookRow)
        .where(WebhookRow.id == webhook_id, WebhookRow.lease_owner == owner)
        .values(**values)
    )
    return bool(done.rowcount == 1)  # type: ignore[attr-defined]


# -------------------------------------------------------------------------- deliveries
def _delivery(row: WebhookDeliveryRow) -> Delivery:
    return Delivery(
        id=row.id,
        webhook_id=row.webhook_id,
        event_id=row.event_id,
        attempt=row.attempt,
        status_code=row.status_code,
        ok=row.ok,
        dead=row.dead,
        error=row.error,
        next_attempt_at=row.next_attempt_at,
        delivered_at=row.delivered_at,
        created_at=row.created_at,
    )


def last_attempt(s: Session, webhook_id: str, event_id: int) -> Delivery | None:
    row = s.scalars(
        select(WebhookDeliveryRow)
        .where(
            and_(
                WebhookDeliveryRow.webhook_id == webhook_id, WebhookDeliveryRow.event_id == event_id
            )
        )
        .order_by(WebhookDeliveryRow.attempt.desc())
        .limit(1)
    ).one_or_none()
    return None if row is None else _delivery(row)


def add_delivery(s: Session, d: Delivery) -> None:
    s.add(
        WebhookDeliveryRow(
            webhook_id=d.webhook_id,
            event_id=d.event_id,
            attempt=d.attempt,
            status_code=d.status_code,
            ok=d.ok,
            dead=d.dead,
            error=d.error,
            next_attempt_at=d.next_attempt_at,
            delivered_at=d.delivered_at,
            created_at=d.created_at,
        )
    )
    s.flush()


def deliveries(s: Session, webhook_id: str, limit: int) -> list[Delivery]:
    """The webhook's delivery log, newest attempt first."""
    rows = s.scalars(
        select(WebhookDeliveryRow)
        .where(WebhookDeliveryRow.webhook_id == webhook_id)
        .order_by(WebhookDeliveryRow.id.desc())
        .limit(limit)
    )
    return [_delivery(row) for row in rows]
