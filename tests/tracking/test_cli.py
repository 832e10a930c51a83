"""`shamal experiments|runs|models` against a live server, data logged with the mlflow client."""

from __future__ import annotations

import json
import random
import re
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import mlflow
import pytest
import sqlalchemy as sa
from mlflow import MlflowClient
from mlflow.entities import Metric
from rich.cells import cell_len
from typer.testing import CliRunner

from shamal.cli import app
from shamal.db.models.tracking import RunRow
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
    dataset = mlflow.data.from_numpy(x, targets=y, name="iris-features")
    for c in (0.01, 10.0):
        with mlflow.start_run():
            mlflow.log_input(dataset, context="training")
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
    one = cli.invoke(app, ["models", "show", name, "--version", "2", "--json"])
    assert one.exit_code == 0, one.output
    detail = json.loads(one.output)
    assert (detail["model"], detail["version"], detail["aliases"]) == (name, 2, ["champion"])
    assert {"python_function", "sklearn"} <= set(detail["formats"])
    spec = detail["signature"]["inputs"][0]["tensor-spec"]
    assert (spec["dtype"], spec["shape"]) == (str(x.dtype), [-1, x.shape[1]])
    used = [(d["name"], d["digest"], d["context"]) for d in detail["lineage"]["datasets"]]
    assert used == [("iris-features", dataset.digest, "training")]
    table = cli.invoke(app, ["models", "show", name, "-v", "2"])
    assert table.exit_code == 0, table.output
    assert f"{x.dtype}[-1, {x.shape[1]}]" in table.output
    assert dataset.digest in table.output
    assert "training" in table.output
    missing = cli.invoke(app, ["models", "show", name, "--version", "9"])
    assert missing.exit_code == 1
    assert "Traceback" not in missing.output
    assert "not" in missing.output.lower()


def _log_experiment(name: str, rng: random.Random, statuses: list[str]) -> list[str]:
    """One run per status with random acc/loss (and f1 on every other run); returns run ids."""
    experiment_id = mlflow.set_experiment(name).experiment_id
    client = MlflowClient()
    ids = []
    for i, status in enumerate(statuses):
        run = client.create_run(experiment_id, run_name=f"{name}-{i}")
        run_id = run.info.run_id
        client.log_metric(run_id, "acc", rng.uniform(0.5, 1.0))
        client.log_metric(run_id, "loss", rng.uniform(0.0, 2.0))
        if i % 2:
            client.log_metric(run_id, "f1", rng.uniform(0.0, 1.0))
        if status != "RUNNING":
            client.set_terminated(run_id, status=status)
        ids.append(run_id)
    return ids


def _expected_summary(name: str, ids: list[str], maximize: bool | None) -> dict[str, Any]:
    """What `experiments compare` must say of an experiment, from the mlflow client's view."""
    client = MlflowClient()
    runs = [client.get_run(i) for i in ids]
    times = [client.get_experiment_by_name(name).last_update_time]
    best: dict[str, dict[str, Any]] = {}
    for run in runs:
        times += [t for t in (run.info.start_time, run.info.end_time) if t is not None]
        for key, value in run.data.metrics.items():
            times += [m.timestamp for m in client.get_metric_history(run.info.run_id, key)]
            # Without --max/--min a loss is best low, the others high.
            pick = max if (maximize if maximize is not None else key != "loss") else min
            if key not in best or pick(value, best[key]["value"]) != best[key]["value"]:
                best[key] = {
                    "value": value,
                    "run_id": run.info.run_id,
                    "run_name": run.info.run_name,
                }
    return {
        "runs": len(runs),
        "runs_by_status": dict(Counter(r.info.status for r in runs)),
        "last_activity": max(times),
        "best": best,
    }


def _table_rows(output: str) -> dict[str, list[str]]:
    """A Rich table's body rows: the first cell of each -> its other cells, stripped."""
    rows = {}
    for line in output.splitlines():
        if line.startswith("│"):
            label, *cells = (c.strip() for c in line.strip("│").split("│"))
            rows[label] = cells
    return rows


def test_experiments_compare_matches_the_logged_runs(cli: CliRunner) -> None:
    rng = random.Random()
    names = [f"cmp-a-{uuid.uuid4().hex[:8]}", f"cmp-b-{uuid.uuid4().hex[:8]}"]
    logged = {
        names[0]: _log_experiment(names[0], rng, ["FINISHED", "FINISHED", "FAILED", "RUNNING"]),
        names[1]: _log_experiment(names[1], rng, ["FINISHED", "KILLED", "FINISHED"]),
    }
    for maximize, flags in ((True, ["--max"]), (False, ["--min"]), (None, [])):
        result = cli.invoke(app, ["experiments", "compare", *names, *flags, "--json"])
        assert result.exit_code == 0, result.output
        shown = json.loads(result.stdout)
        assert [s["name"] for s in shown] == names
        for summary in shown:
            expected = _expected_summary(summary["name"], logged[summary["name"]], maximize)
            assert summary["goal"] == {True: "max", False: "min", None: "by name"}[maximize]
            assert summary["runs"] == expected["runs"]
            assert summary["runs_by_status"] == expected["runs_by_status"]
            assert summary["last_activity"] == expected["last_activity"]
            best = {
                k: {"value": b["value"], "run_id": b["run_id"], "run_name": b["run_name"]}
                for k, b in summary["best"].items()
            }
            assert best == expected["best"]

    # The table: one metric, its best value per experiment, the winner marked, and the best
    # runs with their ids as the CLI shows them everywhere (and takes back).
    table = cli.invoke(app, ["experiments", "compare", *names, "--metric", "acc"])
    assert table.exit_code == 0, table.output
    rows = _table_rows(table.stdout)
    expected = [_expected_summary(n, logged[n], maximize=True) for n in names]
    assert rows["runs"] == [str(e["runs"]) for e in expected]
    for status in ("FINISHED", "FAILED", "KILLED", "RUNNING"):
        assert rows[status.lower()] == [str(e["runs_by_status"].get(status, 0)) for e in expected]
    bests = [e["best"]["acc"] for e in expected]
    winner = max(b["value"] for b in bests)
    assert rows["acc (max)"] == [
        f"{b['value']:.6g}{' ▲' if b['value'] == winner else ''}" for b in bests
    ]
    assert rows["best run"] == [f"{b['run_name']} {b['run_id'][:12]}" for b in bests]
    assert "loss (max)" not in rows
    by_name = _table_rows(cli.invoke(app, ["experiments", "compare", *names]).stdout)
    losses = [_expected_summary(n, logged[n], maximize=None)["best"]["loss"] for n in names]
    lowest = min(b["value"] for b in losses)
    assert by_name["loss (min)"] == [
        f"{b['value']:.6g}{' ▼' if b['value'] == lowest else ''}" for b in losses
    ]
    assert "acc (max)" in by_name

    unknown = cli.invoke(app, ["experiments", "compare", *names, "--metric", "nope"])
    assert unknown.exit_code == 0, unknown.output
    assert "no run of these experiments has a finite value of metric 'nope'" in unknown.stderr
    assert "acc, f1, loss" in unknown.stderr
    missing = cli.invoke(app, ["experiments", "compare", names[0], f"no-such-{uuid.uuid4().hex}"])
    assert missing.exit_code == 1
    assert "shamal experiments list" in missing.stderr
    assert missing.exception is None or isinstance(missing.exception, SystemExit)
    one = cli.invoke(app, ["experiments", "compare", names[0]])
    assert one.exit_code == 2
    assert "at least two" in one.output


def test_runs_and_experiments_lists_read_well_at_80_and_200_columns(cli: CliRunner) -> None:
    name = f"layout-{uuid.uuid4().hex[:8]}"
    mlflow.set_experiment(name)
    metrics = ("acc", "f1", "loss", "precision", "recall", "val_loss")
    runs = {}
    for lr in ("0.1", "0.01", "0.001"):
        with mlflow.start_run(run_name=f"resnet50-lr{lr}") as run:
            mlflow.log_metrics({key: random.uniform(0, 1) for key in metrics})
        runs[run.info.run_id] = MlflowClient().get_run(run.info.run_id)

    def shown(width: int, *args: str) -> str:
        result = cli.invoke(app, list(args), env={"COLUMNS": str(width)})
        assert result.exit_code == 0, result.output
        return result.stdout

    def row_of(text: str, first: str) -> str:
        (line,) = [line for line in text.splitlines() if line.startswith(f"│ {first} ")]
        return line

    narrow = shown(80, "runs", "list", name)
    assert max(cell_len(line.rstrip()) for line in narrow.splitlines()) <= 80, narrow
    assert "…" not in narrow, narrow
    for run_id, run in runs.items():
        row = row_of(narrow, run_id[:12])
        assert run.info.run_name in row, narrow
        assert "FINISHED" in row, narrow
        assert " ago " in row or " now " in row, narrow
    wide = shown(200, "runs", "list", name)
    header = next(line for line in wide.splitlines() if "┃ run id " in line)
    for column in ("run_id", "run_name", "status", "start_time", *metrics):
        assert f"┃ {column.replace('_', ' ')} " in header, wide  # headers show _ as spaces
    for run_id, run in runs.items():
        started = datetime.fromtimestamp(run.info.start_time / 1000, UTC)
        assert f"{started:%Y-%m-%d %H:%M:%S}" in row_of(wide, run_id[:12]), wide

    experiment_id = MlflowClient().get_experiment_by_name(name).experiment_id
    listed = shown(80, "experiments", "list", "--filter", f"name = '{name}'")
    assert max(cell_len(line.rstrip()) for line in listed.splitlines()) <= 80, listed
    assert "…" not in listed, listed
    assert name in row_of(listed, experiment_id), listed
    as_json = shown(80, "experiments", "list", "--filter", f"name = '{name}'", "--json")
    assert as_json == shown(200, "experiments", "list", "--filter", f"name = '{name}'", "--json")
    assert [e["name"] for e in json.loads(as_json)] == [name]


def _twin_of(server: LiveServer, run_id: str) -> str:
    """Store a second run whose id shares the first 12 characters of ``run_id``, and only those
    (ids are random, so a clash has to be made): straight into the server's database."""
    twin = run_id[:12] + ("0" if run_id[12] != "0" else "1") + uuid.uuid4().hex[13:]
    url = server.env.get("SHAMAL_DATABASE_URL") or f"sqlite:///{server.home / 'shamal.db'}"
    engine = sa.create_engine(url)
    try:
        runs = RunRow.__table__
        with engine.begin() as conn:
            row = conn.execute(sa.select(runs).where(runs.c.run_id == run_id)).mappings().one()
            conn.execute(sa.insert(runs).values({**row, "run_id": twin, "name": "twin"}))
    finally:
        engine.dispose()
    return twin


def _shown_ids(output: str) -> list[str]:
    """The run ids a table shows (12 characters or more)."""
    return re.findall(r"(?<![0-9a-f])[0-9a-f]{12,32}(?![0-9a-f])", output)


def test_run_ids_as_shown_are_taken_back(cli: CliRunner, mlflow_env: LiveServer) -> None:
    name = f"short-{uuid.uuid4().hex[:8]}"
    mlflow.set_experiment(name)
    accs = {}
    for i in range(2):
        with mlflow.start_run(run_name=f"short-{i}") as run:
            accs[run.info.run_id] = random.uniform(0, 1)
            mlflow.log_metric("acc", accs[run.info.run_id])
    listed = cli.invoke(app, ["runs", "list", name])
    assert listed.exit_code == 0, listed.output
    shown = _shown_ids(listed.stdout)
    assert sorted(shown) == sorted(i[:12] for i in accs)

    for short in shown:
        full = next(i for i in accs if i.startswith(short))
        show = cli.invoke(app, ["runs", "show", short])
        assert show.exit_code == 0, show.output
        assert full in show.stdout
        assert f"{accs[full]:.6g}" in show.stdout
        assert cli.invoke(app, ["runs", "show", short[:8], "--json"]).exit_code == 0
    compared = cli.invoke(app, ["runs", "compare", *shown, "--json"])
    assert compared.exit_code == 0, compared.output
    assert [r["run_id"] for r in json.loads(compared.stdout)] == [
        next(i for i in accs if i.startswith(s)) for s in shown
    ]
    table = cli.invoke(app, ["runs", "compare", *shown])
    assert table.exit_code == 0, table.output
    assert sorted(_shown_ids(table.stdout)) == sorted(shown)

    # Two runs that start alike: the short form names both, so it is refused with both listed.
    first = next(iter(accs))
    twin = _twin_of(mlflow_env, first)
    for args in (["runs", "show", first[:12]], ["runs", "compare", first[:12], shown[0]]):
        ambiguous = cli.invoke(app, args)
        assert ambiguous.exit_code == 1, ambiguous.output
        assert f"run id prefix '{first[:12]}' is ambiguous: 2 runs start with it" in (
            ambiguous.stderr
        )
        assert first in ambiguous.stderr
        assert twin in ambiguous.stderr
        assert "give more characters" in ambiguous.stderr
        assert "Traceback" not in ambiguous.output
    assert cli.invoke(app, ["runs", "show", first]).exit_code == 0
    assert cli.invoke(app, ["runs", "compare", first, twin]).exit_code == 0
    # ... and the tables now show as much of the two ids as tells them apart, which works.
    relisted = _shown_ids(cli.invoke(app, ["runs", "list", name]).stdout)
    assert sorted(relisted) == sorted(i[:13] for i in [*accs, twin])
    for short in relisted:
        again = cli.invoke(app, ["runs", "show", short, "--json"])
        assert again.exit_code == 0, again.output
        assert json.loads(again.stdout)["run_id"].startswith(short)

    unknown_prefix = uuid.uuid4().hex[:10]
    for args in (
        ["runs", "show", unknown_prefix],
        ["runs", "compare", shown[0], unknown_prefix],
        ["runs", "show", uuid.uuid4().hex],
    ):
        unknown = cli.invoke(app, args)
        assert unknown.exit_code == 1, unknown.output
        assert "not found" in unknown.stderr or "no run you can see" in unknown.stderr
        assert "shamal runs list EXPERIMENT" in unknown.stderr
        assert "Traceback" not in unknown.output
    for bad in ("f00de26", "not-an-id", "g" * 12):
        refused = cli.invoke(app, ["runs", "show", bad])
        assert refused.exit_code == 1, refused.output
        assert "is not a run id" in refused.stderr
        assert "at least the first 8" in refused.stderr


def test_runs_show_draws_curves_and_runs_plot_writes_a_chart(
    cli: CliRunner, mlflow_env: LiveServer, tmp_path: Path
) -> None:
    mlflow.set_experiment(f"cli-curves-{uuid.uuid4().hex[:8]}")
    ids = []
    for scale in (1.0, 2.0):
        with mlflow.start_run() as run:
            for step in range(40):
                mlflow.log_metric("loss", scale / (1 + step), step=step)
            mlflow.log_metric("acc", 0.5, step=0)
            mlflow.log_metric("acc", float("nan"), step=1)
            if scale == 2.0:
                mlflow.log_metric("only_in_b", 1.0)
        ids.append(run.info.run_id)

    shown = cli.invoke(app, ["runs", "show", ids[1]])
    assert shown.exit_code == 0, shown.output
    loss_row = next(line for line in shown.output.splitlines() if "│ loss" in line)
    cells = [cell.strip() for cell in loss_row.split("│")[1:-1]]
    # key, latest, step, min, max, points, curve: a falling loss, highest block first.
    assert cells[:6] == ["loss", "0.05", "39", "0.05", "2", "40"]
    assert cells[6][0] == "█"
    assert cells[6][-1] == "▁"
    acc_row = next(line for line in shown.output.splitlines() if "│ acc" in line)
    assert [c.strip() for c in acc_row.split("│")[1:-1]][3:6] == ["0.5", "0.5", "2"]
    plain = cli.invoke(app, ["runs", "show", ids[1], "--no-curves"])
    assert plain.exit_code == 0, plain.output
    assert "curve" not in plain.output

    chart = tmp_path / "charts" / "loss"
    drawn = cli.invoke(
        app, ["runs", "plot", ids[0][:12], ids[1], "--metric", "loss", "--out", str(chart)]
    )
    assert drawn.exit_code == 0, drawn.output
    assert (tmp_path / "charts" / "loss.png").read_bytes().startswith(b"\x89PNG")
    assert "loss of 2 run(s)" in " ".join(drawn.output.split())
    args = ["runs", "plot", ids[0], ids[1], "-m", "only_in_b", "-o", str(chart)]
    partial = cli.invoke(app, args)
    assert partial.exit_code == 0, partial.output
    assert "only_in_b of 1 run(s)" in " ".join(partial.output.split())
    one = cli.invoke(app, ["runs", "plot", ids[0], ids[1], "--metric", "acc", "--out", str(chart)])
    assert one.exit_code == 0, one.output

    for options, message in (
        (["--metric", "nope"], "no run given has the metric 'nope'"),
        (["--out", str(tmp_path)], "is a folder; give a file name"),
        (["--out", str(tmp_path / "x.txt")], "cannot draw a .txt file"),
        (["--x", "epoch"], "--x takes step or time"),
    ):
        refused = cli.invoke(app, ["runs", "plot", ids[0], *options])
        assert refused.exit_code == 1, refused.output
        assert message in " ".join(refused.output.split())
        assert "Traceback" not in refused.output


def test_the_sdk_reads_a_long_history_page_after_page(mlflow_env: LiveServer) -> None:
    from shamal.client import ShamalClient

    mlflow.set_experiment(f"sdk-history-{uuid.uuid4().hex[:8]}")
    with mlflow.start_run() as run:
        MlflowClient().log_batch(
            run.info.run_id,
            metrics=[Metric("m", float(s), 1_700_000_000_000 + s, s) for s in range(25)],
        )
    with ShamalClient(mlflow_env.url, mlflow_env.token) as api:
        points = api.metric_history(run.info.run_id, "m", page_size=7)
    assert [p["step"] for p in points] == list(range(25))
    assert [p["value"] for p in points] == [float(s) for s in range(25)]
