"""deployment samples carry the caller's request id; labels posted later join them by it

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import shamal.db.models._base

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("deployment_samples", schema=None) as batch_op:
        batch_op.add_column(sa.Column("request_id", sa.String(length=128), nullable=True))
        batch_op.create_index(
            "ix_deployment_samples_deployment_id_request_id",
            ["deployment_id", "request_id"],
            unique=False,
        )
    op.create_table(
        "deployment_labels",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("deployment_id", sa.String(length=32), nullable=False),
        sa.Column("request_id", sa.String(length=128), nullable=False),
        sa.Column("value", sa.JSON(), nullable=False),
        sa.Column("at", shamal.db.models._base.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["deployment_id"],
            ["deployments.id"],
            name=op.f("fk_deployment_labels_deployment_id_deployments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deployment_labels")),
    )
    with op.batch_alter_table("deployment_labels", schema=None) as batch_op:
        batch_op.create_index(
            "ix_deployment_labels_deployment_id_request_id",
            ["deployment_id", "request_id"],
            unique=True,
        )


def downgrade() -> None:
    with op.batch_alter_table("deployment_labels", schema=None) as batch_op:
        batch_op.drop_index("ix_deployment_labels_deployment_id_request_id")
    op.drop_table("deployment_labels")
    with op.batch_alter_table("deployment_samples", schema=None) as batch_op:
        batch_op.drop_index("ix_deployment_samples_deployment_id_request_id")
        batch_op.drop_column("request_id")
