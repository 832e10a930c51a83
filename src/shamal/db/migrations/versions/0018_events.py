"""events: the outbox of events, consumer positions, webhooks and their delivery log

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import shamal.db.models._base

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("subject", sa.String(length=300), nullable=False),
        sa.Column("team_name", sa.String(length=64), nullable=True),
        sa.Column("actor", sa.String(length=256), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("created_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        # Ids are never reused, even after the newest rows are deleted.
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.create_index("ix_events_kind_id", ["kind", "id"], unique=False)
        batch_op.create_index("ix_events_team_name_id", ["team_name", "id"], unique=False)
    op.create_table(
        "event_consumers",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("lease_owner", sa.String(length=32), nullable=True),
        sa.Column("lease_until", shamal.db.models._base.UTCDateTime(), nullable=True),
        sa.Column("updated_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "webhooks",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("team_id", sa.String(length=32), nullable=True),
        sa.Column("team_name", sa.String(length=64), nullable=False),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("sealed_secret", sa.Text(), nullable=False),
        sa.Column("filter", sa.Text(), nullable=False),
        sa.Column("active", sa.Boolean(), nullable=False),
        sa.Column("allow_private", sa.Boolean(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("lease_owner", sa.String(length=32), nullable=True),
        sa.Column("lease_until", shamal.db.models._base.UTCDateTime(), nullable=True),
        sa.Column("created_by", sa.String(length=256), nullable=False),
        sa.Column("created_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.Column("updated_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("team_name", "name"),
    )
    with op.batch_alter_table("webhooks", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_webhooks_team_id"), ["team_id"], unique=False)
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("webhook_id", sa.String(length=32), nullable=False),
        sa.Column("event_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("dead", sa.Boolean(), nullable=False),
        sa.Column("error", sa.String(length=300), nullable=False),
        sa.Column("next_attempt_at", shamal.db.models._base.UTCDateTime(), nullable=True),
        sa.Column("delivered_at", shamal.db.models._base.UTCDateTime(), nullable=True),
        sa.Column("created_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["webhook_id"], ["webhooks.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("webhook_id", "event_id", "attempt"),
    )
    with op.batch_alter_table("webhook_deliveries", schema=None) as batch_op:
        batch_op.create_index(
            "ix_webhook_deliveries_webhook_id_id", ["webhook_id", "id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("webhook_deliveries", schema=None) as batch_op:
        batch_op.drop_index("ix_webhook_deliveries_webhook_id_id")
    op.drop_table("webhook_deliveries")
    with op.batch_alter_table("webhooks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_webhooks_team_id"))
    op.drop_table("webhooks")
    op.drop_table("event_consumers")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index("ix_events_team_name_id")
        batch_op.drop_index("ix_events_kind_id")
    op.drop_table("events")
