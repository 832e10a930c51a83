"""End to end through a live server: the example job is preempted, requeued and resumed.

The job runs with a team, so its checkpoints go to the platform's artifact store
(ArtifactCheckpointStore); its metrics go to tracking. After ``preempt`` (SIGTERM, then
exit 75) the scheduler requeues it; attempt 2 resumes from the stored checkpoint and
must end with the same ``weights sha256`` as an uninterrupted run.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shamal.client import ShamalClient
from tests import needs
from tests.jobs.test_scheduling import FAST, log_of, state_is, stop_all_jobs
from tests.live import LiveServer
from tests.polling import wait_for
from tests.train._run import EXAMPLE, final_sha, run

needs.module("torch")
pytestmark = pytest.mark.slow

ARGS = ["--steps", "120", "--checkpoint-every", "20"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("home"), env=FAST) as live:
        yield live


@pytest.fixture
def api(server: LiveServer) -> Iterator[ShamalClient]:
    with ShamalClient(server.url, server.token) as client:
        try:
            yield client
        finally:
            stop_all_jobs(client)


def _team(api: ShamalClient) -> str:
    if not any(t["name"] == "ml" for t in api.list_teams()):
        api.create_team("ml")
    return "ml"


def test_artifact_store_contract(api: ShamalClient, server: LiveServer) -> None:
    from shamal.train import ArtifactCheckpointStore

    store = ArtifactCheckpointStore("contract", team=_team(api), url=server.url, token=server.token)
    try:
        store.put("ckpt-1/a.bin", b"one")
        store.put("ckpt-1/a.bin", b"two")  # replaced
        store.put("ckpt-2/b.bin", b"three")
        assert sorted(store.keys("ckpt-")) == ["ckpt-1/a.bin", "ckpt-2/b.bin"]
        assert store.get("ckpt-1/a.bin") == b"two"
        store.delete("ckpt-1/a.bin")
        store.delete("ckpt-1/a.bin")  # absent: no-op
        assert store.keys() == ["ckpt-2/b.bin"]
        with pytest.raises(KeyError):
            store.get("ckpt-1/a.bin")
    finally:
        store.close()


def test_preempted_example_job_resumes_to_the_same_weights(
    api: ShamalClient, tmp_path: Path
) -> None:
    code, reference = run([*ARGS, "--checkpoint-dir", str(tmp_path / "ref")], tmp_path)
    assert code == 0, reference

    team = _team(api)
    digest = api.upload_snapshot(EXAMPLE.parent)
    command = [sys.executable, "train.py", *ARGS, "--step-delay", "0.05"]
    job_id = str(
        api.submit_job(command, snapshot=digest, team=team, cpus=1.0, memory_mib=1024)["id"]
    )
    prefix = f"checkpoints/{job_id}/"

    def has_checkpoint() -> bool:
        listed = api.list_artifacts(team, prefix=prefix)
        return any(str(f["path"]).endswith("manifest.json") for f in listed)

    wait_for(has_checkpoint, "a first checkpoint in the artifact store", deadline_s=120)
    api.preempt_job(job_id)
    job = wait_for(state_is(api, job_id, "succeeded", "failed"), "the job to finish", 180)
    first, second = log_of(api, job_id, attempt=1), log_of(api, job_id, attempt=2)
    assert job["state"] == "succeeded", second
    assert (job["attempt"], job["preemptions"], job["retries_used"]) == (2, 1, 0)
    assert "preempted at step" in first
    assert "weights sha256" not in first
    assert "resumed from step" in second
    assert final_sha(second) == final_sha(reference)
    run_ = _tracked_run(api, "examples-pytorch", job_id)  # one run across both attempts
    assert run_["info"]["status"] == "FINISHED"
    history = api.request(
        "GET",
        "/api/2.0/mlflow/metrics/get-history",
        params={"run_id": run_["info"]["run_id"], "metric_key": "loss"},
    )["metrics"]
    assert sorted({int(m["step"]) for m in history}) == list(range(1, 121))


def _tracked_run(api: ShamalClient, experiment: str, job_id: str) -> dict[str, Any]:
    found = api.request(
        "GET",
        "/api/2.0/mlflow/experiments/get-by-name",
        params={"experiment_name": experiment},
    )["experiment"]
    runs = api.request(
        "POST", "/api/2.0/mlflow/runs/search", json={"experiment_ids": [found["experiment_id"]]}
    )["runs"]
    (run_,) = [r for r in runs if r["info"]["run_name"] == f"job-{job_id}"]
    result: dict[str, Any] = run_
    return result


def test_sklearn_example_job_is_tracked(api: ShamalClient) -> None:
    folder = EXAMPLE.parents[1] / "sklearn"
    digest = api.upload_snapshot(folder)
    command = [sys.executable, "train.py", "--n-estimators", "30"]
    job_id = str(api.submit_job(command, snapshot=digest, cpus=1.0, memory_mib=1024)["id"])
    job = wait_for(state_is(api, job_id, "succeeded", "failed"), "the sklearn job", 120)
    log = log_of(api, job_id)
    assert job["state"] == "succeeded", log
    printed = float(log.split("test_accuracy ")[1].split()[0])
    run_ = _tracked_run(api, "examples-sklearn", job_id)
    metrics = {m["key"]: m["value"] for m in run_["data"]["metrics"]}
    params = {p["key"]: p["value"] for p in run_["data"]["params"]}
    assert run_["info"]["status"] == "FINISHED"
    assert metrics["test_accuracy"] == pytest.approx(printed, abs=1e-4)
    assert 0.9 < metrics["cv_accuracy"] <= 1.0
    assert params["n_estimators"] == "30"
