"""token scope: tokens for one deployment

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26

A token may be scoped to one deployment (``deployment:<name>``): the callers of a model server
get a token that can call that deployment's models and nothing else. The scope column grows to
hold the name.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.alter_column(
            "scope",
            existing_type=sa.String(length=16),
            type_=sa.String(length=96),
            existing_nullable=False,
            existing_server_default="full",
        )


def downgrade() -> None:
    # A deployment token cannot be kept in 16 characters: it is revoked for good.
    op.execute("DELETE FROM api_tokens WHERE scope LIKE 'deployment:%'")
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.alter_column(
            "scope",
            existing_type=sa.String(length=96),
            type_=sa.String(length=16),
            existing_nullable=False,
            existing_server_default="full",
        )
