"""The metadata database: engines, transactions and migrations.

Usage::

    db = open_database(settings.resolved_database_url)
    upgrade(db)
    with db.unit_of_work() as session:
        ...
"""

from __future__ import annotations

from shamal.db._checks import server_warnings
from shamal.db._engine import build_engine
from shamal.db._migrate import current_revision, head_revision, upgrade
from shamal.db._uow import Database, RetryableConflict, is_transient, is_unique_violation

__all__ = [
    "Database",
    "RetryableConflict",
    "current_revision",
    "head_revision",
    "is_transient",
    "is_unique_violation",
    "open_database",
    "server_warnings",
    "upgrade",
]


def open_database(url: str) -> Database:
    """Open (not migrate) the database at ``url``."""
    return Database(build_engine(url))
