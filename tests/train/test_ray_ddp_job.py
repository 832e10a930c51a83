"""A DDP job end to end through a live server whose scheduler runs jobs on Ray.

The server starts with ``SHAMAL_SCHEDULER__EXECUTOR=ray`` (it starts a local Ray instance
of its own); a two-worker job of the PyTorch example is submitted through the API and runs
as a gang of Ray actors that rendezvous with the torchrun-style variables the executor
sets. Its ranks must end with weights bitwise equal to the same two ranks started by hand
(gloo's two-rank all-reduce is deterministic), and only rank 0 writes checkpoints.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shamal.client import ShamalClient
from tests import needs
from tests.jobs.test_scheduling import FAST, log_of, state_is, stop_all_jobs
from tests.live import LiveServer, free_port
from tests.polling import wait_for
from tests.train._run import EXAMPLE, final_sha, run_two_ranks

needs.module("torch")
needs.module("ray")
pytestmark = pytest.mark.slow

ARGS = ["--steps", "30", "--checkpoint-every", "10", "--dropout", "0", "--accumulate", "2"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    env = {**FAST, "SHAMAL_SCHEDULER__EXECUTOR": "ray"}
    with LiveServer(tmp_path_factory.mktemp("home"), env=env) as live:
        yield live


def _rank_lines(log: str, rank: int) -> str:
    prefix = f"[rank {rank}] "
    return "\n".join(line[len(prefix) :] for line in log.splitlines() if line.startswith(prefix))


def test_a_two_worker_job_on_ray_matches_two_ranks_started_by_hand(
    server: LiveServer, tmp_path: Path
) -> None:
    ranks_by_hand = run_two_ranks(
        lambda _: [*ARGS, "--checkpoint-dir", str(tmp_path / "ref")], tmp_path, free_port()
    )
    reference = [r.stdout for r in ranks_by_hand]
    assert [r.returncode for r in ranks_by_hand] == [0, 0], reference
    expected = final_sha(reference[0])
    assert final_sha(reference[1]) == expected

    with ShamalClient(server.url, server.token) as api:
        try:
            digest = api.upload_snapshot(EXAMPLE.parent)
            command = [sys.executable, "train.py", *ARGS]
            submitted = api.submit_job(
                command, snapshot=digest, workers=2, cpus=0.5, memory_mib=1024
            )
            job_id = str(submitted["id"])
            job = wait_for(state_is(api, job_id, "succeeded", "failed"), "the Ray DDP job", 240)
            log = log_of(api, job_id)
        finally:
            stop_all_jobs(api)
    assert job["state"] == "succeeded", log[-4000:]
    ranks = [_rank_lines(log, 0), _rank_lines(log, 1)]
    assert [final_sha(r) for r in ranks] == [expected, expected], log[-4000:]
    assert ranks[0].count("checkpoint ckpt-") > 0
    assert ranks[1].count("checkpoint ckpt-") == 0  # only rank 0 writes checkpoints
