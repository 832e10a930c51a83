"""Engines for the two supported backends: SQLite (embedded) and PostgreSQL."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.pool import QueuePool

from shamal.errors import InvalidParameter

logger = logging.getLogger(__name__)

SQLITE_BUSY_TIMEOUT_MS = 30_000


def build_engine(url: str) -> Engine:
    """Create an engine for ``url`` with the settings each backend needs.

    SQLite: WAL journal, a busy timeout, foreign keys on, and explicit ``BEGIN``
    handling so that :meth:`Database.unit_of_work` can take the write lock up
    front (``BEGIN IMMEDIATE``) instead of failing on a lock upgrade.
    PostgreSQL (psycopg 3): pre-ping pooled connections.

    Raises:
        InvalidParameter: the URL names a backend Shamal does not support.
    """
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(url, parsed.database)
    if backend == "postgresql":
        if parsed.drivername != "postgresql+psycopg":
            url = parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
        return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)
    raise InvalidParameter(
        f"unsupported database backend {backend!r}: use sqlite:///PATH or postgresql+psycopg://..."
    )


def _sqlite_engine(url: str, database: str | None) -> Engine:
    if database and database != ":memory:":
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    # A pool of connections, each used by one thread at a time: opening and closing
    # per unit of work cost a connect, the PRAGMAs and a WAL checkpoint every time.
    # WAL lets the pooled readers run beside the single writer.
    engine = create_engine(
        url,
        poolclass=QueuePool,
        pool_size=8,
        max_overflow=24,
        pool_pre_ping=False,
        connect_args={"timeout": 30, "check_same_thread": False},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Take transaction control from the driver: SQLAlchemy emits BEGIN below.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine
