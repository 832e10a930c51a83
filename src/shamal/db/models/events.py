"""The event stream: the outbox of events, the positions of its consumers, and webhooks with
their delivery log.

``events.id`` orders the stream. Writers of events serialize from their insert to their
commit (a transaction-scoped advisory lock on PostgreSQL; SQLite has one writer at a time),
so ids become visible in ascending order and a reader that has seen id N never sees a
smaller id appear later. SQLite's ``AUTOINCREMENT`` keeps ids from ever being reused.

Consumers and webhooks are each worked by one process at a time through a lease
(``lease_owner``, ``lease_until``) taken and given back by compare-and-set: no transaction
stays open while a handler runs or a receiver answers.

The delivery log keeps one row per attempt (unique per webhook, event and attempt number):
the full history of a delivery stays readable, and the newest row of a (webhook, event) is
its current state.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from shamal.db.models._base import Base, UTCDateTime


class EventRow(Base):
    """One event, written in the transaction of the change it describes."""

    __tablename__ = "events"
    __table_args__ = (
        Index("ix_events_kind_id", "kind", "id"),
        Index("ix_events_team_name_id", "team_name", "id"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(64))
    subject: Mapped[str] = mapped_column(String(300))
    #: Whose event it is (None: the platform's): who may see it and which webhooks get it.
    team_name: Mapped[str | None] = mapped_column(String(64), nullable=True)
    actor: Mapped[str] = mapped_column(String(256))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class EventConsumerRow(Base):
    """A named consumer's position: the id of the last event it has handled."""

    __tablename__ = "event_consumers"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    position: Mapped[int] = mapped_column(Integer)
    lease_owner: Mapped[str | None] = mapped_column(String(32), nullable=True)
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class WebhookRow(Base):
    """A subscription: events matching ``filter`` are POSTed to ``url``, signed with the
    secret (stored sealed: AES-GCM under a key of the platform's ring)."""

    __tablename__ = "webhooks"
    __table_args__ = (UniqueConstraint("team_name", "name"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    team_id: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("teams.id", ondelete="CASCADE"), nullable=True, index=True
    )
    #: The owning team's name; "" for a platform webhook (an admin's, sees every event).
    team_name: Mapped[str] = mapped_column(String(64))
    url: Mapped[str] = mapped_column(String(2048))
    sealed_secret: Mapped[str] = mapped_column(Text)
    filter: Mapped[str] = mapped_column(Text)
    active: Mapped[bool] = mapped_column(Boolean)
    #: May the URL name a private or loopback address (an operator's choice, admins only).
    allow_private: Mapped[bool] = mapped_column(Boolean)
    #: The id of the last event this webhook has been offered (delivered, skipped or dead).
    position: Mapped[int] = mapped_column(Integer)
    lease_owner: Mapped[str | None] = mapped_column(String(32), nullable=True)
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    created_by: Mapped[str] = mapped_column(String(256))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    #: What a delivery's body is: "shamal" (the event's JSON) or "mlflow" (MLflow 3's
    #: payload, for receivers written against MLflow's webhooks).
    format: Mapped[str] = mapped_column(String(16), server_default="shamal")
    description: Mapped[str | None] = mapped_column(Text, nullable=True)
    #: An MLflow-format webhook's events as MLflow names them ("model_version.created"),
    #: in the order given: the filter is built from them, the MLflow API shows them.
    mlflow_events: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)


class WebhookDeliveryRow(Base):
    """One attempt to deliver one event to one webhook."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        UniqueConstraint("webhook_id", "event_id", "attempt"),
        Index("ix_webhook_deliveries_webhook_id_id", "webhook_id", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    webhook_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("webhooks.id", ondelete="CASCADE")
    )
    event_id: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    ok: Mapped[bool] = mapped_column(Boolean)
    #: This failed attempt was the last: the webhook moved on without the event.
    dead: Mapped[bool] = mapped_column(Boolean)
    error: Mapped[str] = mapped_column(String(300))
    #: When the next attempt is due (a failure with attempts left), else None.
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
