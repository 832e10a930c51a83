"""Engines for the two supported backends: SQLite (embedded) and PostgreSQL."""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.pool import QueuePool

from shamal.errors import InvalidParameter

logger = logging.getLogger(__name__)

SQLITE_BUSY_TIMEOUT_MS = 30_000
# SQLite checkpoints inside the commit that takes the write-ahead log past this many
# pages. The WalCheckpointer below normally does it first; this is the backstop.
SQLITE_AUTOCHECKPOINT_PAGES = 10_000


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
        # The connection used last is taken next: its page cache is the warm one (a
        # connection drops its cache when another one wrote since it last read).
        pool_use_lifo=True,
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
        cursor.execute(f"PRAGMA wal_autocheckpoint={SQLITE_AUTOCHECKPOINT_PAGES}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


def sqlite_file(engine: Engine) -> str | None:
    """The database file of a SQLite engine; None for other backends and in-memory ones."""
    if engine.dialect.name != "sqlite":
        return None
    database = engine.url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return database


class WalCheckpointer:
    """Copies SQLite's write-ahead log back into the database file, off the request path.

    Left to itself, SQLite checkpoints inside the commit that takes the log past
    ``wal_autocheckpoint`` pages: that request copies megabytes into the database file
    and waits for two fsyncs. Here a thread of its own does it, at most every
    ``interval_s`` while commits come in, with ``PASSIVE`` checkpoints (they never wait
    for, nor block, readers or writers).

    Durability, with ``synchronous=NORMAL``: a commit survives a crash of the process
    as soon as it returns; the log reaches the disk (power loss included) when a
    checkpoint syncs it before copying, so normally within about ``interval_s`` here
    (a long read can hold a checkpoint back), where SQLite alone would wait for
    ``wal_autocheckpoint`` pages.

    Thread-safe. The thread starts on the first :meth:`note_commit` and ends at
    :meth:`stop`.
    """

    def __init__(self, database: str, *, interval_s: float = 0.25) -> None:
        self._database = database
        self._interval_s = interval_s
        self._wanted = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def note_commit(self) -> None:
        """A write transaction committed: checkpoint soon."""
        if self._thread is None:
            with self._start_lock:
                if self._thread is None and not self._stopping.is_set():
                    self._thread = threading.Thread(
                        target=self._run, name="sqlite-checkpoint", daemon=True
                    )
                    self._thread.start()
        self._wanted.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        """End the thread after the checkpoint it may be running."""
        self._stopping.set()
        self._wanted.set()
        with self._start_lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    def _run(self) -> None:
        connection = sqlite3.connect(
            self._database, timeout=SQLITE_BUSY_TIMEOUT_MS / 1000, isolation_level=None
        )
        try:
            while True:
                self._wanted.wait()
                if self._stopping.is_set():
                    return
                self._wanted.clear()
                try:
                    connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error:
                    logger.warning("background WAL checkpoint failed", exc_info=True)
                # Pace: one checkpoint per interval at most, however many commits.
                if self._stopping.wait(self._interval_s):
                    return
        finally:
            connection.close()
