"""webhooks: a delivery format (Shamal's event JSON or MLflow 3's payload), a description
and the MLflow events an MLflow-format webhook was made for

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("webhooks", schema=None) as batch_op:
        # Existing webhooks keep Shamal's format.
        batch_op.add_column(
            sa.Column("format", sa.String(length=16), server_default="shamal", nullable=False)
        )
        batch_op.add_column(sa.Column("description", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("mlflow_events", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("webhooks", schema=None) as batch_op:
        batch_op.drop_column("mlflow_events")
        batch_op.drop_column("description")
        batch_op.drop_column("format")
