"""`shamal experiments|runs|models` against a live server, data logged with the mlflow client."""

from __future__ import annotations

import json
import uuid

import mlflow
import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from shamal.cli import app
from tests.live import LiveServer

pytestmark = pytest.mark.slow


@pytest.fixture
def cli(mlflow_env: LiveServer, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("SHAMAL_URL", mlflow_env.url)
    monkeypatch.setenv("SHAMAL_TOKEN", mlflow_env.token)
    monkeypatch.setenv("COLUMNS", "200")
    return CliRunner()


def test_experiments_runs_and_compare(cli: CliRunner) -> None:
    name = f"cli-{uuid.uuid4().hex[:8]}"
    mlflow.set_experiment(name)
    ids = []
    for lr, acc in (("0.1", 0.81), ("0.01", 0.93)):
        with mlflow.start_run(run_name=f"lr-{lr}") as run:
            mlflow.log_param("lr", lr)
            mlflow.log_metric("acc", acc)
            mlflow.log_metric("loss", 1 - acc)
        ids.append(run.info.run_id)
    listed = cli.invoke(app, ["experiments", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    assert name in [e["name"] for e in json.loads(listed.output)]
    shown = cli.invoke(app, ["experiments", "show", name])
    assert shown.exit_code == 0, shown.output
    assert "lr-0.1" in shown.output
    assert "lr-0.01" in shown.output
    best = cli.invoke(app, ["runs", "list", name, "--order-by", "metrics.acc DESC", "--json"])
    assert [r["run_id"] for r in json.loads(best.output)] == [ids[1], ids[0]]
    filtered = cli.invoke(app, ["runs", "list", name, "--filter", "params.lr = '0.1'", "--json"])
    assert [r["run_id"] for r in json.loads(filtered.output)] == [ids[0]]
    compared = cli.invoke(app, ["runs", "compare", *ids])
    assert compared.exit_code == 0, compared.output
    acc_row = next(line for line in compared.output.splitlines() if "metric acc" in line)
    assert "0.81" in acc_row
    assert "0.93 ▲" in acc_row
    shown_run = cli.invoke(app, ["runs", "show", ids[0]])
    assert "lr" in shown_run.output
    assert "0.81" in shown_run.output
    bad = cli.invoke(app, ["runs", "list", name, "--filter", "name = 'x' OR 1=1"])
    assert bad.exit_code == 1
    assert "INVALID_PARAMETER_VALUE" in bad.output


def test_models_list_show_compare(cli: CliRunner) -> None:
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    x, y = load_iris(return_X_y=True)
    mlflow.set_experiment(f"cli-models-{uuid.uuid4().hex[:8]}")
    name = f"iris-{uuid.uuid4().hex[:8]}"
    for c in (0.01, 10.0):
        with mlflow.start_run():
            model = LogisticRegression(C=c, max_iter=500).fit(x, y)
            mlflow.log_param("C", c)
            mlflow.log_metric("train_acc", model.score(x, y))
            mlflow.sklearn.log_model(
                model, name="model", registered_model_name=name, input_example=x[:2]
            )
    MlflowClient().set_registered_model_alias(name, "champion", "2")
    listed = cli.invoke(app, ["models", "list", "--search", name[:8], "--json"])
    assert listed.exit_code == 0, listed.output
    assert [m["name"] for m in json.loads(listed.output)] == [name]
    shown = cli.invoke(app, ["models", "show", name])
    assert shown.exit_code == 0, shown.output
    assert "@champion" in shown.output
    compared = cli.invoke(app, ["models", "compare", name, "1", "2"])
    assert compared.exit_code == 0, compared.output
    assert "param C" in compared.output
    assert "metric train_acc" in compared.output
