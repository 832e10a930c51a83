"""snapshot owners and team invitations

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02

A code snapshot is a content-addressed blob, stored once whoever uploads it; the right to run
it is per team (``snapshot_owners``), so a digest learned from another team answers 404. The
snapshots that jobs already ran keep working: each (snapshot, team) of an existing job is an
owner from the start.

A team admin who adds an account now invites it (``team_invitations``); the account joins when
it accepts.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from shamal.db.models import UTCDateTime

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "snapshot_owners",
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("team_id", sa.String(length=32), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("digest", "team_id"),
    )
    op.create_index("ix_snapshot_owners_team_id", "snapshot_owners", ["team_id"], unique=False)
    op.execute(
        "INSERT INTO snapshot_owners (digest, team_id, created_at) "
        "SELECT snapshot, team_id, min(submitted_at) FROM jobs "
        "WHERE snapshot IS NOT NULL AND team_id IS NOT NULL GROUP BY snapshot, team_id"
    )
    op.create_table(
        "team_invitations",
        sa.Column("team_id", sa.String(length=32), nullable=False),
        sa.Column("user_id", sa.String(length=32), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("invited_by", sa.String(length=64), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("team_id", "user_id"),
    )
    op.create_index("ix_team_invitations_user_id", "team_invitations", ["user_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_team_invitations_user_id", table_name="team_invitations")
    op.drop_table("team_invitations")
    op.drop_index("ix_snapshot_owners_team_id", table_name="snapshot_owners")
    op.drop_table("snapshot_owners")
