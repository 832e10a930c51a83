"""`shamal data` against a real server process: create, ingest every format, list, show,
versions, aliases, download (the parts open as plain Parquet), and clear errors."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from shamal.client import ShamalClient
from tests.datasets._cli import cli_against
from tests.live import LiveServer

pytestmark = pytest.mark.slow

TABLE = pa.table({"id": list(range(100)), "label": [f"row {i}" for i in range(100)]})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("data-home")) as live:
        with ShamalClient(live.url, live.token) as api:
            api.create_team("analytics")
        yield live


@pytest.fixture
def shamal(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[int, str]]:
    return cli_against(server, monkeypatch, columns=120)


def test_ingest_list_show_alias_and_download(
    shamal: Callable[..., tuple[int, str]], tmp_path: Path
) -> None:
    source = tmp_path / "people.csv"
    pacsv.write_csv(TABLE, source)
    assert shamal("data", "create", "people", "--team", "analytics")[0] == 0
    code, out = shamal("data", "ingest", "people", "--from", str(source))
    assert code == 0, out
    assert "data:/people/1" in out
    assert "100 rows" in out
    parquet = tmp_path / "more.parquet"
    pq.write_table(TABLE.slice(0, 10), parquet)
    code, out = shamal("data", "ingest", "people", "--from", str(parquet), "--json")
    assert code == 0, out
    second = json.loads(out)
    assert (second["version"], second["row_count"], len(second["parts"])) == (2, 110, 2)
    code, out = shamal("data", "versions", "people")
    assert code == 0
    assert "Versions of people" in out
    assert shamal("data", "alias", "people", "prod", "1")[0] == 0
    code, out = shamal("data", "show", "people@prod", "--json")
    assert json.loads(out)["version"] == 1
    code, out = shamal("data", "list", "--json")
    (listed,) = json.loads(out)
    assert (listed["name"], listed["latest_version"], listed["aliases"]) == (
        "people",
        2,
        {"prod": 1},
    )
    code, out = shamal("data", "download", "people/2", "--to", str(tmp_path / "out"))
    assert code == 0, out
    files = sorted((tmp_path / "out").glob("*.parquet"))
    assert len(files) == 2
    read = pa.concat_tables([pq.read_table(f) for f in files])
    assert read.num_rows == 110
    assert read.column("id").to_pylist() == list(range(100)) + list(range(10))


def test_clear_errors_exit_1(shamal: Callable[..., tuple[int, str]], tmp_path: Path) -> None:
    odd = tmp_path / "data.xlsx"
    odd.write_bytes(b"x")
    shamal("data", "create", "errs", "--team", "analytics")
    code, out = shamal("data", "ingest", "errs", "--from", str(odd))
    assert code == 1
    assert "--format" in out
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"a,b\n1,2\n3\n")
    code, out = shamal("data", "ingest", "errs", "--from", str(bad))
    assert code == 1
    assert "ragged row" in out
    assert "Traceback" not in out
    code, out = shamal("data", "show", "errs")
    assert code == 1
    assert "no valid version" in out
    code, out = shamal("data", "show", "missing/1")
    assert code == 1
    assert "does not exist" in out
    code, out = shamal("data", "ingest", "errs", "--from", str(bad), "--mode", "sideways")
    assert code == 1
    assert "append or overwrite" in out


def test_load_reads_a_version_and_logs_it_as_the_active_runs_input(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import mlflow

    import shamal.data

    monkeypatch.setenv("SHAMAL_URL", server.url)
    monkeypatch.setenv("SHAMAL_TOKEN", server.token)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", server.token)
    mlflow.set_tracking_uri(server.url)  # as the suite's other mlflow users do: it is global
    mlflow.set_experiment("data-sdk")  # and so is the experiment an earlier test chose
    with ShamalClient(server.url, server.token) as api:
        api.create_dataset("train-set", team="analytics")
        source = tmp_path / "t.parquet"
        pq.write_table(TABLE, source)
        api.ingest_file("train-set", source)
        api.ingest_file("train-set", source)
        api.set_dataset_alias("train-set", "prod", 1)
    assert shamal.data.load("train-set@prod").to_pylist() == TABLE.to_pylist()
    with mlflow.start_run() as run:
        table = shamal.data.load("train-set")
        sizes = [b.num_rows for b in shamal.data.batches("train-set/1", batch_size=30)]
    assert table.num_rows == 200
    assert sizes == [30, 30, 30, 10]
    inputs = mlflow.MlflowClient().get_run(run.info.run_id).inputs.dataset_inputs
    logged = {json.loads(i.dataset.source)["uri"]: i.dataset for i in inputs}
    assert set(logged) == {"data:/train-set/2", "data:/train-set/1"}
    latest = shamal.data.version("train-set")
    assert logged["data:/train-set/2"].digest == latest["digest"]
    assert logged["data:/train-set/2"].source_type == "shamal"


def test_a_suite_quarantines_a_bad_version_and_show_prints_the_report(
    shamal: Callable[..., tuple[int, str]], tmp_path: Path
) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text("version: 1\nexpectations:\n  - {kind: range, column: id, min: 0, max: 50}\n")
    source = tmp_path / "rows.csv"
    pacsv.write_csv(TABLE, source)
    assert shamal("data", "create", "checked", "--team", "analytics")[0] == 0
    code, out = shamal("data", "suite", "checked", "--file", str(suite))
    assert code == 0, out
    code, out = shamal("data", "suite", "checked")
    assert "range" in out
    code, out = shamal("data", "ingest", "checked", "--from", str(source))
    assert code == 0, out
    assert "quarantined" in out
    code, out = shamal("data", "show", "checked/1")
    assert code == 0, out
    assert "failed: quarantined" in out
    assert "FAILED" in out
    assert "49 of 100 rows fail" in out
    code, out = shamal("data", "show", "checked")
    assert code == 1
    assert "no valid version" in out
