"""Pipelines end to end on a real server: steps run as jobs on the local executor, pass
small values, fan out, hit the cache, fail and retry, and show up in MLflow as a parent run
with a nested run per step."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from shamal.cli import app
from shamal.client import ShamalClient
from shamal.errors import InvalidParameter
from shamal.pipelines import load_pipeline
from tests import needs
from tests.live import LiveServer
from tests.polling import wait_for

pytestmark = pytest.mark.slow

STEPS = """
import os
from shamal.pipelines import pipeline, step


@step(cpus=0.1, memory_mib=256)
def items(n: int) -> list[int]:
    return list(range(n))


@step(cpus=0.1, memory_mib=256)
def square(i: int, offset: int = 0) -> int:
    return i * i + offset


@step(cpus=0.1, memory_mib=256)
def total(values: list[int]) -> dict:
    return {"sum": sum(values), "count": len(values)}


@step(cpus=0.1, memory_mib=256, cache=False)
def check(summary: dict, fail: bool) -> str:
    if fail:
        raise RuntimeError("asked to fail")
    return f"{summary['count']} items"


@pipeline
def fanout(n: int = 4, fail: bool = False) -> None:
    summary = total(square.map(items(n)))
    check(summary, fail)
"""


WIDE = """
from shamal.pipelines import pipeline, step

@step(cpus=0.1, memory_mib=256)
def ones(n: int) -> list[int]:
    return [1] * n

@step(cpus=0.1, memory_mib=256)
def each(i: int) -> int:
    return i

@pipeline
def wide(n: int = 6000) -> None:
    each.map(ones(n))
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    home = tmp_path_factory.mktemp("home")
    env = {"SHAMAL_SCHEDULER__TICK_S": "0.1"}
    with LiveServer(home, env) as live:
        yield live


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Iterator[ShamalClient]:
    with ShamalClient(server.url, server.token) as api:
        api.request("POST", "/api/v1/teams", json={"name": "ml"})
        yield api


@pytest.fixture(scope="module")
def registered(client: ShamalClient, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("code")
    (folder / "flow.py").write_text(textwrap.dedent(STEPS))
    spec, root = load_pipeline(f"{folder / 'flow.py'}:fanout")
    snapshot = client.upload_snapshot(root, "ml")
    body = spec.to_json() | {"team": "ml"}
    return client.register_pipeline(body, snapshot)


def _finished(client: ShamalClient, run_id: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def ended() -> bool:
        run = client.pipeline_run(run_id)
        found[:] = [run]
        return run["state"] != "running"

    wait_for(ended, f"pipeline run {run_id} to end", 180)
    return found[0]


def _steps(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["key"]: s for s in run["steps"]}


def test_a_fan_out_runs_each_step_as_a_job_and_gathers_in_order(
    client: ShamalClient, registered: dict[str, Any]
) -> None:
    assert registered["created"] is True
    run = _finished(client, client.start_pipeline("fanout", {"n": 4})["id"])
    assert run["state"] == "succeeded", (
        run["reason"],
        [(s["key"], s["state"], s["reason"]) for s in run["steps"]],
    )
    steps = _steps(run)
    assert steps["square"]["output"] == [0, 1, 4, 9]
    assert [steps[f"square[{i}]"]["state"] for i in range(4)] == ["succeeded"] * 4
    assert steps["total"]["output"] == {"sum": 14, "count": 4}
    assert steps["check"]["output"] == "4 items"
    assert all(s["job_id"] for k, s in steps.items() if k != "square")
    # The same inputs again: every cacheable step comes from the cache, no job runs for it.
    again = _finished(client, client.start_pipeline("fanout", {"n": 4})["id"])
    assert again["state"] == "succeeded"
    cached = _steps(again)
    assert cached["items"]["state"] == "cached"
    assert cached["total"]["state"] == "cached"
    assert cached["items"]["job_id"] is None
    assert cached["items"]["cached_from"] == f"{run['id']}/items"
    # The hit is an edge of the lineage graph: the step run that made the result -> the one
    # that reused it, both ways.
    producer = f"runs:/{steps['items']['mlflow_run_id']}"
    reuser = f"runs:/{cached['items']['mlflow_run_id']}"
    for start, way in ((reuser, "up"), (producer, "down")):
        graph = client.lineage(start, direction=way, depth=1)
        edges = {(e["source"], e["target"], e["relation"]) for e in graph["edges"]}
        assert (producer, reuser, "reused") in edges, graph
    # check opted out of the cache: it ran again, and says why.
    assert cached["check"]["state"] == "succeeded"
    assert cached["check"]["cache_note"] == "caching is off for this step"
    # A changed parameter misses where it matters, and says which argument changed.
    third = _steps(_finished(client, client.start_pipeline("fanout", {"n": 5})["id"]))
    assert third["items"]["state"] == "succeeded"
    assert third["items"]["cache_note"] == "arguments changed: n"
    assert third["square[3]"]["state"] == "cached"
    assert third["square[4]"]["state"] == "succeeded"
    assert third["total"]["output"] == {"sum": 30, "count": 5}


def test_a_failed_step_stops_what_follows_and_a_retry_reuses_the_rest(
    client: ShamalClient, registered: dict[str, Any]
) -> None:
    run = _finished(client, client.start_pipeline("fanout", {"n": 2, "fail": True})["id"])
    assert run["state"] == "failed"
    steps = _steps(run)
    assert steps["check"]["state"] == "failed"
    assert "check" in run["reason"]
    log = client.pipeline_step_log(run["id"], "check")
    assert "asked to fail" in log["text"]
    retried = client.retry_pipeline_run(run["id"], "total")
    assert retried["retry_of"] == run["id"]
    done = _finished(client, retried["id"])
    assert done["state"] == "failed"  # the parameter still says fail
    kept = _steps(done)
    assert kept["items"]["state"] == "cached"
    assert kept["items"]["cached_from"] == f"{run['id']}/items"
    # total runs again (from it on), with the arguments it had: its result comes from the cache.
    assert kept["total"]["state"] == "cached"
    with pytest.raises(InvalidParameter, match="no step"):
        client.retry_pipeline_run(run["id"], "nope")


def test_mlflow_sees_a_parent_run_with_a_nested_run_per_step(
    client: ShamalClient,
    registered: dict[str, Any],
    server: LiveServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mlflow = needs.module("mlflow")
    run = _finished(client, client.start_pipeline("fanout", {"n": 2})["id"])
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", server.token)
    mlflow.set_tracking_uri(server.url)
    mlflow.set_registry_uri(server.url)
    tracking = mlflow.MlflowClient(server.url)
    parent = tracking.get_run(run["mlflow_run_id"])
    assert parent.info.status == "FINISHED"
    children = tracking.search_runs(
        [run["experiment_id"]], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    names = sorted(c.info.run_name for c in children)
    assert names == sorted(s["key"] for s in run["steps"] if s["key"] != "square")
    assert all(c.info.status == "FINISHED" for c in children)


@pytest.fixture
def shamal(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("SHAMAL_URL", server.url)
    monkeypatch.setenv("SHAMAL_TOKEN", server.token)
    monkeypatch.setenv("COLUMNS", "200")
    return CliRunner()


def test_the_cli_runs_shows_draws_and_reads_logs(
    shamal: CliRunner, registered: dict[str, Any], tmp_path: Path
) -> None:
    folder = tmp_path / "flow"
    folder.mkdir()
    (folder / "flow.py").write_text(textwrap.dedent(STEPS))
    ran = shamal.invoke(
        app,
        [
            "pipeline",
            "run",
            f"{folder / 'flow.py'}:fanout",
            "--team",
            "ml",
            "--param",
            "n=3",
            "--wait",
            "--json",
        ],
    )
    assert ran.exit_code == 0, ran.output
    summary = json.loads(ran.output)
    assert summary["state"] == "succeeded"
    assert summary["wall_s"] > 0
    assert {s["key"] for s in summary["steps"]} >= {"items", "square[2]", "total", "check"}
    run_id = summary["run_id"]
    plot = tmp_path / "dag.svg"
    shown = shamal.invoke(app, ["pipeline", "show", run_id, "--plot", str(plot)])
    assert shown.exit_code == 0, shown.output
    assert "✓ square ×3" in shown.output
    assert "← items" in shown.output
    assert "cache: caching is off for this step" in shown.output
    assert plot.read_text().startswith("<?xml")
    assert "square" in plot.read_text()
    logs = shamal.invoke(app, ["pipeline", "logs", run_id, "check"])
    assert logs.exit_code == 0, logs.output
    listed = shamal.invoke(app, ["pipeline", "runs", "fanout", "--json"])
    assert run_id in {r["id"] for r in json.loads(listed.output)}
    # A run that fails exits 1 with --wait, and says which step and why.
    failed = shamal.invoke(
        app,
        [
            "pipeline",
            "run",
            f"{folder / 'flow.py'}",
            "--team",
            "ml",
            "-p",
            "fail=true",
            "-p",
            "n=1",
            "--wait",
        ],
    )
    assert failed.exit_code == 1, failed.output
    assert "✗ check failed" in failed.output


def test_hostile_pipelines_are_refused_and_nothing_starts(
    client: ShamalClient, shamal: CliRunner, tmp_path: Path
) -> None:
    before = len(client.pipeline_runs(limit=1000))
    cyclic = tmp_path / "cyclic.yaml"
    cyclic.write_text(
        textwrap.dedent("""
        name: loop
        steps:
          - {name: a, command: [echo, a], args: {x: "${steps.b.output}"}}
          - {name: b, command: [echo, b], args: {y: "${steps.a.output}"}}
    """)
    )
    out = shamal.invoke(app, ["pipeline", "run", str(cyclic), "--team", "ml"])
    assert out.exit_code != 0
    assert "the steps form a cycle: a -> b -> a" in out.output
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("name: lost\nsteps:\n  - {name: a, command: [echo], after: [ghost]}\n")
    out = shamal.invoke(app, ["pipeline", "run", str(unknown), "--team", "ml"])
    assert "refers to the unknown step 'ghost'" in out.output
    # A fan-out past the limit fails its step with what to do; none of its items start.
    wide = tmp_path / "wide"
    wide.mkdir()
    (wide / "flow.py").write_text(WIDE)
    out = shamal.invoke(
        app, ["pipeline", "run", f"{wide / 'flow.py'}", "--team", "ml", "--wait", "--json"]
    )
    summary = json.loads(out.output)
    assert summary["state"] == "failed"
    assert "holds 6000 items; a mapped step fans out to at most 5000" in summary["reason"]
    assert not [s for s in summary["steps"] if s["key"].startswith("each[")]
    # Bodies the API refuses: unknown keys, injected names.
    for body in (
        {"spec": {"name": "x; drop table pipelines", "steps": []}},
        {"spec": {"name": "ok", "steps": [{"name": "a", "function": "../../etc/passwd.py:x"}]}},
        {"spec": {"name": "ok", "steps": [{"name": "a", "command": ["true"]}]}, "extra": 1},
    ):
        answer = client._http.post("/api/v1/pipelines", json=body)
        assert answer.status_code == 400, answer.text
        assert "Traceback" not in answer.text
    assert len(client.pipeline_runs(limit=1000)) == before + 1  # only the wide one started
