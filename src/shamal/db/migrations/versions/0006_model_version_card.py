"""model versions: formats and signature

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # Versions registered before this revision have no card: no formats, no signature.
    with op.batch_alter_table("model_versions", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("formats", sa.String(length=2048), server_default="", nullable=False)
        )
        batch_op.add_column(sa.Column("signature", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("model_versions", schema=None) as batch_op:
        batch_op.drop_column("signature")
        batch_op.drop_column("formats")
