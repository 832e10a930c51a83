"""Contract tests of the metadata store, run on SQLite and on PostgreSQL."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import event, func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from shamal.config import Settings
from shamal.db import (
    Database,
    RetryableConflict,
    current_revision,
    head_revision,
    open_database,
    server_warnings,
)
from shamal.db import upgrade as migrate
from shamal.db._checks import AUTOVACUUM_OFF
from shamal.db.models import Base, TeamRow
from shamal.errors import AlreadyExists, InvalidParameter, ServiceUnavailable
from shamal.server import start_platform


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = open_database(database_url)
    migrate(database)
    yield database
    database.dispose()


def _team(s: Session, name: str) -> None:
    s.add(TeamRow(id=uuid.uuid4().hex, name=name, description="", created_at=datetime.now(UTC)))


def _count_teams(db: Database) -> int:
    with db.unit_of_work(write=False) as s:
        return s.scalar(select(func.count()).select_from(TeamRow)) or 0


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_migrations_build_the_schema_of_the_models(
    backend: str, tmp_path: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> None:
    url = (
        f"sqlite:///{tmp_path}/empty.db"
        if backend == "sqlite"
        else request.getfixturevalue("empty_pg_url")
    )
    database = open_database(url)
    assert current_revision(database) is None
    before, after = migrate(database)
    assert (before, after) == (None, head_revision())
    assert migrate(database) == (head_revision(), head_revision())  # idempotent
    with database.engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
        # compare_metadata does not compare an index's WHERE: read it from the catalogue.
        definition = connection.execute(
            text("SELECT sql FROM sqlite_master WHERE name = 'ix_metrics_model_key'")
            if backend == "sqlite"
            else text("SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_metrics_model_key'")
        ).scalar_one()
    database.dispose()
    assert diff == [], f"models and migrations disagree: {diff}"
    # Only points logged against a model are indexed by model (migration 0008).
    assert "model_id IS NOT NULL" in definition


def test_sqlite_metrics_upgrade_to_one_b_tree_and_keep_every_point(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Migration 0010 rebuilds the metrics table WITHOUT ROWID: no point may be lost or changed,
    # and the copy must be a table that keeps the primary key and the partial model index.
    database = open_database(f"sqlite:///{tmp_path}/old.db")
    migrate(database, "0009")
    points = [
        ("r1", "loss", s, 1000 + s, 1.0 / (1 + s), False, None, None, None) for s in range(500)
    ]
    points += [("r1", "acc", 3, 7, 0.0, True, "m-1", "eval", "d1")]  # a NaN logged to a model
    with database.engine.begin() as c:
        c.execute(
            text(
                "INSERT INTO experiments VALUES "
                "(1, 'e', 'mlflow-artifacts:/1', 'active', 0, 0, NULL)"
            )
        )
        c.execute(
            text(
                "INSERT INTO runs VALUES ('r1', 1, 'r', 'u', 'RUNNING', 0, NULL, 'active', "
                "'mlflow-artifacts:/1/r1', NULL)"
            )
        )
        c.exec_driver_sql("INSERT INTO metrics VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", points)
    with caplog.at_level(logging.INFO, logger="shamal.db.migrations"):
        assert migrate(database) == ("0009", head_revision())
    # The user is told before a long copy how much it holds.
    assert "rebuilding the metrics table, copying 501 points" in caplog.text
    order = 'ORDER BY run_id, "key", step, timestamp, value, is_nan'
    with database.engine.connect() as c:
        stored = [tuple(r) for r in c.exec_driver_sql(f"SELECT * FROM metrics {order}")]
        table = c.exec_driver_sql("SELECT sql FROM sqlite_master WHERE name = 'metrics'").scalar()
        indexes = c.exec_driver_sql("PRAGMA index_list('metrics')").fetchall()
        with pytest.raises(IntegrityError):  # still one point per primary key
            c.exec_driver_sql("INSERT INTO metrics VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", points[0])
    database.dispose()
    assert stored == sorted((*p[:5], int(p[5]), *p[6:]) for p in points)
    assert table is not None
    assert table.rstrip().endswith("WITHOUT ROWID")
    assert "ix_metrics_model_key" in {row[1] for row in indexes}


def test_a_new_sqlite_database_says_nothing_of_copying_points(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    database = open_database(f"sqlite:///{tmp_path}/new.db")
    with caplog.at_level(logging.INFO, logger="shamal.db.migrations"):
        assert migrate(database) == (None, head_revision())
    database.dispose()
    assert "0010" not in caplog.text
    assert "metrics table" not in caplog.text


def test_sqlite_runs_in_wal_mode(tmp_path: pytest.TempPathFactory) -> None:
    database = open_database(f"sqlite:///{tmp_path}/wal.db")
    with database.engine.connect() as connection:
        assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert connection.execute(text("PRAGMA foreign_keys")).scalar() == 1
    database.dispose()


def test_unsupported_backend_is_refused() -> None:
    with pytest.raises(InvalidParameter, match="unsupported database backend"):
        open_database("mysql://root@localhost/x")


def test_unit_of_work_commits_and_rolls_back(db: Database) -> None:
    with db.unit_of_work() as s:
        _team(s, "kept")

    def failing() -> None:
        with db.unit_of_work() as s:
            _team(s, "dropped")
            s.flush()
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        failing()
    with db.unit_of_work(write=False) as s:
        assert list(s.scalars(select(TeamRow.name))) == ["kept"]


def test_unique_violation_becomes_already_exists(db: Database) -> None:
    db.run(lambda s: _team(s, "dup"))
    with pytest.raises(AlreadyExists):
        db.run(lambda s: _team(s, "dup"))
    assert _count_teams(db) == 1


def test_run_retries_transient_conflicts_then_gives_up(db: Database) -> None:
    calls = []

    def flaky(s: Session) -> str:
        calls.append(1)
        _team(s, f"t{len(calls)}")
        if len(calls) < 3:
            raise RetryableConflict
        return "done"

    assert db.run(flaky) == "done"
    assert len(calls) == 3
    assert _count_teams(db) == 1  # the failed attempts left nothing behind

    def always(s: Session) -> None:
        raise RetryableConflict

    with pytest.raises(ServiceUnavailable):
        db.run(always, attempts=3)


def test_concurrent_max_plus_one_numbering_is_unique_and_gapless(db: Database) -> None:
    """Eight writers pick "next number = count + 1" at once; unique retries sort it out."""
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def work(s: Session) -> None:
        n = s.scalar(select(func.count()).select_from(TeamRow)) or 0
        _team(s, f"n{n + 1:03d}")

    def writer() -> None:
        try:
            barrier.wait(timeout=30)
            db.run(work, retry_unique=True, attempts=20)
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=writer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    with db.unit_of_work(write=False) as s:
        names = sorted(s.scalars(select(TeamRow.name)))
    assert names == [f"n{i:03d}" for i in range(1, 9)]


def test_sqlite_writers_of_one_process_queue_in_the_process(tmp_path: Path) -> None:
    """A second writer waits for the first one's commit in Python, not in SQLite.

    With SQLite's busy timeout at 0 a writer that reaches ``BEGIN IMMEDIATE`` while
    another holds the write lock fails at once ("database is locked"); queued in the
    process, it never meets the lock. (SQLite's own wait sleeps up to 100 ms a round.)
    """
    db = open_database(f"sqlite:///{tmp_path}/queue.db")
    migrate(db)
    event.listen(db.engine, "connect", lambda conn, _: conn.execute("PRAGMA busy_timeout=0"))
    db.engine.dispose()  # every connection from now on has the 0 timeout
    entering, finished = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def second_writer() -> None:
        entering.set()
        try:
            with db.unit_of_work() as s:
                _team(s, "second")
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)
        finally:
            finished.set()

    thread = threading.Thread(target=second_writer)
    with db.unit_of_work() as s:
        _team(s, "first")
        s.flush()  # the write lock is held from BEGIN IMMEDIATE on
        thread.start()
        assert entering.wait(30)
        # It must still be waiting when we commit; without the queue it fails at once.
        assert not finished.wait(0.3), errors
    thread.join(30)
    db.dispose()
    assert errors == []
    assert _count_teams_of(f"sqlite:///{tmp_path}/queue.db") == 2


def _count_teams_of(url: str) -> int:
    db = open_database(url)
    try:
        return _count_teams(db)
    finally:
        db.dispose()


def test_sqlite_write_ahead_log_is_checkpointed_off_the_request_path(tmp_path: Path) -> None:
    """Commits leave their pages in the WAL; a background thread copies them into the
    database file (SQLite alone would wait for 10,000 pages, in some request's commit)."""
    path = tmp_path / "wal.db"
    db = open_database(f"sqlite:///{path}")
    migrate(db)
    threads_before = set(threading.enumerate())
    size_before = path.stat().st_size
    for _ in range(8):  # about 2 MB of pages, far below the backstop
        with db.unit_of_work() as s:
            s.execute(text("CREATE TABLE IF NOT EXISTS bulk (blob BLOB)"))
            s.execute(text("INSERT INTO bulk SELECT randomblob(250000)"))
    deadline = time.monotonic() + 30
    while path.stat().st_size < size_before + 1_500_000:
        assert time.monotonic() < deadline, "the WAL was not checkpointed into the file"
        time.sleep(0.05)  # polling an effect with a deadline
    checkpointers = [t for t in set(threading.enumerate()) - threads_before if t.is_alive()]
    assert [t.name for t in checkpointers] == ["sqlite-checkpoint"]
    db.dispose()
    assert not checkpointers[0].is_alive()


@pytest.mark.postgres
def test_postgres_serialization_failures_are_retried(fresh_pg_url: str) -> None:
    """Write skew under SERIALIZABLE: PostgreSQL aborts one side (40001); run() retries it."""
    database = open_database(fresh_pg_url)
    barrier = threading.Barrier(2)
    attempts: dict[str, int] = {"a": 0, "b": 0}
    errors: list[BaseException] = []

    def make_work(who: str):  # type: ignore[no-untyped-def]
        def work(s: Session) -> None:
            s.execute(text("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"))
            attempts[who] += 1
            seen = s.scalar(select(func.count()).select_from(TeamRow)) or 0
            if attempts[who] == 1:
                barrier.wait(timeout=30)  # both have read before either writes
            _team(s, f"{who}-saw-{seen}")

        return work

    def writer(who: str) -> None:
        try:
            database.run(make_work(who))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    database.dispose()
    assert errors == []
    assert sum(attempts.values()) == 3, attempts  # exactly one side was aborted and retried
    db2 = open_database(fresh_pg_url)
    with db2.unit_of_work(write=False) as s:
        names = sorted(s.scalars(select(TeamRow.name)))
    db2.dispose()
    assert sorted(n.split("-saw-")[1] for n in names) == ["0", "1"]


def test_cli_db_upgrade_and_current(
    tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from shamal.cli import app as cli_app

    monkeypatch.setenv("SHAMAL_HOME", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    runner = CliRunner()
    before = runner.invoke(cli_app, ["db", "current"])
    assert before.exit_code == 0
    assert "database: empty" in before.output
    assert "needs `shamal db upgrade`" in before.output
    upgraded = runner.invoke(cli_app, ["db", "upgrade"])
    assert upgraded.exit_code == 0, upgraded.output
    assert f"migrated empty database -> {head_revision()}" in upgraded.output
    again = runner.invoke(cli_app, ["db", "upgrade"])
    assert "already current" in again.output
    assert "current" in runner.invoke(cli_app, ["db", "current"]).output


@pytest.mark.parametrize(
    ("command", "variable", "value"),
    [
        (["server"], "SHAMAL_PORT", "abc"),
        (["db", "upgrade"], "SHAMAL_SCHEDULER__TICK_S", "-1"),
    ],
)
def test_invalid_settings_are_one_clear_line_that_keeps_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str], variable: str, value: str
) -> None:
    from typer.testing import CliRunner

    from shamal.cli import app

    monkeypatch.setenv("SHAMAL_HOME", str(tmp_path))
    monkeypatch.setenv("SHAMAL_DATABASE_URL", "postgresql+psycopg://u:hunter2@127.0.0.1:1/db")
    monkeypatch.setenv(variable, value)
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 1
    said = " ".join(result.output.split())
    assert f"invalid settings: {variable}:" in said
    assert "SHAMAL_* environment variables" in said
    assert "hunter2" not in said
    assert "Traceback" not in said
    assert result.exception is None or isinstance(result.exception, SystemExit)


# ---------------------------------------------------------------- server settings
def _show(db: Database, setting: str) -> str:
    with db.engine.connect() as connection:
        value: str = connection.execute(text(f"SHOW {setting}")).scalar_one()
        return value


def _turn_off_table_statistics(database: Database, url: str) -> None:
    """``track_counts = off`` for this database (a superuser's per-database setting); the
    pool is emptied, since only new connections take it."""
    name = make_url(url).database
    with database.engine.connect() as connection:
        connection.execute(text(f'ALTER DATABASE "{name}" SET track_counts = off'))
        connection.commit()
    database.engine.dispose()


def test_sqlite_has_no_server_settings_to_warn_of(tmp_path: Path) -> None:
    database = open_database(f"sqlite:///{tmp_path / 'shamal.db'}")
    try:
        assert server_warnings(database) == []
    finally:
        database.dispose()


@pytest.mark.postgres
def test_postgres_without_table_statistics_is_named(fresh_pg_url: str) -> None:
    """Autovacuum cannot refresh statistics without ``track_counts``: set it off for this
    database (a superuser's per-database setting, which new connections take) and the
    warning must come, whatever the server's autovacuum says; back on, the warning follows
    the server's autovacuum alone."""
    database = open_database(fresh_pg_url)
    try:
        expected = [] if _show(database, "autovacuum") == "on" else [AUTOVACUUM_OFF]
        assert server_warnings(database) == expected
        _turn_off_table_statistics(database, fresh_pg_url)
        assert _show(database, "track_counts") == "off"
        assert server_warnings(database) == [AUTOVACUUM_OFF]
    finally:
        database.dispose()


@pytest.mark.postgres
def test_the_platform_logs_the_warning_at_start(
    fresh_pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    database = open_database(fresh_pg_url)
    _turn_off_table_statistics(database, fresh_pg_url)
    database.dispose()
    caplog.set_level(logging.WARNING, logger="shamal.server._platform")
    platform = start_platform(
        Settings(home=tmp_path / "home", database_url=fresh_pg_url, allowed_hosts=("*",))
    )
    platform.close()
    warned = [r.getMessage() for r in caplog.records if r.name == "shamal.server._platform"]
    assert warned == [AUTOVACUUM_OFF]
