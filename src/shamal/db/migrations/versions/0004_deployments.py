"""deployments

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import shamal.db.models._base

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "deployments",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("team_id", sa.String(length=32), nullable=True),
        sa.Column("team_name", sa.String(length=64), nullable=False),
        sa.Column("created_by", sa.String(length=256), nullable=False),
        sa.Column("created_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.Column("updated_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("routes", sa.JSON(), nullable=False),
        sa.Column("slo_max_error_rate", sa.Float(), nullable=False),
        sa.Column("slo_max_p99_ms", sa.Float(), nullable=False),
        sa.Column("slo_min_requests", sa.Integer(), nullable=False),
        sa.Column("steps", sa.JSON(), nullable=False),
        sa.Column("interval_s", sa.Float(), nullable=False),
        sa.Column("sticky_header", sa.String(length=64), nullable=False),
        sa.Column("sample_rate", sa.Float(), nullable=False),
        sa.Column("phase", sa.String(length=16), nullable=False),
        sa.Column("canary_weight", sa.Integer(), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("phase_since", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["team_id"],
            ["teams.id"],
            name=op.f("fk_deployments_team_id_teams"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deployments")),
        sa.UniqueConstraint("name", name=op.f("uq_deployments_name")),
    )
    op.create_table(
        "deployment_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("deployment_id", sa.String(length=32), nullable=False),
        sa.Column("at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("actor", sa.String(length=256), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["deployment_id"],
            ["deployments.id"],
            name=op.f("fk_deployment_events_deployment_id_deployments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deployment_events")),
    )
    with op.batch_alter_table("deployment_events", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_deployment_events_deployment_id"), ["deployment_id"], unique=False
        )

    op.create_table(
        "deployment_samples",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("deployment_id", sa.String(length=32), nullable=False),
        sa.Column("at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(length=16), nullable=False),
        sa.Column("shadow", sa.Boolean(), nullable=False),
        sa.Column("inputs", sa.JSON(), nullable=False),
        sa.Column("outputs", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["deployment_id"],
            ["deployments.id"],
            name=op.f("fk_deployment_samples_deployment_id_deployments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deployment_samples")),
    )
    with op.batch_alter_table("deployment_samples", schema=None) as batch_op:
        batch_op.create_index(
            "ix_deployment_samples_deployment_id_id", ["deployment_id", "id"], unique=False
        )

    op.create_table(
        "deployment_stats",
        sa.Column("deployment_id", sa.String(length=32), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(length=16), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("errors", sa.BigInteger(), nullable=False),
        sa.Column("latency_counts", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["deployment_id"],
            ["deployments.id"],
            name=op.f("fk_deployment_stats_deployment_id_deployments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "deployment_id", "revision", "version", name=op.f("pk_deployment_stats")
        ),
    )


def downgrade() -> None:
    op.drop_table("deployment_stats")
    with op.batch_alter_table("deployment_samples", schema=None) as batch_op:
        batch_op.drop_index("ix_deployment_samples_deployment_id_id")

    op.drop_table("deployment_samples")
    with op.batch_alter_table("deployment_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_deployment_events_deployment_id"))

    op.drop_table("deployment_events")
    op.drop_table("deployments")
