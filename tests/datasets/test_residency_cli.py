"""`shamal data residency / copy / ingest --store` and `shamal job submit --dataset` against a
real server process whose artifact store is in Frankfurt and whose data store ``dubai`` is in
Dubai (two folders), with a pool in each region; the data SDK reads a version from the store
that holds it."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from shamal.cli import app
from shamal.client import ShamalClient
from tests.live import LiveServer

pytestmark = pytest.mark.slow

TABLE = pa.table({"id": list(range(20)), "emirate": ["Dubai", "Ajman"] * 10})


def _pool(name: str, region: str) -> dict[str, object]:
    node = {"name": f"{name}-1", "cpus": 2, "memory_mib": 4096}
    return {"name": name, "labels": {"region": region}, "nodes": [node]}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    home = tmp_path_factory.mktemp("residency-home")
    env = {
        "SHAMAL_ARTIFACTS": json.dumps({"type": "local", "labels": {"region": "eu-frankfurt"}}),
        "SHAMAL_DATA_STORES": json.dumps(
            {"dubai": {"type": "local", "labels": {"region": "ae-dubai"}}}
        ),
        "SHAMAL_SCHEDULER__POOLS": json.dumps(
            [_pool("fra", "eu-frankfurt"), _pool("dxb", "ae-dubai")]
        ),
        "SHAMAL_SCHEDULER__ENABLED": "false",
    }
    with LiveServer(home, env) as live:
        with ShamalClient(live.url, live.token) as api:
            api.create_team("analytics")
        yield live


@pytest.fixture
def shamal(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[int, str]]:
    monkeypatch.setenv("SHAMAL_URL", server.url)
    monkeypatch.setenv("SHAMAL_TOKEN", server.token)
    runner = CliRunner()

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, list(args), env={"COLUMNS": "120"})
        return result.exit_code, " ".join(result.output.split())  # unwrapped

    return run


def test_residency_copy_and_jobs_from_the_cli(
    shamal: Callable[..., tuple[int, str]],
    server: LiveServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = tmp_path / "customers.parquet"
    pq.write_table(TABLE, source)
    assert shamal("data", "create", "customers", "--team", "analytics")[0] == 0
    code, out = shamal("data", "residency", "customers", "--allow", "ae-dubai,ae-abudhabi")
    assert code == 0, out
    assert "ae-abudhabi, ae-dubai" in out
    code, out = shamal("data", "ingest", "customers", "--from", str(source), "--store", "default")
    assert code == 1
    assert "allows only ae-abudhabi, ae-dubai" in out
    assert "Traceback" not in out
    code, out = shamal("data", "ingest", "customers", "--from", str(source))
    assert code == 0, out
    code, out = shamal("data", "residency", "customers", "--json")
    stores = {s["name"]: (s["region"], s["allowed"], s["parts"]) for s in json.loads(out)["stores"]}
    assert stores == {"default": ("eu-frankfurt", False, 0), "dubai": ("ae-dubai", True, 1)}
    # The bytes are in Dubai's folder, none in Frankfurt's.
    assert list((server.home / "data-stores" / "dubai" / "blobs").rglob("*"))
    assert not (server.home / "artifacts" / "blobs").exists()
    code, out = shamal("data", "copy", "customers/1", "--to-store", "default")
    assert code == 1
    assert "store 'default' is in region eu-frankfurt" in out
    code, out = shamal("data", "copy", "customers", "--to-store", "dubai")
    assert code == 1
    assert "customers/3" in out  # by number
    # The SDK reads the version from the store that holds it.
    from shamal.data import load

    monkeypatch.setenv("SHAMAL_URL", server.url)
    monkeypatch.setenv("SHAMAL_TOKEN", server.token)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    assert load("customers").to_pylist() == TABLE.to_pylist()
    # A job reading it is held to Dubai's pool; one naming Frankfurt's is refused.
    code, out = shamal(
        "job", "submit", "--team", "analytics", "--dataset", "customers", "--pool", "fra",
        "--no-snapshot", "--memory", "64MiB", "--cpus", "0.5", "--", "true",
    )  # fmt: skip
    assert code == 1
    assert "pool 'fra' is in region eu-frankfurt" in out
    code, out = shamal(
        "job", "submit", "--team", "analytics", "--dataset", "customers", "--no-snapshot",
        "--memory", "64MiB", "--cpus", "0.5", "--json", "--", "true",
    )  # fmt: skip
    assert code == 0, out
    job = json.loads(out)
    assert (job["datasets"], job["regions"]) == (["customers"], ["ae-abudhabi", "ae-dubai"])
    # Every refusal is in the audit log.
    with ShamalClient(server.url, server.token) as api:
        entries = api.audit_entries(limit=100)
    denied = sorted(e["action"] for e in entries if e["outcome"] == "residency_denied")
    assert denied == ["dataset.copy", "dataset.ingest", "job.submit"]
