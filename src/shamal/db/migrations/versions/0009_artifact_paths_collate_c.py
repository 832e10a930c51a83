"""artifact_files.path compares as code points on PostgreSQL (COLLATE "C")

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-22

Listing and deleting a folder read the range of paths from "<folder>/" up to "<folder>/"
followed by the last code point. Under the database's own collation (a cluster made with
en_US.UTF-8 or an ICU language locale, as most are) that range also holds other folders'
paths: "A/x" sorts inside the range of "a/", so deleting folder "a" deleted "A/x" too.
With the "C" collation the range is exactly the folder, as it always was on SQLite
(BINARY). The primary key index is rebuilt by the type change.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | None = None
depends_on: str | None = None


def _set_collation(collation: str | None) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return  # SQLite compares text as bytes (code points) already
    op.alter_column(
        "artifact_files",
        "path",
        type_=sa.String(1024, collation=collation),
        existing_type=sa.String(1024),
        existing_nullable=False,
    )


def upgrade() -> None:
    _set_collation("C")


def downgrade() -> None:
    _set_collation("default")
