"""pipelines: versions, runs, steps, the step cache and schedules

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import shamal.db.models._base

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "pipeline_cache",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("pipeline", sa.String(length=64), nullable=False),
        sa.Column("step", sa.String(length=64), nullable=False),
        sa.Column("parts", sa.JSON(), nullable=False),
        sa.Column("output", sa.JSON(), nullable=True),
        sa.Column("source", sa.String(length=120), nullable=False),
        sa.Column("created_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_pipeline_cache")),
    )
    with op.batch_alter_table("pipeline_cache", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_pipeline_cache_created_at"), ["created_at"], unique=False
        )

    op.create_table(
        "pipelines",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("team_id", sa.String(length=32), nullable=True),
        sa.Column("team_name", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(length=256), nullable=False),
        sa.Column("created_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.Column("updated_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["team_id"], ["teams.id"], name=op.f("fk_pipelines_team_id_teams"), ondelete="RESTRICT"
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_pipelines")),
    )
    op.create_table(
        "pipeline_runs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("pipeline", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("trigger", sa.String(length=300), nullable=False),
        sa.Column("trigger_key", sa.String(length=120), nullable=True),
        sa.Column("user", sa.String(length=256), nullable=False),
        sa.Column("team_name", sa.String(length=64), nullable=False),
        sa.Column("retry_of", sa.String(length=32), nullable=True),
        sa.Column("experiment_id", sa.String(length=32), nullable=True),
        sa.Column("mlflow_run_id", sa.String(length=32), nullable=True),
        sa.Column("lease_owner", sa.String(length=64), nullable=True),
        sa.Column("lease_until", shamal.db.models._base.UTCDateTime(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.Column("finished_at", shamal.db.models._base.UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["pipeline"],
            ["pipelines.name"],
            name=op.f("fk_pipeline_runs_pipeline_pipelines"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pipeline_runs")),
        sa.UniqueConstraint("pipeline", "trigger_key", name=op.f("uq_pipeline_runs_pipeline")),
    )
    with op.batch_alter_table("pipeline_runs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_pipeline_runs_pipeline"), ["pipeline"], unique=False)
        batch_op.create_index(batch_op.f("ix_pipeline_runs_state"), ["state"], unique=False)

    op.create_table(
        "pipeline_schedules",
        sa.Column("pipeline", sa.String(length=64), nullable=False),
        sa.Column("trigger", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("expression", sa.String(length=300), nullable=False),
        sa.Column("last_tick", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["pipeline"],
            ["pipelines.name"],
            name=op.f("fk_pipeline_schedules_pipeline_pipelines"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("pipeline", "trigger", name=op.f("pk_pipeline_schedules")),
    )
    op.create_table(
        "pipeline_versions",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("snapshot", sa.String(length=64), nullable=True),
        sa.Column("created_by", sa.String(length=256), nullable=False),
        sa.Column("created_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["name"],
            ["pipelines.name"],
            name=op.f("fk_pipeline_versions_name_pipelines"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("name", "version", name=op.f("pk_pipeline_versions")),
    )
    op.create_table(
        "pipeline_steps",
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=80), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("index", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("args", sa.JSON(), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("cache_key", sa.String(length=64), nullable=True),
        sa.Column("cache_parts", sa.JSON(), nullable=True),
        sa.Column("cached_from", sa.String(length=120), nullable=True),
        sa.Column("cache_note", sa.Text(), nullable=False),
        sa.Column("output", sa.JSON(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("fan_out", sa.Integer(), nullable=True),
        sa.Column("mlflow_run_id", sa.String(length=32), nullable=True),
        sa.Column("ready_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.Column("started_at", shamal.db.models._base.UTCDateTime(), nullable=True),
        sa.Column("finished_at", shamal.db.models._base.UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["pipeline_runs.id"],
            name=op.f("fk_pipeline_steps_run_id_pipeline_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_id", "key", name=op.f("pk_pipeline_steps")),
    )
    with op.batch_alter_table("pipeline_steps", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_pipeline_steps_job_id"), ["job_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("pipeline_steps", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_pipeline_steps_job_id"))

    op.drop_table("pipeline_steps")
    op.drop_table("pipeline_versions")
    op.drop_table("pipeline_schedules")
    with op.batch_alter_table("pipeline_runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_pipeline_runs_state"))
        batch_op.drop_index(batch_op.f("ix_pipeline_runs_pipeline"))

    op.drop_table("pipeline_runs")
    op.drop_table("pipelines")
    with op.batch_alter_table("pipeline_cache", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_pipeline_cache_created_at"))

    op.drop_table("pipeline_cache")
