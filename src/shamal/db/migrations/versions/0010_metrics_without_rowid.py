"""metrics: one B-tree per point on SQLite (WITHOUT ROWID)

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26

A point's primary key, (run_id, key, step, timestamp, value, is_nan), is nearly the whole row.
As a rowid table SQLite kept every point twice: once in the table, once in the primary key's
index, which history reads and the "an identical point again is a no-op" insert both use. A
WITHOUT ROWID table is that index and nothing more: the metrics take half the space, each
logged point writes one B-tree instead of two, and history reads walk the same order as before.

SQLite cannot change this in place, so the table is rebuilt (every point copied once, inside the
migration's transaction). PostgreSQL stores a heap and an index whatever it is told: no change.
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from alembic import op

# Alembic loads this file by path, so __name__ is not a package name a user would recognise.
logger = logging.getLogger("shamal.db.migrations")

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | None = None
depends_on: str | None = None

# In primary-key order: the new B-tree is filled from its left edge, page after page.
_COPY = """
INSERT INTO metrics_rebuilt
    (run_id, "key", step, timestamp, value, is_nan, model_id, dataset_name, dataset_digest)
SELECT run_id, "key", step, timestamp, value, is_nan, model_id, dataset_name, dataset_digest
FROM metrics
ORDER BY run_id, "key", step, timestamp, value, is_nan
"""
_WHERE = sa.text("model_id IS NOT NULL")


def _rebuild(*, with_rowid: bool) -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return
    points = bind.execute(sa.text("SELECT count(*) FROM metrics")).scalar_one()
    if points:  # a new database has none: nothing worth telling
        logger.info("migration 0010: rebuilding the metrics table, copying %s points", points)
    op.create_table(
        "metrics_rebuilt",
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
            ["run_id"], ["runs.run_id"], name="fk_metrics_run_id_runs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint(
            "run_id", "key", "step", "timestamp", "value", "is_nan", name="pk_metrics"
        ),
        sqlite_with_rowid=with_rowid,
    )
    op.execute(_COPY)
    op.drop_index("ix_metrics_model_key", table_name="metrics")
    op.drop_table("metrics")
    op.rename_table("metrics_rebuilt", "metrics")
    op.create_index(
        "ix_metrics_model_key", "metrics", ["model_id", "key"], unique=False, sqlite_where=_WHERE
    )


def upgrade() -> None:
    _rebuild(with_rowid=False)


def downgrade() -> None:
    _rebuild(with_rowid=True)
