"""tracking and registry

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "experiments",
        sa.Column(
            "experiment_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("artifact_location", sa.String(length=1024), nullable=False),
        sa.Column("lifecycle_stage", sa.String(length=16), nullable=False),
        sa.Column("creation_time", sa.BigInteger(), nullable=False),
        sa.Column("last_update_time", sa.BigInteger(), nullable=False),
        sa.Column("team_id", sa.String(length=32), nullable=True),
        sa.ForeignKeyConstraint(
            ["team_id"],
            ["teams.id"],
            name=op.f("fk_experiments_team_id_teams"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("experiment_id", name=op.f("pk_experiments")),
        sa.UniqueConstraint("name", name=op.f("uq_experiments_name")),
    )
    # MLflow clients expect experiment "0", named Default, to exist.
    now_ms = int(time.time() * 1000)
    op.bulk_insert(
        sa.table(
            "experiments",
            sa.column("experiment_id"),
            sa.column("name"),
            sa.column("artifact_location"),
            sa.column("lifecycle_stage"),
            sa.column("creation_time"),
            sa.column("last_update_time"),
        ),
        [
            {
                "experiment_id": 0,
                "name": "Default",
                "artifact_location": "mlflow-artifacts:/0",
                "lifecycle_stage": "active",
                "creation_time": now_ms,
                "last_update_time": now_ms,
            }
        ],
    )
    with op.batch_alter_table("experiments", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_experiments_team_id"), ["team_id"], unique=False)

    op.create_table(
        "registered_models",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("creation_timestamp", sa.BigInteger(), nullable=False),
        sa.Column("last_updated_timestamp", sa.BigInteger(), nullable=False),
        sa.Column("user_id", sa.String(length=256), nullable=False),
        sa.Column("next_version", sa.Integer(), nullable=False),
        sa.Column("team_id", sa.String(length=32), nullable=True),
        sa.ForeignKeyConstraint(
            ["team_id"],
            ["teams.id"],
            name=op.f("fk_registered_models_team_id_teams"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_registered_models")),
        sa.UniqueConstraint("name", name=op.f("uq_registered_models_name")),
    )
    with op.batch_alter_table("registered_models", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_registered_models_team_id"), ["team_id"], unique=False)

    op.create_table(
        "datasets",
        sa.Column("dataset_id", sa.String(length=32), nullable=False),
        sa.Column(
            "experiment_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("name", sa.String(length=500), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("source_type", sa.String(length=64), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("schema", sa.Text(), nullable=True),
        sa.Column("profile", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.experiment_id"],
            name=op.f("fk_datasets_experiment_id_experiments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("dataset_id", name=op.f("pk_datasets")),
    )
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.create_index(
            "uq_datasets_exp_name_digest", ["experiment_id", "name", "digest"], unique=True
        )

    op.create_table(
        "experiment_tags",
        sa.Column(
            "experiment_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("key", sa.String(length=250), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.experiment_id"],
            name=op.f("fk_experiment_tags_experiment_id_experiments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("experiment_id", "key", name=op.f("pk_experiment_tags")),
    )
    op.create_table(
        "logged_models",
        sa.Column("model_id", sa.String(length=64), nullable=False),
        sa.Column(
            "experiment_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("name", sa.String(length=500), nullable=False),
        sa.Column("artifact_location", sa.String(length=1024), nullable=False),
        sa.Column("creation_timestamp_ms", sa.BigInteger(), nullable=False),
        sa.Column("last_updated_timestamp_ms", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("lifecycle_stage", sa.String(length=16), nullable=False),
        sa.Column("model_type", sa.String(length=500), nullable=True),
        sa.Column("source_run_id", sa.String(length=32), nullable=True),
        sa.Column("status_message", sa.Text(), nullable=True),
        sa.Column("creator_id", sa.String(length=256), nullable=True),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.experiment_id"],
            name=op.f("fk_logged_models_experiment_id_experiments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("model_id", name=op.f("pk_logged_models")),
    )
    with op.batch_alter_table("logged_models", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_logged_models_experiment_id"), ["experiment_id"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_logged_models_source_run_id"), ["source_run_id"], unique=False
        )

    op.create_table(
        "model_versions",
        sa.Column("model_id", sa.String(length=32), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("creation_timestamp", sa.BigInteger(), nullable=False),
        sa.Column("last_updated_timestamp", sa.BigInteger(), nullable=False),
        sa.Column("user_id", sa.String(length=256), nullable=False),
        sa.Column("current_stage", sa.String(length=20), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("source", sa.String(length=1024), nullable=False),
        sa.Column("storage_location", sa.String(length=1024), nullable=False),
        sa.Column("run_id", sa.String(length=32), nullable=True),
        sa.Column("run_link", sa.String(length=1024), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("status_message", sa.Text(), nullable=False),
        sa.Column("logged_model_id", sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["registered_models.id"],
            name=op.f("fk_model_versions_model_id_registered_models"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("model_id", "version", name=op.f("pk_model_versions")),
    )
    with op.batch_alter_table("model_versions", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_model_versions_logged_model_id"), ["logged_model_id"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_model_versions_run_id"), ["run_id"], unique=False)

    op.create_table(
        "registered_model_tags",
        sa.Column("model_id", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=250), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["registered_models.id"],
            name=op.f("fk_registered_model_tags_model_id_registered_models"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("model_id", "key", name=op.f("pk_registered_model_tags")),
    )
    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column(
            "experiment_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("name", sa.String(length=250), nullable=False),
        sa.Column("user_id", sa.String(length=256), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("start_time", sa.BigInteger(), nullable=False),
        sa.Column("end_time", sa.BigInteger(), nullable=True),
        sa.Column("lifecycle_stage", sa.String(length=16), nullable=False),
        sa.Column("artifact_uri", sa.String(length=1024), nullable=False),
        sa.Column("deleted_time", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.experiment_id"],
            name=op.f("fk_runs_experiment_id_experiments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_runs")),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index(
            "ix_runs_experiment_start", ["experiment_id", "start_time"], unique=False
        )

    op.create_table(
        "latest_metrics",
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=250), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("timestamp", sa.BigInteger(), nullable=False),
        sa.Column("value", sa.Float(precision=53), nullable=False),
        sa.Column("is_nan", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.run_id"],
            name=op.f("fk_latest_metrics_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_id", "key", name=op.f("pk_latest_metrics")),
    )
    with op.batch_alter_table("latest_metrics", schema=None) as batch_op:
        batch_op.create_index("ix_latest_metrics_key_value", ["key", "value"], unique=False)

    op.create_table(
        "logged_model_params",
        sa.Column("model_id", sa.String(length=64), nullable=False),
        sa.Column("key", sa.String(length=250), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["logged_models.model_id"],
            name=op.f("fk_logged_model_params_model_id_logged_models"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("model_id", "key", name=op.f("pk_logged_model_params")),
    )
    op.create_table(
        "logged_model_tags",
        sa.Column("model_id", sa.String(length=64), nullable=False),
        sa.Column("key", sa.String(length=250), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["logged_models.model_id"],
            name=op.f("fk_logged_model_tags_model_id_logged_models"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("model_id", "key", name=op.f("pk_logged_model_tags")),
    )
    op.create_table(
        "metrics",
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=250), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("timestamp", sa.BigInteger(), nullable=False),
        sa.Column("value", sa.Float(precision=53), nullable=False),
        sa.Column("is_nan", sa.Boolean(), nullable=False),
        sa.Column("model_id", sa.String(length=64), nullable=True),
        sa.Column("dataset_name", sa.String(length=500), nullable=True),
        sa.Column("dataset_digest", sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.run_id"], name=op.f("fk_metrics_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint(
            "run_id", "key", "step", "timestamp", "value", "is_nan", name=op.f("pk_metrics")
        ),
    )
    op.create_index("ix_metrics_model_key", "metrics", ["model_id", "key"], unique=False)
    op.create_table(
        "model_version_tags",
        sa.Column("model_id", sa.String(length=32), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=250), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_id", "version"],
            ["model_versions.model_id", "model_versions.version"],
            name=op.f("fk_model_version_tags_model_id_model_versions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("model_id", "version", "key", name=op.f("pk_model_version_tags")),
    )
    op.create_table(
        "registered_model_aliases",
        sa.Column("model_id", sa.String(length=32), nullable=False),
        sa.Column("alias", sa.String(length=256), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_id", "version"],
            ["model_versions.model_id", "model_versions.version"],
            name=op.f("fk_registered_model_aliases_model_id_model_versions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("model_id", "alias", name=op.f("pk_registered_model_aliases")),
    )
    op.create_table(
        "run_inputs",
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("dataset_id", sa.String(length=32), nullable=False),
        sa.Column("tags", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["dataset_id"],
            ["datasets.dataset_id"],
            name=op.f("fk_run_inputs_dataset_id_datasets"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.run_id"], name=op.f("fk_run_inputs_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "dataset_id", name=op.f("pk_run_inputs")),
    )
    with op.batch_alter_table("run_inputs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_run_inputs_dataset_id"), ["dataset_id"], unique=False)

    op.create_table(
        "run_model_links",
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("model_id", sa.String(length=64), nullable=False),
        sa.Column("direction", sa.String(length=8), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.run_id"],
            name=op.f("fk_run_model_links_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_id", "model_id", "direction", name=op.f("pk_run_model_links")),
    )
    with op.batch_alter_table("run_model_links", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_run_model_links_model_id"), ["model_id"], unique=False)

    op.create_table(
        "run_params",
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=250), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.run_id"], name=op.f("fk_run_params_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "key", name=op.f("pk_run_params")),
    )
    op.create_table(
        "run_tags",
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=250), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.run_id"], name=op.f("fk_run_tags_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "key", name=op.f("pk_run_tags")),
    )


def downgrade() -> None:
    op.drop_table("run_tags")
    op.drop_table("run_params")
    with op.batch_alter_table("run_model_links", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_run_model_links_model_id"))

    op.drop_table("run_model_links")
    with op.batch_alter_table("run_inputs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_run_inputs_dataset_id"))

    op.drop_table("run_inputs")
    op.drop_table("registered_model_aliases")
    op.drop_table("model_version_tags")
    op.drop_index("ix_metrics_model_key", table_name="metrics")
    op.drop_table("metrics")
    op.drop_table("logged_model_tags")
    op.drop_table("logged_model_params")
    with op.batch_alter_table("latest_metrics", schema=None) as batch_op:
        batch_op.drop_index("ix_latest_metrics_key_value")

    op.drop_table("latest_metrics")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index("ix_runs_experiment_start")

    op.drop_table("runs")
    op.drop_table("registered_model_tags")
    with op.batch_alter_table("model_versions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_model_versions_run_id"))
        batch_op.drop_index(batch_op.f("ix_model_versions_logged_model_id"))

    op.drop_table("model_versions")
    with op.batch_alter_table("logged_models", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_logged_models_source_run_id"))
        batch_op.drop_index(batch_op.f("ix_logged_models_experiment_id"))

    op.drop_table("logged_models")
    op.drop_table("experiment_tags")
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.drop_index("uq_datasets_exp_name_digest")

    op.drop_table("datasets")
    with op.batch_alter_table("registered_models", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_registered_models_team_id"))

    op.drop_table("registered_models")
    with op.batch_alter_table("experiments", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_experiments_team_id"))

    op.drop_table("experiments")
