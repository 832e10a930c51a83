"""datasets: governed tables owned by a team, their immutable versions, aliases and tags

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import shamal.db.models._base

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "data_sets",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("team_id", sa.String(length=32), nullable=True),
        sa.Column("team_name", sa.String(length=64), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("suite", sa.Text(), nullable=True),
        sa.Column("created_by", sa.String(length=256), nullable=False),
        sa.Column("created_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.Column("updated_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.Column("next_version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], ondelete="RESTRICT"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    op.create_table(
        "data_versions",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("dataset_id", sa.String(length=32), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("row_count", sa.BigInteger(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("schema", sa.JSON(), nullable=False),
        sa.Column("parts", sa.JSON(), nullable=False),
        sa.Column("source", sa.JSON(), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("profile", sa.JSON(), nullable=False),
        sa.Column("validation", sa.JSON(), nullable=True),
        sa.Column("transformations", sa.JSON(), nullable=False),
        sa.Column("created_by", sa.String(length=256), nullable=False),
        sa.Column("created_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["dataset_id"], ["data_sets.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("dataset_id", "version", name="uq_data_versions_number"),
    )
    with op.batch_alter_table("data_versions", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_data_versions_dataset_id"), ["dataset_id"], unique=False
        )
    op.create_table(
        "data_aliases",
        sa.Column("dataset_id", sa.String(length=32), nullable=False),
        sa.Column("alias", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("updated_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["dataset_id"], ["data_sets.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("dataset_id", "alias"),
    )
    op.create_table(
        "data_version_tags",
        sa.Column("version_id", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=250), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["version_id"], ["data_versions.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("version_id", "key"),
    )


def downgrade() -> None:
    op.drop_table("data_version_tags")
    op.drop_table("data_aliases")
    with op.batch_alter_table("data_versions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_data_versions_dataset_id"))
    op.drop_table("data_versions")
    op.drop_table("data_sets")
