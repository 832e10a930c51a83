"""metrics: the (model_id, key) index holds only the points logged against a model

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-22

Most metric points belong to no logged model (``model_id`` NULL), yet every one of them
had an entry in ``ix_metrics_model_key``: a second copy of every key, written by every
``log_batch`` (a batch over 100 keys dirtied some 100 more index pages) and never read,
since the logged-model lookups it serves always compare ``model_id`` with a value. The
index is now partial (``WHERE model_id IS NOT NULL``), which both SQLite and PostgreSQL
still use for those lookups.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None

_WHERE = sa.text("model_id IS NOT NULL")


def upgrade() -> None:
    op.drop_index("ix_metrics_model_key", table_name="metrics")
    op.create_index(
        "ix_metrics_model_key",
        "metrics",
        ["model_id", "key"],
        unique=False,
        sqlite_where=_WHERE,
        postgresql_where=_WHERE,
    )


def downgrade() -> None:
    op.drop_index("ix_metrics_model_key", table_name="metrics")
    op.create_index("ix_metrics_model_key", "metrics", ["model_id", "key"], unique=False)
