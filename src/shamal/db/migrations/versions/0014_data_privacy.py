"""data privacy: a dataset's privacy policy, erasures of data subjects, the privacy-officer grant

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import shamal.db.models._base

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("privacy_officer", sa.Boolean(), server_default=sa.false(), nullable=False)
        )
    with op.batch_alter_table("data_sets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("privacy", sa.JSON(), nullable=True))
    op.create_table(
        "data_erasures",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("dataset_id", sa.String(length=32), nullable=False),
        sa.Column("column", sa.String(length=256), nullable=False),
        sa.Column("subject_hash", sa.String(length=160), nullable=False),
        sa.Column("rows_removed", sa.BigInteger(), nullable=False),
        sa.Column("versions", sa.JSON(), nullable=False),
        sa.Column("created_by", sa.String(length=256), nullable=False),
        sa.Column("created_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["dataset_id"], ["data_sets.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("data_erasures", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_data_erasures_dataset_id"), ["dataset_id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("data_erasures", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_data_erasures_dataset_id"))
    op.drop_table("data_erasures")
    with op.batch_alter_table("data_sets", schema=None) as batch_op:
        batch_op.drop_column("privacy")
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.drop_column("privacy_officer")
