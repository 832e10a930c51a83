"""Pipeline stages as a two-worker gang job through a live server, on both executors.

Local executor: the job has a team, so each stage checkpoints into the artifact store
(``checkpoints/<job>/stage-RR/``); it is preempted after its first checkpoints, requeued,
and attempt 2 resumes both stages at the same step and ends with each stage's weights
bitwise equal to an uninterrupted two-rank run started by hand. Ray executor: the same
job runs as a gang of Ray actors and matches the same reference. In both, rank 0 logs the
loss to tracking (one run across attempts, every step once) and each worker is told the
memory of its device (a CPU worker's: its memory request), which the plan line reports.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shamal.client import ShamalClient
from tests import needs
from tests.jobs.test_scheduling import FAST, log_of, state_is, stop_all_jobs
from tests.live import LiveServer
from tests.polling import wait_for
from tests.train._pipe import PIPELINE, expect_exits, losses, run_ranks
from tests.train._run import final_sha
from tests.train.test_preemption_job import _team, _tracked_run

needs.module("torch")
pytestmark = pytest.mark.slow

ARGS = ["--steps", "40", "--checkpoint-every", "10"]
PLAN = "plan: ddp (model state 0.00 GiB fits one device's 0.75 GiB usable"
"""What 1024 MiB per worker (SHAMAL_DEVICE_MEMORY_MIB) makes of the example's small MLP."""
SOURCES = {"PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
"""The job runs the shamal.train of this checkout (workers start from a clean environment;
where the package is installed from this checkout, this changes nothing)."""


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Each stage's final weights digest from two ranks started by hand."""
    folder = tmp_path_factory.mktemp("reference")
    ranks = run_ranks([*ARGS, "--checkpoint-dir", "ckpt"], folder)
    return [final_sha(out) for out in expect_exits(ranks)]


def _rank_lines(log: str, rank: int) -> str:
    prefix = f"[rank {rank}] "
    return "\n".join(line[len(prefix) :] for line in log.splitlines() if line.startswith(prefix))


def _loss_steps(api: ShamalClient, job_id: str) -> list[int]:
    run_ = _tracked_run(api, "examples-pipeline", job_id)
    assert run_["info"]["status"] == "FINISHED"
    history = api.request(
        "GET",
        "/api/2.0/mlflow/metrics/get-history",
        params={"run_id": run_["info"]["run_id"], "metric_key": "loss"},
    )["metrics"]
    return sorted(int(m["step"]) for m in history)


def _submit(api: ShamalClient, extra: list[str], team: str | None = None) -> str:
    digest = api.upload_snapshot(PIPELINE.parent)
    command = [sys.executable, "pipeline.py", *ARGS, *extra]
    job = api.submit_job(
        command, snapshot=digest, team=team, workers=2, cpus=0.5, memory_mib=1024, env=SOURCES
    )
    return str(job["id"])


@pytest.fixture(scope="module")
def local_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("home"), env=FAST) as live:
        yield live


def test_a_preempted_pipeline_gang_resumes_every_stage_to_the_same_weights(
    local_server: LiveServer, reference: list[str]
) -> None:
    with ShamalClient(local_server.url, local_server.token) as api:
        try:
            team = _team(api)
            job_id = _submit(api, ["--step-delay", "0.1"], team)
            prefix = f"checkpoints/{job_id}/"

            def both_stages_checkpointed() -> bool:
                listed = {str(f["path"]) for f in api.list_artifacts(team, prefix=prefix)}
                return all(
                    f"{prefix}stage-0{r}/ckpt-000000000010/manifest.json" in listed for r in (0, 1)
                )

            ended = state_is(api, job_id, "succeeded", "failed")
            wait_for(lambda: both_stages_checkpointed() or ended(), "both stages' checkpoints", 180)
            assert both_stages_checkpointed(), log_of(api, job_id)[-4000:]
            api.preempt_job(job_id)
            job = wait_for(state_is(api, job_id, "succeeded", "failed"), "the pipeline job", 240)
            first, second = log_of(api, job_id, attempt=1), log_of(api, job_id, attempt=2)
            steps = _loss_steps(api, job_id)
        finally:
            stop_all_jobs(api)
    assert job["state"] == "succeeded", second[-4000:]
    assert (job["attempt"], job["preemptions"], job["retries_used"]) == (2, 1, 0)
    for rank in (0, 1):
        before, after = _rank_lines(first, rank), _rank_lines(second, rank)
        assert f"stage(s) [{rank}] of 2" in before
        assert PLAN in before
        assert "preempted at step" in before
        assert "weights sha256" not in before
        assert "resumed from step" in after
        assert final_sha(after) == reference[rank]
    resumed = [_rank_lines(second, r).split("resumed from step ")[1].split()[0] for r in (0, 1)]
    assert resumed[0] == resumed[1]  # both stages went on from the same step
    assert steps == list(range(1, 41))


@pytest.fixture(scope="module")
def ray_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    needs.module("ray")
    env = {**FAST, "SHAMAL_SCHEDULER__EXECUTOR": "ray"}
    with LiveServer(tmp_path_factory.mktemp("home"), env=env) as live:
        yield live


def test_a_pipeline_gang_runs_on_ray_and_matches_the_ranks_started_by_hand(
    ray_server: LiveServer, reference: list[str]
) -> None:
    with ShamalClient(ray_server.url, ray_server.token) as api:
        try:
            job_id = _submit(api, [])
            job = wait_for(state_is(api, job_id, "succeeded", "failed"), "the Ray pipeline", 300)
            log = log_of(api, job_id)
            steps = _loss_steps(api, job_id)
        finally:
            stop_all_jobs(api)
    assert job["state"] == "succeeded", log[-4000:]
    ranks = [_rank_lines(log, 0), _rank_lines(log, 1)]
    assert "stage(s) [0] of 2" in ranks[0]
    assert "stage(s) [1] of 2" in ranks[1]
    assert all(PLAN in r for r in ranks)
    assert [final_sha(r) for r in ranks] == reference
    assert losses(ranks[0]) == losses(ranks[1])  # the last stage's loss, broadcast
    assert len(losses(ranks[0])) == 40
    assert steps == list(range(1, 41))
