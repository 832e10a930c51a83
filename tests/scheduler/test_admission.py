"""Team quotas per pool: guarantees, borrowing idle quota, reclaim; decayed usage."""

from __future__ import annotations

import math

import pytest

from shamal.scheduler.core import (
    GPU_MILLI,
    Admission,
    QuotaBook,
    Resources,
    Start,
    TeamQuota,
    decay_all,
    decayed_usage,
    get_policy,
)
from tests.scheduler.helpers import make_cluster, make_job, preempts, run_on, starts, state


def quota(team: str, gpus: int, borrow: int, cohort: str = "all") -> TeamQuota:
    return TeamQuota(
        team=team,
        pool="default",
        guaranteed=Resources(gpu_milli=gpus * GPU_MILLI),
        borrow_limit=Resources(gpu_milli=borrow * GPU_MILLI),
        cohort=cohort,
    )


def quotas(borrow: int) -> dict[tuple[str, str], TeamQuota]:
    return {("a", "default"): quota("a", 2, borrow), ("b", "default"): quota("b", 2, borrow)}


def test_quota_book_admits_within_borrows_waits_and_never() -> None:
    book = QuotaBook(quotas(borrow=1), {})
    one = make_job("x", 1, team="a")
    assert book.admit(one, "default") is Admission.WITHIN
    book.charge(one, "default")
    book.charge(one, "default")
    assert book.admit(one, "default") is Admission.BORROW
    book.charge(one, "default")
    assert book.admit(one, "default") is Admission.WAIT  # borrow limit reached
    assert book.over_guarantee("a", "default")
    assert not book.over_guarantee("b", "default")
    assert book.admit(make_job("huge", 4, team="a"), "default") is Admission.NEVER
    # A pool without quotas is not managed.
    assert book.admit(one, "other") is Admission.WITHIN
    # Team b holds its whole guarantee: the cohort has nothing idle to lend to a.
    book = QuotaBook(
        quotas(borrow=2),
        {("a", "default"): Resources(gpu_milli=2000), ("b", "default"): Resources(gpu_milli=2000)},
    )
    assert book.admit(one, "default") is Admission.WAIT


def test_cpu_and_memory_are_unlimited_when_the_quota_sets_only_gpus() -> None:
    book = QuotaBook(quotas(borrow=0), {})
    job = make_job("x", 1, team="a")
    assert job.request.cpu_milli > 0
    assert book.admit(job, "default") is Admission.WITHIN


def test_borrowing_lets_a_team_use_idle_quota() -> None:
    jobs = [make_job(f"a{i}", 1, team="a", submitted=i) for i in range(4)]
    isolated = get_policy("fifo").decide(state(make_cluster(4), jobs, quotas=quotas(0)), 10)
    assert starts(isolated) == ["a0", "a1"]
    borrowing = get_policy("fifo").decide(state(make_cluster(4), jobs, quotas=quotas(2)), 10)
    assert starts(borrowing) == ["a0", "a1", "a2", "a3"]
    flags = [d.borrowed for d in borrowing if isinstance(d, Start)]
    assert flags == [False, False, True, True]


def test_the_owner_reclaims_borrowed_capacity_by_preemption() -> None:
    cluster = make_cluster(4)
    running = [run_on(cluster, make_job(f"a{i}", 1, team="a"), started=0) for i in range(4)]
    for job in running[2:]:
        job.borrowed = True
    owner = make_job("b0", 1, team="b", submitted=100)
    for name in ("fifo", "priority", "las", "fair"):
        decisions = get_policy(name).decide(
            state(cluster, [owner], running, quotas=quotas(2)), 1000
        )
        assert starts(decisions) == ["b0"], name
        assert len(preempts(decisions)) == 1, name
        assert decisions[0].reason == "reclaim"  # type: ignore[union-attr]


def test_no_reclaim_from_a_team_within_its_guarantee() -> None:
    cluster = make_cluster(4)
    running = [run_on(cluster, make_job(f"a{i}", 1, team="a"), started=0) for i in range(2)]
    running += [run_on(cluster, make_job(f"b{i}", 1, team="b"), started=0) for i in range(2)]
    # Team b is at its guarantee; its third job would have to borrow, and nothing is idle.
    waiting = make_job("b2", 1, team="b", submitted=100)
    s = state(cluster, [waiting], running, quotas=quotas(2))
    for name in ("fifo", "las", "fair"):
        assert get_policy(name).decide(s, 1000) == [], name


def test_reclaim_needs_the_preemptor_to_be_within_its_guarantee() -> None:
    cluster = make_cluster(4)
    running = [run_on(cluster, make_job(f"a{i}", 1, team="a"), started=0) for i in range(3)]
    running += [run_on(cluster, make_job("b0", 1, team="b"), started=0)]
    # a borrows one GPU from b; b's second job is within b's guarantee: it reclaims it.
    s = state(cluster, [make_job("b1", 1, team="b", submitted=5)], running, quotas=quotas(2))
    decisions = get_policy("fifo").decide(s, 1000)
    assert starts(decisions) == ["b1"]
    assert preempts(decisions)[0].startswith("a")


def test_over_quota_team_preempts_its_own_lower_level_jobs_under_las() -> None:
    cluster = make_cluster(4)
    las = get_policy("las", thresholds=[100.0], min_run_s=0)
    running = [
        run_on(cluster, make_job(f"a{i}", 1, team="a", attained=1000), started=0) for i in range(2)
    ]
    new = make_job("a-new", 1, team="a", submitted=1000)
    decisions = las.decide(state(cluster, [new], running, quotas=quotas(0)), 1000)
    assert starts(decisions) == ["a-new"]
    assert len(preempts(decisions)) == 1
    # ... but never a job another team runs within its guarantee.
    cluster = make_cluster(2)
    others = [
        run_on(cluster, make_job(f"b{i}", 1, team="b", attained=1000), started=0) for i in range(2)
    ]
    assert las.decide(state(cluster, [new], others, quotas=quotas(0)), 1000) == []


def test_decayed_usage_halves_every_half_life_and_is_update_invariant() -> None:
    assert decayed_usage(100.0, 3600, 0.0, 3600) == pytest.approx(50.0)
    # At a constant rate usage converges to rate * half_life / ln 2.
    assert decayed_usage(0.0, 1e9, 2.0, 3600) == pytest.approx(2.0 * 3600 / math.log(2))
    # Two steps equal one step of the same total length.
    one = decayed_usage(10.0, 5000, 3.0, 3600)
    two = decayed_usage(decayed_usage(10.0, 2000, 3.0, 3600), 3000, 3.0, 3600)
    assert one == pytest.approx(two)
    assert decayed_usage(10.0, 100, 1.0, math.inf) == pytest.approx(110.0)
    with pytest.raises(ValueError, match="half-life"):
        decayed_usage(1.0, 1.0, 1.0, 0)
    assert decay_all({"a": 8.0}, 3600, {"b": 0.0}, 3600) == {"a": 4.0, "b": 0.0}
