"""model versions and logged models: whether the run they name was checked

A stock MLflow server takes a model version's ``run_id`` (and a logged model's
``source_run_id``) without looking the run up. Shamal now takes them too, and records
whether it could check the link: lineage follows only checked links. Rows written before
this revision were all checked (the run had to be readable), so they default to true.

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("model_versions", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("run_verified", sa.Boolean(), server_default=sa.true(), nullable=False)
        )
    with op.batch_alter_table("logged_models", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("source_run_verified", sa.Boolean(), server_default=sa.true(), nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("logged_models", schema=None) as batch_op:
        batch_op.drop_column("source_run_verified")
    with op.batch_alter_table("model_versions", schema=None) as batch_op:
        batch_op.drop_column("run_verified")
