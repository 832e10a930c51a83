"""Shared fixtures: settings in a temporary home, and both database backends for real.

PostgreSQL tests use the machine's server (``SHAMAL_TEST_PG_URL``, default the
local trust-auth server). Each test run makes a template database, migrated once;
each test gets a fresh copy of it, dropped afterwards. There is no skip: a test
that needs PostgreSQL fails when it is down, with CI=true or without.
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from shamal.config import Settings
from shamal.db import open_database, upgrade
from shamal.server import Platform, create_app, start_platform
from tests.live import LiveServer, migrated_sqlite


def pytest_configure(config: pytest.Config) -> None:
    """A pytest-xdist worker starts with COLUMNS=80 and LINES=24 in its environment, and
    Rich fixes a console's width for good when COLUMNS is set as it is built (the CLI's
    consoles are built on import, as test modules are collected): drop them first, so
    the consoles follow what each test sets (``_cli_width``).

    The run's first process (xdist's controller, or pytest alone) writes the bytecode of
    the sources and the tests before any test starts. Where PYTHONDONTWRITEBYTECODE is
    set (as on CI's machines) no process writes it, and every server, CLI call, worker
    and job the suite starts would compile each module it imports again: about 2 s of
    CPU per server start. Up-to-date files are only compared, not compiled again."""
    for inherited in ("COLUMNS", "LINES"):
        os.environ.pop(inherited, None)
    if not hasattr(config, "workerinput"):
        import compileall

        root = Path(__file__).resolve().parents[1]
        for folder in ("src", "tests"):
            compileall.compile_dir(root / folder, quiet=1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files holding slow tests run first. Under pytest-xdist's ``--dist loadfile`` a worker
    takes a whole file at a time, in collection order: started last, a long file keeps one
    worker busy while the others have nothing left; started first, the short files fill in
    around it. The order within a file is kept (a stable sort)."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)


PG_ADMIN_URL = os.environ.get(
    "SHAMAL_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
RUN_ID = uuid.uuid4().hex[:8]


def _pg_connect() -> psycopg.Connection[tuple[object, ...]]:
    url = make_url(PG_ADMIN_URL)
    try:
        return psycopg.connect(
            host=url.host,
            port=url.port or 5432,
            user=url.username,
            password=url.password,
            dbname=url.database,
            autocommit=True,
            connect_timeout=5,
        )
    except psycopg.OperationalError as exc:  # pragma: no cover - environment failure
        pytest.fail(
            f"PostgreSQL is not reachable at {url.host}:{url.port} ({exc.__class__.__name__}); "
            "start it (see the machine notes) or set SHAMAL_TEST_PG_URL"
        )


def _pg_url(dbname: str) -> str:
    return make_url(PG_ADMIN_URL).set(database=dbname).render_as_string(hide_password=False)


@pytest.fixture(autouse=True)
def _finalize_what_the_test_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that starts servers, collect garbage: a socket or client it left open
    warns now (an error), charged to that test, not to whichever test the collector hits."""
    yield
    if request.node.get_closest_marker("slow") is not None:
        gc.collect()


@pytest.fixture(autouse=True)
def _cli_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI lays its output out at 200 columns in every test (a test may set its own
    COLUMNS): what a test asserts never depends on where a long temporary path wraps."""
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ambient SHAMAL_* variables must not leak into tests."""
    for key in list(os.environ):
        if key.startswith("SHAMAL_"):
            monkeypatch.delenv(key)


@pytest.fixture(autouse=True)
def _mlflow_client_state() -> Iterator[None]:
    """The stock mlflow client keeps process-wide state that outlives a test: the active
    experiment (``set_experiment``), the run stack, and environment variables it writes
    itself (``set_registry_uri`` sets ``MLFLOW_REGISTRY_URI``). A later test in the same
    worker would then start its runs against another test's experiment or server, so each
    test ends with that state as it found it. Nothing is sent to a server: a run left
    active is only dropped from the stack."""
    before = {key: value for key, value in os.environ.items() if key.startswith("MLFLOW_")}
    yield
    fluent = sys.modules.get("mlflow.tracking.fluent")
    if fluent is not None:
        fluent._active_experiment_id = None  # no public call unsets it
        fluent._active_run_stack.get().clear()
    for key in [key for key in os.environ if key.startswith("MLFLOW_")]:
        if key not in before:
            del os.environ[key]
    os.environ.update(before)


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    name = f"shamal_tpl_{RUN_ID}"
    with _pg_connect() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    db = open_database(_pg_url(name))
    upgrade(db)
    db.dispose()
    yield name
    with _pg_connect() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def fresh_pg_url(pg_template: str) -> Iterator[str]:
    """A new, migrated PostgreSQL database for one test."""
    name = f"shamal_t_{RUN_ID}_{uuid.uuid4().hex[:10]}"
    with _pg_connect() as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    yield _pg_url(name)
    with _pg_connect() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def empty_pg_url() -> Iterator[str]:
    """A new, empty (unmigrated) PostgreSQL database for one test."""
    name = f"shamal_e_{RUN_ID}_{uuid.uuid4().hex[:10]}"
    with _pg_connect() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield _pg_url(name)
    with _pg_connect() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def icu_pg_url() -> Iterator[str]:
    """A new, empty PostgreSQL database whose collation is a language's (ICU en-US), as
    production clusters often are: text sorts case-blind first, punctuation between."""
    name = f"shamal_icu_{RUN_ID}_{uuid.uuid4().hex[:10]}"
    with _pg_connect() as conn:
        conn.execute(
            f'CREATE DATABASE "{name}" TEMPLATE template0 LOCALE_PROVIDER icu '
            "ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'"
        )
    yield _pg_url(name)
    with _pg_connect() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Each test using this runs once on SQLite and once on PostgreSQL, on a new, migrated
    database each time."""
    if request.param == "sqlite":
        path = tmp_path_factory.mktemp("db") / "shamal.db"
        shutil.copyfile(migrated_sqlite(), path)  # as PostgreSQL tests copy pg_template
        return f"sqlite:///{path}"
    url: str = request.getfixturevalue("fresh_pg_url")
    return url


@pytest.fixture
def settings(tmp_path_factory: pytest.TempPathFactory, database_url: str) -> Settings:
    home = tmp_path_factory.mktemp("home")
    return Settings(home=home, database_url=database_url, allowed_hosts=("*",))


@pytest.fixture
def platform(settings: Settings) -> Iterator[Platform]:
    running = start_platform(settings)
    yield running
    running.close()


@pytest.fixture
def admin_token(platform: Platform) -> str:
    assert platform.admin_secret is not None
    return platform.admin_secret


@pytest.fixture
def api(platform: Platform, admin_token: str) -> Iterator[TestClient]:
    """An in-process client of the app, authenticated as the bootstrap admin."""
    app = create_app(platform.settings, platform)
    with TestClient(app, raise_server_exceptions=False) as client:
        client.headers["Authorization"] = f"Bearer {admin_token}"
        yield client


@pytest.fixture(scope="module")
def module_pg_url(pg_template: str) -> Iterator[str]:
    """A new, migrated PostgreSQL database shared by one test module."""
    name = f"shamal_m_{RUN_ID}_{uuid.uuid4().hex[:10]}"
    with _pg_connect() as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    yield _pg_url(name)
    with _pg_connect() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def mlflow_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    """A real Shamal server process per test module, on SQLite and on PostgreSQL."""
    env = {}
    if request.param == "postgres":
        env["SHAMAL_DATABASE_URL"] = request.getfixturevalue("module_pg_url")
    with LiveServer(tmp_path_factory.mktemp("mlflow-home"), env) as server:
        yield server


@pytest.fixture
def mlflow_env(mlflow_server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> LiveServer:
    """Point the stock mlflow client at the live server, as a user's script would be."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", mlflow_server.token)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "60")
    import mlflow

    mlflow.set_tracking_uri(mlflow_server.url)
    mlflow.set_registry_uri(mlflow_server.url)
    return mlflow_server


@pytest.fixture
def offline_cli(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    """The CLI pointed at a port nothing listens on: what a test runs with it must be
    refused before any request is sent."""
    monkeypatch.setenv("SHAMAL_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("SHAMAL_TOKEN", "not-used")
    monkeypatch.setenv("COLUMNS", "200")
    return CliRunner()
