"""features: the registry of definitions (every version), its applies, materializations, and
the feature service a deployment reads

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import shamal.db.models._base

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("feature_service", sa.String(length=64), nullable=True))
    op.create_table(
        "feature_applies",
        sa.Column("number", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("changes", sa.JSON(), nullable=False),
        sa.Column("created_by", sa.String(length=256), nullable=False),
        sa.Column("created_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("number"),
    )
    op.create_table(
        "feature_objects",
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("apply_number", sa.Integer(), nullable=False),
        sa.Column("team_id", sa.String(length=32), nullable=True),
        sa.Column("team_name", sa.String(length=64), nullable=False),
        sa.Column("definition", sa.JSON(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("deleted", sa.Boolean(), nullable=False),
        sa.Column("created_by", sa.String(length=256), nullable=False),
        sa.Column("created_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["apply_number"], ["feature_applies.number"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], ondelete="RESTRICT"),
        sa.PrimaryKeyConstraint("kind", "name", "version"),
    )
    with op.batch_alter_table("feature_objects", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_feature_objects_apply_number"), ["apply_number"], unique=False
        )
    op.create_table(
        "feature_materializations",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("view", sa.String(length=64), nullable=False),
        sa.Column("view_version", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(length=300), nullable=False),
        sa.Column("store", sa.String(length=64), nullable=False),
        sa.Column("start_ts", shamal.db.models._base.UTCDateTime(), nullable=True),
        sa.Column("end_ts", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("chunks_done", sa.Integer(), nullable=False),
        sa.Column("chunks_total", sa.Integer(), nullable=False),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_by", sa.String(length=256), nullable=False),
        sa.Column("started_at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.Column("finished_at", shamal.db.models._base.UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("feature_materializations", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_feature_materializations_view"), ["view"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("feature_materializations", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_feature_materializations_view"))
    op.drop_table("feature_materializations")
    with op.batch_alter_table("feature_objects", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_feature_objects_apply_number"))
    op.drop_table("feature_objects")
    op.drop_table("feature_applies")
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.drop_column("feature_service")
