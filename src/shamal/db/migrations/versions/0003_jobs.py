"""jobs

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import shamal.db.models._base

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("team_id", sa.String(length=32), nullable=True),
        sa.Column("team_name", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.String(length=256), nullable=False),
        sa.Column("command", sa.JSON(), nullable=False),
        sa.Column("env", sa.JSON(), nullable=False),
        sa.Column("snapshot", sa.String(length=64), nullable=True),
        sa.Column("cpu_milli", sa.Integer(), nullable=False),
        sa.Column("memory_mib", sa.Integer(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("gpu_milli", sa.Integer(), nullable=False),
        sa.Column("mig_profile", sa.String(length=32), nullable=True),
        sa.Column("gpu_models", sa.JSON(), nullable=False),
        sa.Column("workers", sa.Integer(), nullable=False),
        sa.Column("pool", sa.String(length=64), nullable=True),
        sa.Column("priority", sa.String(length=32), nullable=False),
        sa.Column("priority_value", sa.Integer(), nullable=False),
        sa.Column("time_limit_s", sa.Float(), nullable=True),
        sa.Column("max_retries", sa.Integer(), nullable=False),
        sa.Column("retries_used", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("submitted_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.Column("updated_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.Column("started_at", shamal.db.models._base.UTCDateTime(), nullable=True),
        sa.Column("finished_at", shamal.db.models._base.UTCDateTime(), nullable=True),
        sa.Column("placement", sa.JSON(), nullable=True),
        sa.Column("handle", sa.JSON(), nullable=True),
        sa.Column("claimed_by", sa.String(length=128), nullable=True),
        sa.Column("stop_request", sa.String(length=16), nullable=True),
        sa.Column("attained_s", sa.Float(), nullable=False),
        sa.Column("preemptions", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("predicted_s", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["team_id"], ["teams.id"], name=op.f("fk_jobs_team_id_teams"), ondelete="RESTRICT"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_jobs_claimed_by"), ["claimed_by"], unique=False)
        batch_op.create_index("ix_jobs_state_priority", ["state", "priority_value"], unique=False)
        batch_op.create_index(
            "ix_jobs_team_name_submitted_at", ["team_name", "submitted_at"], unique=False
        )

    op.create_table(
        "job_attempts",
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("team_name", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.String(length=256), nullable=False),
        sa.Column("pool", sa.String(length=64), nullable=False),
        sa.Column("nodes", sa.String(length=1024), nullable=False),
        sa.Column("cpu_milli", sa.Integer(), nullable=False),
        sa.Column("memory_mib", sa.Integer(), nullable=False),
        sa.Column("gpu_milli", sa.Integer(), nullable=False),
        sa.Column("started_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.Column("ended_at", shamal.db.models._base.UTCDateTime(), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_attempts_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "attempt", name=op.f("pk_job_attempts")),
    )
    with op.batch_alter_table("job_attempts", schema=None) as batch_op:
        batch_op.create_index("ix_job_attempts_started_at", ["started_at"], unique=False)

    op.create_table(
        "job_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.Column("to_state", sa.String(length=16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("actor", sa.String(length=256), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_events_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_events")),
    )
    with op.batch_alter_table("job_events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_events_job_id"), ["job_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("job_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_events_job_id"))

    op.drop_table("job_events")
    with op.batch_alter_table("job_attempts", schema=None) as batch_op:
        batch_op.drop_index("ix_job_attempts_started_at")

    op.drop_table("job_attempts")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_team_name_submitted_at")
        batch_op.drop_index("ix_jobs_state_priority")
        batch_op.drop_index(batch_op.f("ix_jobs_claimed_by"))

    op.drop_table("jobs")
