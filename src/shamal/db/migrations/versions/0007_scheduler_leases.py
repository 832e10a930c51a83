"""scheduler leases: heartbeats of live scheduler processes

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import shamal.db.models._base

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "schedulers",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("host", sa.String(length=256), nullable=False),
        sa.Column("started_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.Column("heartbeat_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_schedulers")),
    )


def downgrade() -> None:
    op.drop_table("schedulers")
