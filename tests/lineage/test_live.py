"""Lineage end to end against a real server process, with the stock MLflow client.

A dataset is ingested; one run reads it through ``shamal.data.load`` (the SDK logs the read),
another logs it with the stock ``mlflow.log_input`` of ``shamal.data.mlflow_dataset``; the
first run logs a model, registered as version 1 and deployed; the second registers version 2
from its own files. ``GET /api/v1/lineage`` (through the client) walks from the data version
down to the deployment and from the deployment back up to the source, and ``shamal lineage``
prints it. ``shamal data diff`` compares two versions of the dataset.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from typer.testing import CliRunner

from shamal.cli import app
from shamal.client import ShamalClient
from tests.live import LiveServer

pytestmark = pytest.mark.slow

TABLE = pa.table({"id": list(range(50)), "amount": [i * 1.5 for i in range(50)]})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("lineage-home")) as live:
        with ShamalClient(live.url, live.token) as api:
            api.create_team("analytics")
        yield live


@pytest.fixture
def cli(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[int, str]]:
    monkeypatch.setenv("SHAMAL_URL", server.url)
    monkeypatch.setenv("SHAMAL_TOKEN", server.token)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", server.token)
    runner = CliRunner()

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
        return result.exit_code, result.output

    return run


def _edges(graph: dict[str, object]) -> set[tuple[str, str, str]]:
    edges = graph["edges"]
    assert isinstance(edges, list)
    return {(e["source"], e["target"], e["relation"]) for e in edges}


def _the_cli_prints_it(cli: Callable[..., tuple[int, str]], data: str) -> None:
    code, out = cli("lineage", data)
    assert code == 0, out
    for shown in (
        "upstream",
        "downstream",
        "source:/customers/1",
        "deployments:/churn-api",
        "digest differs",
    ):
        assert shown in out
    code, out = cli("lineage", "deployments:/churn-api", "--direction", "up", "--json")
    assert code == 0, out
    assert json.loads(out)["start"] == "deployments:/churn-api"
    for hostile in ("file:///etc/passwd", "data:/../../x", "http://127.0.0.1:5432/"):
        code, out = cli("lineage", hostile)
        assert code == 1
        assert "lineage starts from" in out
        assert "Traceback" not in out
    code, out = cli("lineage", "runs:/" + "f" * 32)
    assert code == 1
    assert "nothing at that URI" in out
    code, out = cli("lineage", data, "--direction", "sideways")
    assert code == 1
    assert "up, down or both" in out


def test_lineage_from_the_data_to_the_deployment_and_back(
    server: LiveServer,
    cli: Callable[..., tuple[int, str]],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    import mlflow

    import shamal.data

    mlflow.set_tracking_uri(server.url)  # process-global: other tests' servers may have set it
    mlflow.set_registry_uri(server.url)  # the same for the registry (the quickstart sets it)
    experiment = mlflow.set_experiment("lineage-e2e")  # and so is the active experiment
    source = tmp_path / "customers.csv"
    pacsv.write_csv(TABLE, source)
    api = ShamalClient(server.url, server.token)
    request.addfinalizer(api.close)
    api.create_dataset("customers", team="analytics")
    data = api.ingest_file("customers", source)["uri"]
    assert data == "data:/customers/1"
    with mlflow.start_run() as first:
        assert shamal.data.load("customers").num_rows == 50  # the SDK logs the read
    with mlflow.start_run() as second:
        mlflow.log_input(shamal.data.mlflow_dataset("customers"), context="training")
    with mlflow.start_run() as third:  # a DataFrame whose source names the version
        frame = mlflow.data.from_pandas(TABLE.to_pandas(), source="data:/customers@latest")
        mlflow.log_input(frame)
    sdk_run, stock_run, frame_run = first.info.run_id, second.info.run_id, third.info.run_id
    client = mlflow.MlflowClient()
    # Both paths logged the very same input: one row, the same source and digest.
    logged = [client.get_run(r).inputs.dataset_inputs[0].dataset for r in (sdk_run, stock_run)]
    assert {(d.source_type, d.source, d.digest) for d in logged} == {
        ("shamal", json.dumps({"uri": data}), api.dataset_version(data)["digest"])
    }
    model = client.create_logged_model(
        experiment.experiment_id, name="model", source_run_id=sdk_run
    )
    client.create_registered_model("churn")  # no team: open to every account
    client.create_model_version(
        "churn", f"models:/{model.model_id}", run_id=sdk_run, model_id=model.model_id
    )
    client.create_model_version("churn", f"runs:/{stock_run}/model", run_id=stock_run)
    api.deploy("churn-api", {"primary": [{"model": "models:/churn/1"}], "team": "analytics"})

    down = api.lineage(data, direction="down")
    assert _edges(down) == {
        (data, f"runs:/{sdk_run}", "read"),
        (data, f"runs:/{stock_run}", "read"),
        (data, f"runs:/{frame_run}", "read"),
        (f"runs:/{sdk_run}", f"models:/{model.model_id}", "logged"),
        (f"models:/{model.model_id}", "models:/churn/1", "registered"),
        (f"runs:/{stock_run}", "models:/churn/2", "registered"),
        ("models:/churn/1", "deployments:/churn-api", "serves"),
    }
    matches = {
        e["target"]: e["attributes"]["digest_matches"]
        for e in down["edges"]
        if e["relation"] == "read"
    }
    # The two Shamal paths carry the version's digest; the DataFrame, MLflow's own.
    assert (matches[f"runs:/{sdk_run}"], matches[f"runs:/{stock_run}"]) == (True, True)
    assert matches[f"runs:/{frame_run}"] is False
    up = api.lineage("deployments:/churn-api", direction="up")
    assert ("source:/customers/1", data, "ingested") in _edges(up)
    assert (data, f"runs:/{sdk_run}", "read") in _edges(up)

    _the_cli_prints_it(cli, data)


def test_data_diff_prints_a_table(cli: Callable[..., tuple[int, str]], tmp_path: Path) -> None:
    first = tmp_path / "a.csv"
    pacsv.write_csv(TABLE, first)
    second = tmp_path / "b.csv"
    shifted = pa.table(
        {"id": list(range(80)), "amount": [i * 10.0 for i in range(80)], "note": ["x"] * 80}
    )
    pacsv.write_csv(shifted, second)
    assert cli("data", "create", "spend", "--team", "analytics")[0] == 0
    assert cli("data", "ingest", "spend", "--from", str(first))[0] == 0
    assert cli("data", "ingest", "spend", "--from", str(second), "--mode", "overwrite")[0] == 0
    code, out = cli("data", "diff", "spend/1", "spend/2")
    assert code == 0, out
    assert "data:/spend/1 -> data:/spend/2" in out
    assert "(+30)" in out
    assert "added (string)" in out
    assert "major" in out  # amount's distribution moved far
    code, out = cli("data", "diff", "spend/1", "spend@latest", "--json")
    assert code == 0, out
    assert json.loads(out)["added"][0]["name"] == "note"
    code, out = cli("data", "diff", "spend/1", "other/2")
    assert code == 1
    assert "two versions of one dataset" in out
    code, out = cli("data", "diff", "spend/1", "spend/9")
    assert code == 1
    assert "Traceback" not in out
