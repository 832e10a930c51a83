"""Alembic migrations shipped inside the package, applied on start and by `shamal db upgrade`."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, text

from shamal.db._uow import Database

logger = logging.getLogger(__name__)

# Two servers starting at once against one PostgreSQL take turns migrating.
_PG_MIGRATION_LOCK = 0x5348414D  # "SHAM"


def _config(connection: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", "shamal.db:migrations")
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    """The newest revision shipped with this version of Shamal."""
    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return head


def current_revision(db: Database) -> str | None:
    """The revision the database is at, or None for an empty database."""
    with db.engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


@contextmanager
def _migration_lock(connection: Connection) -> Iterator[None]:
    if connection.dialect.name != "postgresql":
        yield
        return
    connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _PG_MIGRATION_LOCK})
    connection.commit()
    try:
        yield
    finally:
        connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_MIGRATION_LOCK})
        connection.commit()


def upgrade(db: Database, revision: str = "head") -> tuple[str | None, str]:
    """Bring the schema to ``revision``; returns (revision before, revision after)."""
    before = current_revision(db)
    with db.engine.connect() as connection, _migration_lock(connection):
        command.upgrade(_config(connection), revision)
        connection.commit()
    after = current_revision(db)
    assert after is not None
    if before != after:
        logger.info("database migrated from %s to %s", before or "empty", after)
    return before, after
