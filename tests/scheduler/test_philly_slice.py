"""A slice of the real Philly trace on its real machine list (skipped without the traces)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shamal.scheduler.core.sim import load_machines, load_trace, simulate
from tests import needs

TRACES = Path(
    os.environ.get("SHAMAL_TRACES", Path(__file__).resolve().parents[3] / "shared" / "traces")
)
PHILLY = TRACES / "philly"


@pytest.fixture(autouse=True)
def _philly() -> None:
    needs.path(PHILLY / "jobs.csv", "the Philly traces")


def test_philly_slice_runs_every_policy_family() -> None:
    jobs = load_trace(PHILLY / "jobs.csv", limit=6000)
    assert len(jobs) == 6000
    figures = {}
    for policy in ("fifo", "las", "srtf-oracle", "predicted-sjf"):
        cluster = load_machines(PHILLY / "machines.csv")
        assert cluster.capacity().gpu_milli == 2490 * 1000
        metrics = simulate(jobs, cluster, policy, record_timeline=False).metrics
        assert metrics["jobs_finished"] == 6000, policy
        assert metrics["jobs_rejected"] == 0, policy
        assert 0 < metrics["gpu_utilization"] < 1
        figures[policy] = metrics
    assert figures["srtf-oracle"]["avg_jct_s"] <= figures["fifo"]["avg_jct_s"]
    assert figures["las"]["avg_queue_s"] <= figures["fifo"]["avg_queue_s"]
    assert figures["predicted-sjf"]["prediction"]["n"] > 5000
