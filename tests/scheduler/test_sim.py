"""The simulator: hand-computed JCTs on tiny traces, invariants on random ones."""

from __future__ import annotations

import random

import numpy as np
import pytest

from shamal.scheduler.core import GPU_MILLI, Cluster, get_policy, policy_names
from shamal.scheduler.core.sim import (
    Simulator,
    TraceJob,
    assign_teams,
    gang_request,
    load_teams,
    simulate,
)
from tests.scheduler.helpers import make_cluster


def tj(job_id: str, submit: float, duration: float, gpus: float = 1, team: str = "") -> TraceJob:
    return TraceJob(id=job_id, submit_s=submit, duration_s=duration, gpus=gpus, team=team)


def finish_times(sim: Simulator, result_jobs: dict[str, np.ndarray]) -> dict[str, float]:
    return {job.id: float(result_jobs["finish"][i]) for i, job in enumerate(sim.jobs)}


def test_fifo_by_hand() -> None:
    result = simulate([tj("a", 0, 10), tj("b", 1, 5)], make_cluster(1), "fifo")
    m = result.metrics
    assert m["jobs_finished"] == 2
    assert m["avg_jct_s"] == pytest.approx((10 + 14) / 2)
    assert m["p50_jct_s"] == pytest.approx(12)
    assert m["avg_queue_s"] == pytest.approx((0 + 9) / 2)
    assert m["makespan_s"] == pytest.approx(15)
    assert m["gpu_utilization"] == pytest.approx(1.0)
    assert m["preemptions"] == 0


def test_srtf_preemption_pays_the_restore_cost() -> None:
    sim = Simulator(
        [tj("a", 0, 100), tj("b", 10, 10)],
        make_cluster(1),
        policy="srtf-oracle",
        preemption_cost_s=60,
    )
    result = sim.run()
    finish = finish_times(sim, result.jobs)
    # b preempts a at 10 and runs to 20; a resumes with 90 s of work + 60 s restore.
    assert finish == {"a": pytest.approx(170), "b": pytest.approx(20)}
    m = result.metrics
    assert m["preemptions"] == 1
    assert m["preempted_jobs"] == 1
    assert m["avg_jct_s"] == pytest.approx((170 + 10) / 2)
    # a ran 10 + 150 s of its 170 s JCT: 10 s of waiting, while preempted.
    assert m["avg_queue_s"] == pytest.approx((10 + 0) / 2)
    assert m["gpu_utilization"] == pytest.approx(1.0)


def test_las_revisits_when_a_running_job_crosses_its_threshold() -> None:
    policy = get_policy("las", thresholds=[10.0], min_run_s=0)
    sim = Simulator(
        [tj("a", 0, 100), tj("b", 5, 100)],
        make_cluster(1),
        policy=policy,
        preemption_cost_s=0,
        record_decisions=True,
    )
    result = sim.run()
    finish = finish_times(sim, result.jobs)
    # At 5 both are at level 0: b waits. When a passes 10 GPU-s (t=10) it drops a
    # level and b preempts it; b then runs to the end (a is level 1 as well by then).
    assert finish["b"] == pytest.approx(110, abs=0.01)
    assert finish["a"] == pytest.approx(200, abs=0.01)
    assert sim.log is not None
    assert [(kind, job) for _, kind, job in sim.log] == [
        ("start", "a"),
        ("preempt", "a"),
        ("start", "b"),
        ("start", "a"),
    ]


def test_gang_waits_for_all_its_workers() -> None:
    cluster = make_cluster(2, 2)
    sim = Simulator([tj("small", 0, 10, 1), tj("gang", 1, 10, 4)], cluster, policy="fifo")
    result = sim.run()
    finish = finish_times(sim, result.jobs)
    assert finish == {"small": pytest.approx(10), "gang": pytest.approx(20)}
    assert sim.jobs[1].request.workers == 2
    assert sim.jobs[1].request.gpus == 2


def test_gang_request_splits_jobs_larger_than_a_node() -> None:
    assert gang_request(tj("x", 0, 1, 16), [2, 8]).workers == 2
    assert gang_request(tj("x", 0, 1, 12), [2, 8]).gpus == 6
    assert gang_request(tj("x", 0, 1, 8), [2, 8]).workers == 1
    assert gang_request(tj("x", 0, 1, 0.25), [8]).gpu_milli == GPU_MILLI // 4


def test_a_job_that_can_never_fit_is_rejected_not_waited_for() -> None:
    result = simulate([tj("ok", 0, 10), tj("huge", 0, 10, 8)], make_cluster(2, 2), "fifo")
    assert result.metrics["jobs_rejected"] == 1
    assert result.metrics["jobs_finished"] == 1


def random_trace(n: int, seed: int) -> list[TraceJob]:
    rng = random.Random(seed)
    jobs = []
    t = 0.0
    for i in range(n):
        t += rng.expovariate(1 / 30)
        gpus = rng.choice([1, 1, 1, 1, 2, 4, 8, 16])
        duration = rng.choice([0.0, rng.expovariate(1 / 60), rng.expovariate(1 / 2000)])
        jobs.append(tj(f"j{i}", round(t), round(duration), gpus))
    return jobs


@pytest.mark.parametrize("name", policy_names(simulation=True))
def test_invariants_on_a_random_trace(name: str) -> None:
    cluster = make_cluster(8, 8, 4, 2, 2)
    capacity = [
        (n.name, n.free_cpu_milli, [g.free_milli for g in n.gpus]) for n in cluster.nodes.values()
    ]
    trace = random_trace(300, seed=7)
    sim = Simulator(trace, cluster, policy=name, preemption_cost_s=30, record_decisions=True)
    result = sim.run()
    m = result.metrics
    assert m["jobs_finished"] == len(trace)
    assert m["jobs_rejected"] == 0
    # Everything was given back.
    assert [
        (n.name, n.free_cpu_milli, [g.free_milli for g in n.gpus]) for n in cluster.nodes.values()
    ] == capacity
    # Never more GPUs busy than the cluster has.
    assert result.busy_gpus.max() <= result.total_gpus + 1e-9
    jobs = result.jobs
    submit, start, finish, run = jobs["submit"], jobs["first_start"], jobs["finish"], jobs["run_s"]
    durations = np.array([j.duration_s for j in sorted(trace, key=lambda j: j.submit_s)])
    assert (start >= submit - 1e-9).all()
    assert np.allclose(run, durations + 30 * jobs["preemptions"])
    assert (finish - submit >= run - 1e-6).all()
    assert m["avg_queue_s"] == pytest.approx(float((finish - submit - run).mean()))
    assert 0 < m["gpu_utilization"] <= 1
    gpus = np.array([j.gpus for j in sim.jobs])
    assert m["gpu_utilization"] == pytest.approx(
        float((gpus * run).sum()) / (result.total_gpus * m["makespan_s"])
    )
    # Preemption never loops: no job is preempted before it ran min_run_s.
    assert sim.log is not None
    last_start: dict[str, float] = {}
    for at, kind, job_id in sim.log:
        if kind == "start":
            last_start[job_id] = at
        else:
            assert at - last_start[job_id] >= sim.policy.min_run_s - 1e-6
    if name in ("fifo", "sjf-oracle", "predicted-sjf", "backfill", "fair", "priority"):
        assert m["preemptions"] == 0


def test_preemptive_policies_beat_fifo_on_a_heavy_tailed_trace() -> None:
    trace = random_trace(400, seed=3)
    figures = {
        name: simulate(trace, make_cluster(8, 8, 4, 2, 2), name, record_timeline=False).metrics
        for name in ("fifo", "las", "srtf-oracle")
    }
    assert figures["las"]["avg_jct_s"] < figures["fifo"]["avg_jct_s"]
    assert figures["srtf-oracle"]["avg_jct_s"] < figures["fifo"]["avg_jct_s"]


def test_predicted_policies_report_the_online_prediction_error() -> None:
    trace = [
        TraceJob(
            id=f"j{i}",
            submit_s=i * 10.0,
            duration_s=100.0 if i % 2 else 1000.0,
            gpus=1,
            job_type="short" if i % 2 else "long",
        )
        for i in range(60)
    ]
    result = simulate(trace, make_cluster(2), "predicted-sjf")
    prediction = result.metrics["prediction"]
    assert prediction["n"] + prediction["unpredicted"] == 60
    assert prediction["within_2x"] > 0.5


def test_progress_is_reported_to_the_end() -> None:
    seen: list[tuple[int, int]] = []
    simulate(
        random_trace(50, 1),
        make_cluster(8, 8),
        "fifo",
        progress=lambda done, total: seen.append((done, total)),
    )
    assert seen[-1] == (50, 50)


def test_team_quotas_borrowing_and_reclaim_by_hand(tmp_path: object) -> None:
    from pathlib import Path

    teams = Path(str(tmp_path)) / "teams.csv"
    teams.write_text("vc,node num\na,1\nb,1\n")
    trace = [tj(f"a{i}", 0, 1000, team="a") for i in range(4)]
    trace += [tj(f"b{i}", 400, 10, team="b") for i in range(2)]

    def run(borrow: bool) -> tuple[Simulator, dict[str, float]]:
        quotas = load_teams(teams, gpus_per_node=2, borrow=borrow)
        sim = Simulator(trace, make_cluster(4), policy="fifo", quotas=quotas, preemption_cost_s=60)
        result = sim.run()
        return sim, finish_times(sim, result.jobs) | {
            f"queue-{team}": figures["avg_queue_s"]
            for team, figures in result.metrics["teams"].items()
        }

    _, isolated = run(borrow=False)
    assert [isolated[f"a{i}"] for i in range(4)] == pytest.approx([1000, 1000, 2000, 2000])
    assert isolated["b0"] == pytest.approx(410)
    sim, borrowing = run(borrow=True)
    # a borrows b's idle GPUs at 0; b reclaims them at 400 (past the 300 s start
    # protection): two of a's jobs are preempted and resume at 410 with 600 s of work
    # + 60 s of restore.
    assert sorted(borrowing[f"a{i}"] for i in range(4)) == pytest.approx([1000, 1000, 1070, 1070])
    assert borrowing["b0"] == pytest.approx(410)
    assert borrowing["b1"] == pytest.approx(410)
    assert sim.preemptions == 2
    assert borrowing["queue-a"] < isolated["queue-a"]
    assert borrowing["queue-b"] <= isolated["queue-b"]


def test_assign_teams_is_seeded_proportional_and_respects_size(tmp_path: object) -> None:
    from pathlib import Path

    teams = Path(str(tmp_path)) / "teams.csv"
    teams.write_text("vc,node num\nbig,3\nsmall,1\n")
    quotas = load_teams(teams)
    jobs = [tj(f"j{i}", i, 1, 1) for i in range(4000)] + [tj("wide", 0, 1, 16)]
    first = assign_teams(jobs, quotas, seed=5)
    assert first == assign_teams(jobs, quotas, seed=5)
    share = sum(j.team == "big" for j in first[:-1]) / 4000
    assert 0.7 < share < 0.8
    assert first[-1].team == "big"  # 16 GPUs only fit the big team's 24


def test_simulator_runs_once() -> None:
    sim = Simulator([tj("a", 0, 1)], make_cluster(1))
    sim.run()
    with pytest.raises(RuntimeError, match="once"):
        sim.run()


def test_cluster_type() -> None:
    assert isinstance(make_cluster(1), Cluster)
