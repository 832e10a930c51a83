"""A pipeline whose steps run on two executors: a live server runs Ray beside its local
executor (a Ray head of its own), one step names Ray, and both succeed in one run."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import shamal as shamal_package
from shamal.client import ShamalClient
from shamal.pipelines import load_pipeline
from tests import needs
from tests.jobs.test_scheduling import FAST
from tests.live import LiveServer
from tests.polling import wait_for

needs.module("ray")
pytestmark = pytest.mark.slow

STEPS = """
import os
from shamal.pipelines import pipeline, step

# The steps import the Shamal under test (a job's interpreter may have another installed).
ENV = {"PYTHONPATH": %r}

def _where() -> str:
    # The local executor runs a step in its job folder (.../JOB/attempt-N); a Ray actor
    # unpacks the snapshot into a folder of its own on the node (.../shamal-rank-*/workdir).
    return os.getcwd()


@step(cpus=0.1, memory_mib=256, env=ENV)
def prepare(n: int) -> dict:
    return {"rows": list(range(n)), "where": _where()}


@step(cpus=0.1, memory_mib=256, env=ENV, executor="ray")
def train(data: dict) -> dict:
    return {"total": sum(data["rows"]), "where": _where()}


@pipeline
def mixed(n: int = 4) -> None:
    train(prepare(n))
"""


SOURCE = str(Path(shamal_package.__file__).resolve().parents[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    env = {**FAST, "SHAMAL_SCHEDULER__EXECUTORS": '["ray"]'}
    with LiveServer(tmp_path_factory.mktemp("mixed-home"), env) as live:
        yield live


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Iterator[ShamalClient]:
    with ShamalClient(server.url, server.token) as api:
        api.request("POST", "/api/v1/teams", json={"name": "ml"})
        yield api


def _finished(client: ShamalClient, run_id: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def ended() -> bool:
        found[:] = [client.pipeline_run(run_id)]
        return bool(found[0]["state"] != "running")

    wait_for(ended, f"pipeline run {run_id} to end", 120)
    return found[0]


def test_a_step_naming_ray_runs_there_and_the_other_locally(
    client: ShamalClient, tmp_path: Path
) -> None:
    (tmp_path / "flow.py").write_text(textwrap.dedent(STEPS) % SOURCE)
    spec, root = load_pipeline(f"{tmp_path / 'flow.py'}:mixed")
    assert spec.step("train").executor == "ray"
    snapshot = client.upload_snapshot(root, "ml")
    client.register_pipeline(spec.to_json() | {"team": "ml"}, snapshot)
    run = _finished(client, client.start_pipeline("mixed", {"n": 4})["id"])
    steps = {s["key"]: s for s in run["steps"]}
    assert run["state"] == "succeeded", (
        run["reason"],
        [(s["key"], s["state"], s["reason"]) for s in run["steps"]],
        [client.pipeline_step_log(run["id"], k) for k in steps if steps[k]["job_id"]],
    )
    assert steps["train"]["output"]["total"] == 6
    jobs = {key: client.get_job(steps[key]["job_id"]) for key in ("prepare", "train")}
    assert jobs["train"]["executor"] == "ray"
    assert jobs["prepare"]["executor"] is None  # the server's default: local
    ray_folder = Path(steps["train"]["output"]["where"])
    local_folder = Path(steps["prepare"]["output"]["where"])
    assert ray_folder.parent.name.startswith("shamal-rank-"), ray_folder
    assert local_folder.name == f"attempt-{jobs['prepare']['attempt']}", local_folder
    assert local_folder.parent.name == jobs["prepare"]["id"]
