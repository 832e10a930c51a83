"""Reclaiming borrowed team quota: the lender gets its capacity back, and it never loops.

The states are built by hand; :func:`drive` plays the live scheduler over several rounds
(a preempted job keeps its capacity until it exits a round later, a start that no longer
fits is skipped), which is where a reclaim that re-admits its victim on borrowed quota
would show up as the same jobs preempted again and again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from shamal.scheduler.core import (
    GPU_MILLI,
    Cluster,
    Decision,
    JobPhase,
    Node,
    Pool,
    Preempt,
    Request,
    Resources,
    SchedJob,
    SchedulerState,
    Start,
    TeamQuota,
    allocate,
    place,
    policy_names,
    release,
    simulation_policy,
)
from tests.scheduler.helpers import HIGH, NORMAL, make_cluster, make_job, preempts, run_on, starts

ADMITTING = policy_names(simulation=True)
"""Every policy admits jobs, and every one of them reclaims."""

POOL = "cpu"


def cpu_cluster(cpus: int) -> Cluster:
    node = Node(name="c0", pool=POOL, cpu_milli=cpus * 1000, memory_mib=64 * 1024, gpus=[])
    return Cluster.of([Pool(POOL)], [node])


def cpu_quotas(*teams: str, borrow: int = 1) -> dict[tuple[str, str], TeamQuota]:
    """One CPU guaranteed per team, ``borrow`` more borrowable, all in one cohort."""
    return {
        (team, POOL): TeamQuota(
            team=team,
            pool=POOL,
            guaranteed=Resources(cpu_milli=1000),
            borrow_limit=Resources(cpu_milli=borrow * 1000),
            cohort="shared",
        )
        for team in teams
    }


def cpu_job(job_id: str, team: str, *, submitted: float, attained: float = 0.0) -> SchedJob:
    return SchedJob(
        id=job_id,
        team=team,
        request=Request(cpu_milli=1000, memory_mib=1024),
        submitted_at=submitted,
        priority=NORMAL,
        attained_s=attained,
        predicted_s=36_000.0,  # for predicted-sjf and backfill
        oracle_s=36_000.0,  # for the oracles
    )


def start_on(cluster: Cluster, job: SchedJob, *, at: float, borrowed: bool = False) -> SchedJob:
    placement = place(cluster, job.request, pool=POOL)
    assert placement is not None, f"{job.id} does not fit"
    allocate(cluster, placement)
    job.placement, job.phase, job.started_at, job.borrowed = (
        placement,
        JobPhase.RUNNING,
        at,
        borrowed,
    )
    job.attained_as_of = at  # attained_at(now) adds the running time, as the live loop does
    return job


def decide(
    name: str,
    cluster: Cluster,
    queued: Sequence[SchedJob],
    running: Sequence[SchedJob],
    quotas: dict[tuple[str, str], TeamQuota],
    now: float,
    **options: float,
) -> list[Decision]:
    policy = simulation_policy(name, **options)
    return policy.decide(SchedulerState(cluster, list(queued), list(running), quotas), now)


def borrowed_starts(decisions: list[Decision]) -> list[str]:
    return [d.job_id for d in decisions if isinstance(d, Start) and d.borrowed]


# ------------------------------------------------------------------ one round


@pytest.mark.parametrize("name", ADMITTING)
def test_the_lender_gets_its_quota_before_the_borrower_borrows_again(name: str) -> None:
    # The audit's state: red2 was just preempted by a reclaim and is queued again; its
    # CPU is free. Before the fix fifo, las and priority re-admitted red2 on borrowed
    # quota and preempted red1 to make room for blue in the same round.
    cluster = cpu_cluster(2)
    red1 = start_on(cluster, cpu_job("red1", "red", submitted=0), at=0)
    red2 = cpu_job("red2", "red", submitted=1, attained=1000)
    blue = cpu_job("blue", "blue", submitted=100)
    decisions = decide(name, cluster, [red2, blue], [red1], cpu_quotas("red", "blue"), 2000)
    assert decisions == [Start("blue", decisions[0].placement, borrowed=False)]  # type: ignore[union-attr]


@pytest.mark.parametrize("name", ADMITTING)
def test_the_same_on_whole_gpus(name: str) -> None:
    quota = {
        (team, "default"): TeamQuota(
            team=team,
            pool="default",
            guaranteed=Resources(gpu_milli=GPU_MILLI),
            borrow_limit=Resources(gpu_milli=GPU_MILLI),
            cohort="all",
        )
        for team in ("red", "blue")
    }
    cluster = make_cluster(2)
    red1 = run_on(cluster, make_job("red1", 1, team="red", submitted=0), started=0)
    red1.predicted_s, red1.oracle_s, red1.attained_as_of = 36_000, 36_000, 0
    red2 = make_job("red2", 1, team="red", submitted=1, attained=1000, predicted=36_000)
    blue = make_job("blue", 1, team="blue", submitted=100, predicted=36_000, oracle=36_000)
    red2.oracle_s = 36_000
    policy = simulation_policy(name)
    decisions = policy.decide(SchedulerState(cluster, [red2, blue], [red1], quota), 2000)
    assert starts(decisions) == ["blue"]
    assert preempts(decisions) == []


@pytest.mark.parametrize("name", ADMITTING)
def test_reclaim_preempts_the_borrowed_job_and_nothing_borrows_in_that_round(name: str) -> None:
    cluster = cpu_cluster(2)
    red1 = start_on(cluster, cpu_job("red1", "red", submitted=0), at=0)
    red2 = start_on(cluster, cpu_job("red2", "red", submitted=1), at=10, borrowed=True)
    red3 = cpu_job("red3", "red", submitted=2)  # would borrow too
    blue = cpu_job("blue", "blue", submitted=100)
    quotas = cpu_quotas("red", "blue")
    decisions = decide(name, cluster, [red3, blue], [red1, red2], quotas, 2000)
    assert preempts(decisions) == ["red2"]
    assert [d.reason for d in decisions if isinstance(d, Preempt)] == ["reclaim"]
    assert starts(decisions) == ["blue"]
    assert borrowed_starts(decisions) == []


@pytest.mark.parametrize("name", ADMITTING)
def test_several_lenders_each_take_their_quota_back(name: str) -> None:
    cluster = cpu_cluster(3)
    quotas = cpu_quotas("red", "blue", "green", borrow=2)
    red = [
        start_on(cluster, cpu_job("red1", "red", submitted=0), at=0),
        start_on(cluster, cpu_job("red2", "red", submitted=1), at=10, borrowed=True),
        start_on(cluster, cpu_job("red3", "red", submitted=2), at=20, borrowed=True),
    ]
    lenders = [
        cpu_job("blue", "blue", submitted=100),
        cpu_job("green", "green", submitted=101),
    ]
    retry = cpu_job("red4", "red", submitted=3)
    decisions = decide(name, cluster, [retry, *lenders], red, quotas, 2000)
    assert sorted(preempts(decisions)) == ["red2", "red3"]
    assert sorted(starts(decisions)) == ["blue", "green"]
    assert borrowed_starts(decisions) == []


@pytest.mark.parametrize("name", ADMITTING)
def test_a_borrower_keeps_what_its_own_guarantee_covers(name: str) -> None:
    # red runs its guarantee plus one borrowed CPU; two lenders wait, one CPU is idle:
    # one lender takes the idle CPU, the other reclaims the borrowed one, and red's
    # job within its guarantee keeps running.
    cluster = cpu_cluster(3)
    quotas = cpu_quotas("red", "blue", "green", borrow=2)
    red1 = start_on(cluster, cpu_job("red1", "red", submitted=0), at=0)
    red2 = start_on(cluster, cpu_job("red2", "red", submitted=1), at=10, borrowed=True)
    lenders = [cpu_job("blue", "blue", submitted=100), cpu_job("green", "green", submitted=101)]
    decisions = decide(name, cluster, lenders, [red1, red2], quotas, 2000)
    assert preempts(decisions) == ["red2"]
    assert sorted(starts(decisions)) == ["blue", "green"]
    # At its guarantee, red is not preempted at all.
    cluster = cpu_cluster(2)
    red1 = start_on(cluster, cpu_job("red1", "red", submitted=0), at=0)
    blue1 = start_on(cluster, cpu_job("blue1", "blue", submitted=0), at=0)
    blue2 = cpu_job("blue2", "blue", submitted=100)  # would have to borrow: nothing is idle
    quotas = cpu_quotas("red", "blue")
    assert decide(name, cluster, [blue2], [red1, blue1], quotas, 2000) == []


@pytest.mark.parametrize("name", ADMITTING)
def test_reclaim_takes_the_youngest_borrowed_job_and_no_more(name: str) -> None:
    cluster = cpu_cluster(4)
    quotas = {
        ("red", POOL): TeamQuota(
            "red", POOL, Resources(cpu_milli=1000), Resources(cpu_milli=3000), cohort="shared"
        ),
        ("blue", POOL): TeamQuota("blue", POOL, Resources(cpu_milli=3000), cohort="shared"),
    }
    red = [start_on(cluster, cpu_job("red1", "red", submitted=0), at=0)]
    red += [
        start_on(cluster, cpu_job(f"red{i}", "red", submitted=i), at=10 * i, borrowed=True)
        for i in (2, 3, 4)
    ]
    blue = cpu_job("blue", "blue", submitted=100)
    decisions = decide(name, cluster, [blue], red, quotas, 2000)
    assert preempts(decisions) == ["red4"]
    assert starts(decisions) == ["blue"]
    # A job that started on borrowed quota goes before a younger one that did not.
    cluster = cpu_cluster(4)
    old_loan = start_on(cluster, cpu_job("old-loan", "red", submitted=0), at=0, borrowed=True)
    others = [
        start_on(cluster, cpu_job(f"red{i}", "red", submitted=i), at=10 * i) for i in (1, 2, 3)
    ]
    decisions = decide(name, cluster, [blue], [old_loan, *others], quotas, 2000)
    assert preempts(decisions) == ["old-loan"]


# ------------------------------------------------------------------ many rounds


@dataclass
class LiveLoop:
    """Applies decisions the way the live scheduler does, round after round.

    A preempted job is told to stop and keeps its capacity until it exits at the next
    round, then is queued again with what it ran; a second ``Preempt`` of a job that is
    stopping is ignored; a ``Start`` whose placement no longer fits is skipped (the job
    stays queued). With ``tells_stopping`` the state marks the jobs that are stopping.
    """

    cluster: Cluster
    quotas: dict[tuple[str, str], TeamQuota]
    queued: list[SchedJob]
    running: list[SchedJob]
    tells_stopping: bool = True
    preemptions: Counter[str] = field(default_factory=Counter)
    started: list[tuple[int, str]] = field(default_factory=list)
    failed_starts: int = 0
    _stopping: dict[str, SchedJob] = field(default_factory=dict)

    def exit_stopped(self, now: float) -> None:
        for job in self._stopping.values():
            assert job.placement is not None
            assert job.started_at is not None
            release(self.cluster, job.placement)
            self.running.remove(job)
            job.attained_s += now - job.started_at
            job.attained_as_of = None
            job.phase, job.placement, job.started_at = JobPhase.QUEUED, None, None
            job.stopping, job.borrowed, job.last_preempted_at = False, False, now
            self.queued.append(job)
        self._stopping.clear()

    def round(self, policy_name: str, number: int, now: float, **options: float) -> None:
        self.exit_stopped(now)
        state = SchedulerState(self.cluster, list(self.queued), list(self.running), self.quotas)
        decisions = simulation_policy(policy_name, **options).decide(state, now)
        by_id = {job.id: job for job in (*self.queued, *self.running)}
        for decision in decisions:
            if isinstance(decision, Preempt) and decision.job_id not in self._stopping:
                job = by_id[decision.job_id]
                self.preemptions[job.id] += 1
                job.stopping = self.tells_stopping
                self._stopping[job.id] = job
        for decision in decisions:
            if isinstance(decision, Start):
                job = by_id[decision.job_id]
                try:
                    allocate(self.cluster, decision.placement)
                except ValueError:
                    self.failed_starts += 1
                    continue
                self.queued.remove(job)
                self.running.append(job)
                job.phase, job.placement, job.started_at = (
                    JobPhase.RUNNING,
                    decision.placement,
                    now,
                )
                job.borrowed, job.attained_as_of = decision.borrowed, now
                self.started.append((number, job.id))


@pytest.mark.parametrize("tells_stopping", [True, False], ids=["stopping-known", "unknown"])
@pytest.mark.parametrize("min_run_s", [0.0, 300.0])
@pytest.mark.parametrize("name", ADMITTING)
def test_round_after_round_the_lender_starts_and_nobody_is_preempted_twice(
    name: str, min_run_s: float, tells_stopping: bool
) -> None:
    cluster = cpu_cluster(2)
    red1 = start_on(cluster, cpu_job("red1", "red", submitted=0), at=0)
    red2 = start_on(cluster, cpu_job("red2", "red", submitted=1), at=0, borrowed=True)
    blue = cpu_job("blue", "blue", submitted=1000)
    loop = LiveLoop(cluster, cpu_quotas("red", "blue"), [blue], [red1, red2], tells_stopping)
    for number in range(12):
        loop.round(name, number, 1000.0 + number, min_run_s=min_run_s)
    assert "blue" in [job_id for _, job_id in loop.started]
    assert blue in loop.running
    assert max(loop.preemptions.values()) == 1, loop.preemptions
    assert sum(loop.preemptions.values()) == 1
    # The victim waits for blue's quota to come back; red keeps its guarantee.
    assert sorted(job.id for job in loop.running) == ["blue", "red1"]
    assert [job.id for job in loop.queued] == ["red2"]


@pytest.mark.parametrize("name", ADMITTING)
def test_round_after_round_with_several_lenders_and_waiting_borrowers(name: str) -> None:
    cluster = cpu_cluster(3)
    quotas = cpu_quotas("red", "blue", "green", borrow=2)
    running = [start_on(cluster, cpu_job("red1", "red", submitted=0), at=0)]
    running += [
        start_on(cluster, cpu_job(f"red{i}", "red", submitted=i), at=i, borrowed=True)
        for i in (2, 3)
    ]
    queued = [cpu_job("red4", "red", submitted=4)]
    loop = LiveLoop(cluster, quotas, queued, running)
    for number in range(12):
        if number == 2:
            loop.queued.append(cpu_job("blue", "blue", submitted=1000))
        if number == 4:
            loop.queued.append(cpu_job("green", "green", submitted=1001))
        loop.round(name, number, 1000.0 + number, min_run_s=0)
    started = [job_id for _, job_id in loop.started]
    assert "blue" in started
    assert "green" in started
    assert max(loop.preemptions.values()) == 1, loop.preemptions
    assert sorted(job.id for job in loop.running) == ["blue", "green", "red1"]


# ------------------------------------------------------------------ jobs still stopping


@pytest.mark.parametrize("name", ["priority", "las", "fair", "predicted-sjf", "sjf-oracle"])
def test_a_job_waits_for_a_victim_still_stopping_rather_than_preempt_another(name: str) -> None:
    cluster = make_cluster(2)
    going = run_on(cluster, make_job("going", 1, submitted=0, oracle=36_000), started=0)
    going.stopping = True  # preempted last round, still in its grace period
    other = run_on(cluster, make_job("other", 1, submitted=1, oracle=36_000), started=0)
    urgent = make_job("urgent", 1, submitted=100, priority=HIGH, oracle=60, predicted=60)
    policy = simulation_policy(name, min_run_s=0)
    assert policy.decide(SchedulerState(cluster, [urgent], [going, other]), 1000) == []
    # Once it has exited, the urgent job starts in its place.
    release(cluster, going.placement)  # type: ignore[arg-type]
    decisions = policy.decide(SchedulerState(cluster, [urgent], [other]), 1001)
    assert starts(decisions) == ["urgent"]
    assert preempts(decisions) == []


@pytest.mark.parametrize("name", ADMITTING)
def test_a_team_being_reclaimed_from_borrows_nothing_while_its_victim_stops(name: str) -> None:
    cluster = cpu_cluster(3)
    quotas = cpu_quotas("red", "blue", "green", borrow=2)
    red1 = start_on(cluster, cpu_job("red1", "red", submitted=0), at=0)
    red2 = start_on(cluster, cpu_job("red2", "red", submitted=1), at=0, borrowed=True)
    red2.stopping = True
    red3 = cpu_job("red3", "red", submitted=2)  # one CPU is idle and nobody else waits
    assert decide(name, cluster, [red3], [red1, red2], quotas, 2000) == []
    red2.stopping = False  # not being reclaimed: red may borrow the idle CPU
    assert borrowed_starts(decide(name, cluster, [red3], [red1, red2], quotas, 2000)) == ["red3"]
