"""A partitioned ingestion end to end on the Ray executor.

A live server whose scheduler runs jobs on Ray (it starts a local Ray instance of its own)
and may read the machine's PostgreSQL; ``shamal data ingest --as-job --partitions 2
--partition-by id --wait`` submits one gang job of two Ray actors: each stages the rows of
its RANK (the server reads that partition), rank 0 commits both as one version.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

import shamal as shamal_package
from shamal.client import ShamalClient
from tests import needs
from tests.conftest import _pg_connect
from tests.datasets._cli import cli_against
from tests.jobs.test_scheduling import FAST, stop_all_jobs
from tests.live import LiveServer

needs.module("ray")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    env = {
        **FAST,
        "SHAMAL_SCHEDULER__EXECUTOR": "ray",
        "SHAMAL_DATA_SOURCES__SQL_HOSTS": '["127.0.0.1:5432"]',
    }
    with LiveServer(tmp_path_factory.mktemp("ray-ingest-home"), env=env) as live:
        with ShamalClient(live.url, live.token) as api:
            api.create_team("analytics")
        yield live


@pytest.fixture
def shamal(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., tuple[int, str]]]:
    yield cli_against(server, monkeypatch)
    with ShamalClient(server.url, server.token) as api:
        stop_all_jobs(api)


@pytest.fixture
def database() -> Iterator[str]:
    tag = uuid.uuid4().hex[:10]
    name = f"shamal_ray_src_{tag}"
    with _pg_connect() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        admin.execute(f"CREATE ROLE reader_{tag} LOGIN")
    try:
        with psycopg.connect(host="127.0.0.1", user="postgres", dbname=name, autocommit=True) as c:
            c.execute(
                "CREATE TABLE readings AS SELECT i AS id, i * 0.5 AS v "
                "FROM generate_series(1, 20000) i"
            )
            c.execute(f"GRANT SELECT ON readings TO reader_{tag}")
        yield f"postgresql://reader_{tag}@127.0.0.1:5432/{name}"
    finally:
        with _pg_connect() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.execute(f"DROP ROLE IF EXISTS reader_{tag}")


def test_a_partitioned_ingestion_runs_as_a_gang_of_ray_actors(
    shamal: Callable[..., tuple[int, str]], database: str
) -> None:
    assert shamal("data", "create", "readings", "--team", "analytics")[0] == 0
    code, out = shamal(
        "data", "ingest", "readings", "--from", database, "--query", "SELECT id, v FROM readings",
        "--partitions", "2", "--partition-by", "id",
        "--as-job", "--wait", "--team", "analytics", "--json",
        "--env", f"PYTHONPATH={Path(shamal_package.__file__).resolve().parents[1]}",
    )  # fmt: skip
    assert code == 0, out
    job = json.loads(out)
    assert job["state"] == "succeeded", out
    code, out = shamal("data", "versions", "readings", "--json")
    (version,) = json.loads(out)
    assert version["row_count"] == 20_000
    assert len(version["parts"]) == 2
    assert sum(p["rows"] for p in version["parts"]) == 20_000
    assert all(p["rows"] > 0 for p in version["parts"])
    assert version["source"]["batch"] == job["id"]
    assert version["profile"]["rows"] == 20_000
