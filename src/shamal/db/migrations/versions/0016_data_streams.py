"""data streams: idempotency keys of streamed records, and parked (dead-letter) records

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import shamal.db.models._base

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "data_stream_keys",
        sa.Column("dataset_id", sa.String(length=32), nullable=False),
        sa.Column("stream", sa.String(length=256), nullable=False),
        sa.Column("key", sa.String(length=256), nullable=False),
        sa.Column("version", sa.Integer(), nullable=True),
        sa.Column("created_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["dataset_id"], ["data_sets.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("dataset_id", "stream", "key"),
    )
    op.create_table(
        "data_dead_letters",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("dataset_id", sa.String(length=32), nullable=False),
        sa.Column("stream", sa.String(length=256), nullable=False),
        sa.Column("key", sa.String(length=256), nullable=False),
        sa.Column("reason", sa.String(length=500), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("created_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["dataset_id"], ["data_sets.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("data_dead_letters", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_data_dead_letters_dataset_id"), ["dataset_id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("data_dead_letters", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_data_dead_letters_dataset_id"))
    op.drop_table("data_dead_letters")
    op.drop_table("data_stream_keys")
