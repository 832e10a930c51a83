"""The registry side of the optimizer against a real server, with the stock mlflow client as
the judge: resolving models:/ URIs, downloading a version's files, and `shamal optimize`
registering a linked int8 version (and refusing to register a blocked one)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import numpy as np
import pytest
import typer
from mlflow import MlflowClient
from typer.testing import CliRunner

from shamal.cli.optimize import EXIT_BLOCKED, optimize
from shamal.client import ShamalClient
from shamal.errors import InvalidParameter, NotFound
from shamal.optimize import read_model_folder
from tests.live import LiveServer
from tests.optimize.conftest import MLP_TRUSTED

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:.*Any type hint is inferred:UserWarning"),
]


def _log(model: object, name: str, *, example: np.ndarray | None = None) -> str:
    """Log ``model`` with the stock client, register it; returns the run id."""
    import mlflow
    import mlflow.sklearn

    mlflow.set_experiment("optimize-tests")
    with mlflow.start_run() as run:
        mlflow.sklearn.log_model(
            model,
            name="model",
            skops_trusted_types=MLP_TRUSTED,
            input_example=example,
            pip_requirements=[],  # mlflow would spend seconds inferring them
        )
    mlflow.register_model(f"runs:/{run.info.run_id}/model", name)
    return str(run.info.run_id)


@pytest.fixture
def registered(mlflow_live: LiveServer, wine_mlp: object) -> str:
    """A fresh registered model with version 1 (the wine MLP)."""
    name = f"wine-{uuid.uuid4().hex[:8]}"
    _log(wine_mlp, name)
    return name


def test_resolve_model_uri_forms_and_errors(registered: str, wine_mlp: object) -> None:
    run_id = _log(wine_mlp, registered)  # version 2
    MlflowClient().set_registered_model_alias(registered, "champion", "1")
    with ShamalClient() as api:
        one = api.resolve_model_uri(f"models:/{registered}/1")
        assert (one.name, one.version) == (registered, 1)
        assert one.source.startswith("runs:/") or one.source.startswith("models:/")
        assert one.run_id
        latest = api.resolve_model_uri(f"models:/{registered}/latest")
        assert (latest.version, latest.run_id) == (2, run_id)
        assert api.resolve_model_uri(f"models:/{registered}@champion").version == 1
        for bad in (
            "runs:/x/model",
            f"models:/{registered}",
            f"models:/{registered}/0",
            f"models:/{registered}/v1",
            f"models:/{registered}@",
            "models:/@a",
        ):
            with pytest.raises(InvalidParameter):
                api.resolve_model_uri(bad)
        for missing in (
            f"models:/{registered}/9",
            f"models:/{registered}@nope",
            "models:/no-such-model/latest",
            "models:/no-such-model/1",
        ):
            with pytest.raises(NotFound):
                api.resolve_model_uri(missing)


def test_download_writes_every_file_and_returns_the_model_folder(
    registered: str, tmp_path: Path
) -> None:
    with ShamalClient() as api:
        folder = api.download_model_version(registered, 1, tmp_path / "dl")
    assert (folder / "MLmodel").is_file()
    assert (folder / "model.skops").stat().st_size > 1000
    names = {p.relative_to(tmp_path / "dl").as_posix() for p in (tmp_path / "dl").rglob("*")}
    assert {"MLmodel", "model.skops", "requirements.txt"} <= {Path(n).name for n in names}
    assert not [n for n in names if ".part-" in n]


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("optimize")(optimize)
    app.command("noop")(lambda: None)  # two commands: the first is called by name
    return app


def _eval_file(tmp_path: Path, wine: tuple[np.ndarray, ...]) -> Path:
    _, x_test, _, y_test = wine
    path = tmp_path / "heldout.npz"
    np.savez(path, input=x_test.astype(np.float32), y=y_test)
    return path


def test_optimize_registers_a_linked_int8_version(
    registered: str, tmp_path: Path, wine: tuple[np.ndarray, ...]
) -> None:
    args = ["optimize", f"models:/{registered}/1", "--int8", "dynamic", "--eval",
            str(_eval_file(tmp_path, wine)), "--batch-sizes", "1,8", "--threads", "1",
            "-o", str(tmp_path / "out"), "--json"]  # fmt: skip
    result = CliRunner().invoke(_app(), args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["registered"] == {"name": registered, "version": 2}
    candidate = report["variants"][-1]
    assert candidate["name"] == "int8-dynamic-per-channel"
    assert candidate["verdict"] == "OK"
    assert candidate["fidelity"]["metric"] == "accuracy"
    assert candidate["fidelity"]["original"] - candidate["fidelity"]["variant"] <= 0.01
    assert {(t["batch"], t["threads"]) for t in candidate["timings"]} == {(1, 1), (8, 1)}

    version = MlflowClient().get_model_version(registered, "2")
    assert version.tags["shamal.source_model_uri"] == f"models:/{registered}/1"
    assert version.tags["shamal.source_version"] == "1"
    assert version.tags["shamal.variant"] == "int8-dynamic-per-channel"
    assert float(version.tags["shamal.fidelity.variant"]) == pytest.approx(
        candidate["fidelity"]["variant"], abs=1e-6
    )
    assert float(version.tags["shamal.latency.p50_ms.b1.t1"]) > 0
    run = MlflowClient().get_run(version.run_id)
    assert run.data.tags["shamal.variant"] == "int8-dynamic-per-channel"
    assert run.info.status == "FINISHED"

    # The registered files are a model folder that points back at its source.
    with ShamalClient() as api:
        folder = api.download_model_version(registered, 2, tmp_path / "v2")
    manifest = read_model_folder(folder)
    assert manifest.source == {
        "model_uri": f"models:/{registered}/1",
        "variant": "int8-dynamic-per-channel",
    }
    assert manifest.task == "classification"


def test_extreme_pruning_is_blocked_and_not_registered(
    registered: str, tmp_path: Path, wine: tuple[np.ndarray, ...]
) -> None:
    args = ["optimize", f"models:/{registered}/1", "--prune", "0.95", "--eval",
            str(_eval_file(tmp_path, wine)), "--batch-sizes", "1", "--threads", "1",
            "-o", str(tmp_path / "out")]  # fmt: skip
    result = CliRunner().invoke(_app(), args)
    assert result.exit_code == EXIT_BLOCKED, result.output
    assert "BLOCKED" in result.output
    assert [v.version for v in MlflowClient().search_model_versions(f"name = '{registered}'")] == [
        "1"
    ]


def test_logged_input_example_is_the_default_held_out_set(
    mlflow_live: LiveServer, wine_mlp: object, wine: tuple[np.ndarray, ...], tmp_path: Path
) -> None:
    name = f"wine-ex-{uuid.uuid4().hex[:8]}"
    _log(wine_mlp, name, example=wine[1][:20])
    args = ["optimize", f"models:/{name}/latest", "--batch-sizes", "1", "--threads", "1",
            "-o", str(tmp_path / "out"), "--no-register", "--json"]  # fmt: skip
    result = CliRunner().invoke(_app(), args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    fidelity = report["variants"][-1]["fidelity"]
    assert (fidelity["origin"], fidelity["rows"]) == ("logged input example", 20)
    assert fidelity["metric"] == "label agreement"  # no labels logged: agreement with original
    assert report["registered"] is None
    assert [v.version for v in MlflowClient().search_model_versions(f"name = '{name}'")] == ["1"]


def test_local_folder_registered_under_a_new_name(
    mlflow_live: LiveServer, wine_mlp: object, wine: tuple[np.ndarray, ...], tmp_path: Path
) -> None:
    import mlflow.sklearn

    folder = tmp_path / "local-model"
    mlflow.sklearn.save_model(
        wine_mlp, str(folder), skops_trusted_types=MLP_TRUSTED, pip_requirements=[]
    )
    name = f"local-{uuid.uuid4().hex[:8]}"
    args = ["optimize", str(folder), "--eval", str(_eval_file(tmp_path, wine)),
            "--batch-sizes", "1", "--threads", "1", "-o", str(tmp_path / "out"),
            "--register-as", name]  # fmt: skip
    result = CliRunner().invoke(_app(), args, env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert f"registered models:/{name}/1" in result.output
    assert "int8-dynamic-per-channel" in result.output
    version = MlflowClient().get_model_version(name, "1")
    assert version.tags["shamal.source_model_uri"] == str(folder)
    assert "shamal.source_version" not in version.tags
    with ShamalClient() as api:
        registered = read_model_folder(api.download_model_version(name, 1, tmp_path / "dl"))
    assert registered.source == {"model_uri": str(folder), "variant": "int8-dynamic-per-channel"}
    experiment = MlflowClient().get_experiment(
        MlflowClient().get_run(version.run_id).info.experiment_id
    )
    assert experiment.name == "shamal-optimize"
