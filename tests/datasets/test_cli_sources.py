"""`shamal data ingest --from` against a real server allowed to read the machine's
PostgreSQL: a SQL source, the same as a job on the scheduler (``--as-job --wait``, the local
executor, the job's own token), compressed local files, and the refusals the CLI makes
itself (a URI that is not a source, a password in a job's stored command)."""

from __future__ import annotations

import gzip
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

import shamal as shamal_package
from shamal.client import ShamalClient
from tests.conftest import _pg_connect
from tests.datasets._cli import cli_against
from tests.jobs.test_scheduling import stop_all_jobs
from tests.live import LiveServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    env = {
        "SHAMAL_DATA_SOURCES__SQL_HOSTS": '["127.0.0.1:5432"]',
        "SHAMAL_SCHEDULER__TICK_S": "0.2",
    }
    with LiveServer(tmp_path_factory.mktemp("data-src-home"), env=env) as live:
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
    """A database whose ``readings`` table a role ``reader_<tag>`` may select (no password:
    the machine's PostgreSQL trusts loopback)."""
    tag = uuid.uuid4().hex[:10]
    name = f"shamal_cli_src_{tag}"
    with _pg_connect() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        admin.execute(f"CREATE ROLE reader_{tag} LOGIN")
    try:
        with psycopg.connect(host="127.0.0.1", user="postgres", dbname=name, autocommit=True) as c:
            c.execute(
                "CREATE TABLE readings AS SELECT i AS id, i * 0.5 AS v "
                "FROM generate_series(1, 30000) i"
            )
            c.execute(f"GRANT SELECT ON readings TO reader_{tag}")
        yield f"postgresql://reader_{tag}@127.0.0.1:5432/{name}"
    finally:
        with _pg_connect() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.execute(f"DROP ROLE IF EXISTS reader_{tag}")


def test_a_sql_source_directly_and_as_a_job(
    shamal: Callable[..., tuple[int, str]], database: str
) -> None:
    assert shamal("data", "create", "readings", "--team", "analytics")[0] == 0
    query = "SELECT id, v FROM readings WHERE id <= 20000"
    code, out = shamal("data", "ingest", "readings", "--from", database, "--query", query)
    assert code == 0, out
    assert "data:/readings/1" in out
    assert "20,000 rows" in out
    code, out = shamal(
        "data", "ingest", "readings", "--from", database,
        "--query", "SELECT id, v FROM readings WHERE id > 20000",
        "--as-job", "--wait", "--team", "analytics", "--json",
        # The job runs this checkout's Shamal (a job's environment is clean otherwise).
        "--env", f"PYTHONPATH={Path(shamal_package.__file__).resolve().parents[1]}",
    )  # fmt: skip
    assert code == 0, out
    job = json.loads(out)
    assert job["state"] == "succeeded"
    code, out = shamal("data", "versions", "readings", "--json")
    versions = json.loads(out)
    assert [(v["version"], v["row_count"]) for v in versions] == [(2, 30_000), (1, 20_000)]


def test_a_sql_source_in_partitions_is_a_gang_job_of_one_version(
    shamal: Callable[..., tuple[int, str]], database: str
) -> None:
    """``--as-job --partitions 2``: one job of two workers (the local executor's gang), each
    staging the rows of its RANK; rank 0 commits both parts as one version."""
    assert shamal("data", "create", "split", "--team", "analytics")[0] == 0
    code, out = shamal(
        "data", "ingest", "split", "--from", database, "--query", "SELECT id, v FROM readings",
        "--partitions", "2", "--partition-by", "id", "--mode", "overwrite",
        "--as-job", "--wait", "--team", "analytics", "--json",
        "--env", f"PYTHONPATH={Path(shamal_package.__file__).resolve().parents[1]}",
    )  # fmt: skip
    assert code == 0, out
    job = json.loads(out)
    assert job["state"] == "succeeded"
    assert job["command"][4] == "ingest-partition"
    code, out = shamal("data", "versions", "split", "--json")
    (version,) = json.loads(out)
    assert version["row_count"] == 30_000
    assert len(version["parts"]) == 2
    assert all(p["rows"] > 0 for p in version["parts"])
    assert version["source"]["partitions"] == 2
    assert version["source"]["batch"] == job["id"]
    code, out = shamal("data", "ingest", "split", "--from", database, "--partitions", "2")
    assert code == 1
    assert "add --as-job" in " ".join(out.split())


def test_refusals_the_cli_makes(shamal: Callable[..., tuple[int, str]], tmp_path: Path) -> None:
    assert shamal("data", "create", "refused", "--team", "analytics")[0] == 0
    for args, message in (
        (("--from", "file:///etc/passwd"), "given by its path"),
        (("--from", "http://169.254.169.254/latest"), "given by its path"),
        (("--from", str(tmp_path / "missing.csv")), "not a readable file"),
        (("--from", str(tmp_path), "--as-job"), "a local file uploads directly"),
        (
            (
                "--from",
                "postgresql://u:s3cret-pw@127.0.0.1:5432/x",
                "--query",
                "SELECT 1",
                "--as-job",
            ),
            "may hold no password",
        ),
        (
            ("--from", "postgresql://u@10.1.2.3:5432/x", "--query", "SELECT 1"),
            "data_sources.sql_hosts",
        ),
        (("--from", "s3://bucket/x.csv"), "data_sources.s3_buckets"),
    ):
        code, out = shamal("data", "ingest", "refused", *args)
        assert code == 1, (args, out)
        assert message in " ".join(out.split()), (args, out)
        assert "s3cret-pw" not in out
        assert "Traceback" not in out
    code, out = shamal("data", "versions", "refused", "--json")
    assert json.loads(out) == []


def test_compressed_local_files_upload(
    shamal: Callable[..., tuple[int, str]], tmp_path: Path
) -> None:
    source = tmp_path / "rows.csv.gz"
    source.write_bytes(gzip.compress(b"a,b\n" + b"1,2\n" * 5000))
    assert shamal("data", "create", "packed", "--team", "analytics")[0] == 0
    code, out = shamal("data", "ingest", "packed", "--from", str(source))
    assert code == 0, out
    assert "5,000 rows" in out
