"""data residency: a dataset's allowed regions, the stores holding its parts, and the
datasets a job reads with the regions it may run in

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import shamal.db.models._base

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("data_sets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("regions", sa.JSON(), nullable=True))
    op.create_table(
        "data_part_stores",
        sa.Column("dataset_id", sa.String(length=32), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("store", sa.String(length=64), nullable=False),
        sa.Column("created_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["dataset_id"], ["data_sets.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("dataset_id", "digest", "store"),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("datasets", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("regions", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("regions")
        batch_op.drop_column("datasets")
    op.drop_table("data_part_stores")
    with op.batch_alter_table("data_sets", schema=None) as batch_op:
        batch_op.drop_column("regions")
