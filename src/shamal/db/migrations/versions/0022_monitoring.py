"""monitoring: reference profiles, monitors, their results and per-column points

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import shamal.db.models._base

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "monitor_references",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("dataset", sa.String(length=64), nullable=True),
        sa.Column("dataset_version", sa.Integer(), nullable=True),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        sa.Column("columns", sa.JSON(), nullable=False),
        sa.Column("chunks", sa.JSON(), nullable=True),
        sa.Column("created_by", sa.String(length=256), nullable=False),
        sa.Column("created_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.Column("updated_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_monitor_references")),
        sa.UniqueConstraint("model", "version", name=op.f("uq_monitor_references_model")),
    )
    op.create_table(
        "monitors",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("deployment", sa.String(length=64), nullable=False),
        sa.Column("team_id", sa.String(length=32), nullable=True),
        sa.Column("team_name", sa.String(length=64), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("schedule_s", sa.Integer(), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("cursor", sa.BigInteger(), nullable=False),
        sa.Column("label_cursor", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("next_run_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.Column("lease_owner", sa.String(length=64), nullable=True),
        sa.Column("lease_until", shamal.db.models._base.UTCDateTime(), nullable=True),
        sa.Column("last_run_at", shamal.db.models._base.UTCDateTime(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("webhook_id", sa.String(length=32), nullable=True),
        sa.Column("created_by", sa.String(length=256), nullable=False),
        sa.Column("created_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.Column("updated_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["team_id"], ["teams.id"], name=op.f("fk_monitors_team_id_teams"), ondelete="RESTRICT"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_monitors")),
        sa.UniqueConstraint("name", name=op.f("uq_monitors_name")),
    )
    op.create_index(op.f("ix_monitors_deployment"), "monitors", ["deployment"], unique=False)
    op.create_index(op.f("ix_monitors_next_run_at"), "monitors", ["next_run_at"], unique=False)
    op.create_table(
        "monitor_results",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("monitor_id", sa.String(length=32), nullable=False),
        sa.Column("at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.Column("first_sample", sa.BigInteger(), nullable=False),
        sa.Column("last_sample", sa.BigInteger(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("rows", sa.Integer(), nullable=False),
        sa.Column("drifted", sa.Boolean(), nullable=False),
        sa.Column("share", sa.Float(), nullable=False),
        sa.Column("report", sa.JSON(), nullable=False),
        sa.Column("actions", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["monitor_id"],
            ["monitors.id"],
            name=op.f("fk_monitor_results_monitor_id_monitors"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_monitor_results")),
    )
    op.create_index(
        "ix_monitor_results_monitor_at", "monitor_results", ["monitor_id", "at"], unique=False
    )
    op.create_table(
        "monitor_points",
        sa.Column("result_id", sa.String(length=32), nullable=False),
        sa.Column("column", sa.String(length=256), nullable=False),
        sa.Column("monitor_id", sa.String(length=32), nullable=False),
        sa.Column("at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.Column("test", sa.String(length=32), nullable=False),
        sa.Column("statistic", sa.Float(), nullable=True),
        sa.Column("p_value", sa.Float(), nullable=True),
        sa.Column("threshold", sa.Float(), nullable=False),
        sa.Column("drifted", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["monitor_id"],
            ["monitors.id"],
            name=op.f("fk_monitor_points_monitor_id_monitors"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["result_id"],
            ["monitor_results.id"],
            name=op.f("fk_monitor_points_result_id_monitor_results"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("result_id", "column", name=op.f("pk_monitor_points")),
    )
    op.create_index(
        "ix_monitor_points_series", "monitor_points", ["monitor_id", "column", "at"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_monitor_points_series", table_name="monitor_points")
    op.drop_table("monitor_points")
    op.drop_index("ix_monitor_results_monitor_at", table_name="monitor_results")
    op.drop_table("monitor_results")
    op.drop_index(op.f("ix_monitors_next_run_at"), table_name="monitors")
    op.drop_index(op.f("ix_monitors_deployment"), table_name="monitors")
    op.drop_table("monitors")
    op.drop_table("monitor_references")
