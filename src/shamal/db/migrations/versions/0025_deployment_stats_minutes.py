"""deployments: calls per version and minute, for the latency and error charts

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import shamal.db.models._base

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "deployment_stats_minutes",
        sa.Column("deployment_id", sa.String(length=32), nullable=False),
        sa.Column("minute", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.Column("version", sa.String(length=16), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("errors", sa.BigInteger(), nullable=False),
        sa.Column("latency_counts", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["deployment_id"],
            ["deployments.id"],
            name=op.f("fk_deployment_stats_minutes_deployment_id_deployments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "deployment_id", "minute", "version", name=op.f("pk_deployment_stats_minutes")
        ),
    )


def downgrade() -> None:
    op.drop_table("deployment_stats_minutes")
