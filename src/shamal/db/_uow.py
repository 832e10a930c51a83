"""Transactions: one helper owns commit, rollback, retries and error translation."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from shamal.db._engine import WalCheckpointer, sqlite_file
from shamal.errors import (
    AlreadyExists,
    Conflict,
    InternalError,
    ServiceUnavailable,
    ShamalError,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

# PostgreSQL SQLSTATEs that mean "nothing happened, try the whole transaction again".
_PG_TRANSIENT = {"40001", "40P01"}  # serialization failure, deadlock detected
_PG_UNIQUE = "23505"
_PG_FOREIGN_KEY = "23503"


class RetryableConflict(Exception):
    """Raised inside a unit of work to ask :meth:`Database.run` for another attempt."""


def _sqlstate(exc: DBAPIError) -> str | None:
    return getattr(exc.orig, "sqlstate", None)


def is_transient(exc: BaseException) -> bool:
    """Serialization failures, deadlocks and SQLite lock timeouts."""
    if isinstance(exc, RetryableConflict):
        return True
    if isinstance(exc, DBAPIError):
        if _sqlstate(exc) in _PG_TRANSIENT:
            return True
        message = str(exc.orig).lower()
        return isinstance(exc, OperationalError) and (
            "database is locked" in message or "database is busy" in message
        )
    return False


def is_foreign_key_violation(exc: BaseException) -> bool:
    if not isinstance(exc, IntegrityError):
        return False
    return _sqlstate(exc) == _PG_FOREIGN_KEY or "foreign key constraint" in str(exc.orig).lower()


def is_unique_violation(exc: BaseException) -> bool:
    if not isinstance(exc, IntegrityError):
        return False
    if _sqlstate(exc) == _PG_UNIQUE:
        return True
    return "unique constraint" in str(exc.orig).lower()


class Database:
    """The metadata database: an engine plus the transaction helpers.

    Thread-safe; share one instance per process. ``unit_of_work`` is the only
    place where sessions are created, committed or rolled back.

    On SQLite the writers of this process queue on a lock before ``BEGIN IMMEDIATE``:
    SQLite lets one writer in at a time, and a thread that meets a held write lock
    waits in SQLite's busy handler, which sleeps in growing steps (up to 100 ms)
    instead of waking when the lock is free. Queued in-process, the next writer
    starts the moment the previous one commits; the busy timeout still covers
    writers in other processes (``--workers``, the CLI).
    """

    def __init__(self, engine: Engine, *, write_lock_timeout_s: float = 30.0) -> None:
        self.engine = engine
        self._sessions = sessionmaker(bind=engine, expire_on_commit=False, autoflush=False)
        # Re-entrant: a write nested in a write of the same thread behaves as it did
        # without the queue (SQLite's own lock decides), instead of deadlocking here.
        self._writers = threading.RLock() if engine.dialect.name == "sqlite" else None
        self._write_lock_timeout_s = write_lock_timeout_s
        database = sqlite_file(engine)
        self._checkpointer = WalCheckpointer(database) if database else None

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def unit_of_work(self, *, write: bool = True) -> Iterator[Session]:
        """One transaction: commit when the block ends, roll back when it raises.

        Args:
            write: on SQLite, queue behind this process's other writers, then take
                the write lock at ``BEGIN`` (``IMMEDIATE``) so writers of other
                processes queue on the busy timeout instead of failing half-way.
                Pass ``False`` for read-only work.

        Raises:
            AlreadyExists: a unique constraint was violated.
            ServiceUnavailable: the database is unreachable or stayed locked.
            InternalError: any other database error (detail logged, not raised).
        """
        writers = self._writers if write else None
        if writers is None:
            with self._transaction(write=write) as session:
                yield session
            return
        if not writers.acquire(timeout=self._write_lock_timeout_s):
            raise ServiceUnavailable("the database stayed busy; retry the request")
        try:
            with self._transaction(write=write) as session:
                yield session
        finally:
            writers.release()
        if self._checkpointer is not None:
            self._checkpointer.note_commit()

    @contextmanager
    def _transaction(self, *, write: bool) -> Iterator[Session]:
        options = {"sqlite_begin": "IMMEDIATE" if write else "DEFERRED"}
        connection = self.engine.connect().execution_options(**options)
        session = self._sessions(bind=connection)
        try:
            with connection.begin():
                yield session
                session.flush()
        except (ShamalError, RetryableConflict):
            raise
        except IntegrityError as exc:
            if is_unique_violation(exc):
                raise AlreadyExists("an object with this name or key exists already") from exc
            if is_foreign_key_violation(exc):
                raise Conflict(
                    "other objects still refer to this one (e.g. a team that owns experiments "
                    "or models): remove or move them first"
                ) from exc
            logger.exception("integrity error in unit of work")
            raise InternalError("the database rejected the change") from exc
        except DBAPIError as exc:
            if is_transient(exc):
                raise
            logger.exception("database error in unit of work")
            if exc.connection_invalidated or isinstance(exc, OperationalError):
                raise ServiceUnavailable("the metadata database is unavailable") from exc
            raise InternalError("the metadata database failed") from exc
        finally:
            session.close()
            connection.close()

    def run(
        self,
        work: Callable[[Session], T],
        *,
        retry_unique: bool = False,
        attempts: int = 8,
        write: bool = True,
    ) -> T:
        """Run ``work`` in a unit of work, retrying whole transactions on conflicts.

        Serialization failures, deadlocks, SQLite lock timeouts and
        :class:`RetryableConflict` are always retried: the transaction was rolled
        back, so nothing happened. Unique violations are retried only with
        ``retry_unique=True``: for work that picked its key after a read (such as
        ``max(version) + 1``) and is idempotent. ``work`` must have no side effects
        outside the session.

        Raises:
            ServiceUnavailable: still conflicting after ``attempts`` tries.
            Any error of :meth:`unit_of_work`.
        """
        for attempt in range(1, attempts + 1):
            try:
                with self.unit_of_work(write=write) as session:
                    return work(session)
            except (DBAPIError, RetryableConflict, AlreadyExists) as exc:
                cause = exc.__cause__ if isinstance(exc, AlreadyExists) else exc
                retryable = is_transient(exc) or (
                    retry_unique and cause is not None and is_unique_violation(cause)
                )
                if not retryable:
                    if isinstance(exc, DBAPIError):
                        logger.exception("database error")
                        raise InternalError("the metadata database failed") from exc
                    raise
                if attempt == attempts:
                    logger.warning("giving up after %d conflicting attempts", attempts)
                    raise ServiceUnavailable("the database stayed busy; retry the request") from exc
                # Jittered exponential backoff between whole-transaction retries.
                time.sleep(min(0.5, 0.005 * 2**attempt) * (0.5 + random.random()))  # noqa: S311
        raise AssertionError("unreachable")  # pragma: no cover

    def dispose(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.stop()
        self.engine.dispose()
