"""Policies on small hand-built states: ordering, preemption, gangs, purity, registry."""

from __future__ import annotations

import pytest

from shamal.scheduler.core import (
    DEFAULT_POLICY,
    SIMULATION_ONLY,
    PriorityClass,
    Start,
    get_policy,
    policy_names,
    policy_options,
    simulation_policy,
)
from tests.scheduler.helpers import (
    HIGH,
    make_cluster,
    make_job,
    preempts,
    run_on,
    snapshot,
    starts,
    state,
)


def test_registry_names_every_policy_and_resolves_lazily() -> None:
    names = policy_names(simulation=True)
    assert names == [
        "fifo",
        "priority",
        "fair",
        "sjf-oracle",
        "srtf-oracle",
        "predicted-sjf",
        "las",
        "backfill",
    ]
    assert DEFAULT_POLICY in names
    for name in names:
        assert simulation_policy(name).name == name
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        get_policy("nope")
    with pytest.raises(ValueError, match="fifo"):
        get_policy("fifo", bogus=1)


def test_the_live_scheduler_is_refused_the_simulation_only_policies() -> None:
    live = policy_names()
    assert DEFAULT_POLICY in live
    assert set(policy_names(simulation=True)) - set(live) == set(SIMULATION_ONLY)
    for name in SIMULATION_ONLY:
        with pytest.raises(ValueError, match="for `shamal sim` only") as refused:
            get_policy(name)
        # The hint lists what the server does take, and only that.
        assert "fifo" in str(refused.value)
        assert all(
            other not in str(refused.value).split("takes one of:")[1] for other in SIMULATION_ONLY
        )
    with pytest.raises(ValueError, match="unknown policy") as unknown:
        get_policy("nope")
    assert "las" in str(unknown.value)
    assert not any(name in str(unknown.value) for name in SIMULATION_ONLY)
    # The simulator's own hint lists them.
    with pytest.raises(ValueError, match="srtf-oracle"):
        simulation_policy("nope")


@pytest.mark.parametrize("name", policy_names(simulation=True))
def test_every_policy_takes_the_start_protection(name: str) -> None:
    assert "min_run_s" in policy_options(name)
    assert simulation_policy(name, min_run_s=5).min_run_s == 5
    with pytest.raises(ValueError, match="min_run_s must be a number of seconds >= 0"):
        simulation_policy(name, min_run_s=-1)
    with pytest.raises(ValueError, match="min_run_s must be"):
        simulation_policy(name, min_run_s=(1.0, 2.0))
    with pytest.raises(ValueError, match=r"takes no option 'bogus'; its options: .*min_run_s"):
        simulation_policy(name, bogus=1)


def test_each_policy_says_which_options_it_takes() -> None:
    assert policy_options("fifo") == ["strict", "min_run_s"]
    assert policy_options("fair") == ["charge_s", "min_run_s"]
    assert policy_options("las") == ["thresholds", "min_run_s"]
    assert policy_options("backfill") == ["max_candidates", "min_run_s"]
    assert policy_options("priority") == ["min_run_s"]


def test_fifo_blocks_at_the_head_and_priority_fills_around_it() -> None:
    cluster = make_cluster(4)
    running = run_on(cluster, make_job("r", 1), started=0)
    big = make_job("big", 4, submitted=1)
    small = make_job("small", 1, submitted=2)
    s = state(cluster, [small, big], [running])
    assert get_policy("fifo").decide(s, 10) == []
    assert starts(get_policy("priority").decide(s, 10)) == ["small"]
    assert starts(get_policy("fifo", strict=False).decide(s, 10)) == ["small"]


def test_fifo_starts_in_submission_order_until_full() -> None:
    cluster = make_cluster(2)
    jobs = [make_job(f"j{i}", 1, submitted=float(10 - i)) for i in range(4)]
    decisions = get_policy("fifo").decide(state(cluster, jobs), 20)
    assert starts(decisions) == ["j3", "j2"]
    assert all(isinstance(d, Start) and len(d.placement.slots) == 1 for d in decisions)


def test_decide_leaves_the_cluster_and_jobs_unchanged() -> None:
    cluster = make_cluster(2, 2)
    running = [
        run_on(cluster, make_job("r1", 1, attained=9000), started=0),
        run_on(cluster, make_job("r2", 2, attained=9000), started=0),
    ]
    queued = [make_job(f"q{i}", 1, submitted=5) for i in range(3)]
    before = snapshot(cluster)
    jobs_before = [(j.phase, j.placement, j.attained_s) for j in running + queued]
    for name in policy_names(simulation=True):
        for job in running + queued:
            job.oracle_s = 100.0
            job.predicted_s = 100.0
        simulation_policy(name).decide(state(cluster, queued, running), 10_000)
        assert snapshot(cluster) == before, name
        assert [(j.phase, j.placement, j.attained_s) for j in running + queued] == jobs_before


def test_sjf_oracle_orders_by_true_runtime_and_refuses_without_it() -> None:
    cluster = make_cluster(1)
    jobs = [make_job("long", oracle=1000, submitted=0), make_job("short", oracle=10, submitted=5)]
    assert starts(simulation_policy("sjf-oracle").decide(state(cluster, jobs), 10)) == ["short"]
    blind = [make_job("x", submitted=0)]
    for name in ("sjf-oracle", "srtf-oracle"):
        with pytest.raises(ValueError, match="simulator only"):
            simulation_policy(name).decide(state(cluster, blind), 1)


def test_predicted_sjf_orders_by_prediction_and_puts_unknown_last() -> None:
    cluster = make_cluster(2)
    jobs = [
        make_job("unknown", submitted=0),
        make_job("long", predicted=500, submitted=1),
        make_job("short", predicted=5, submitted=2),
    ]
    assert starts(get_policy("predicted-sjf").decide(state(cluster, jobs), 10)) == [
        "short",
        "long",
    ]


def test_srtf_preempts_only_a_job_with_more_remaining_time() -> None:
    cluster = make_cluster(1)
    long = run_on(cluster, make_job("long", oracle=1000, attained=100), started=0)
    short = make_job("short", oracle=50, submitted=100)
    decisions = simulation_policy("srtf-oracle").decide(state(cluster, [short], [long]), 100)
    assert preempts(decisions) == ["long"]
    assert starts(decisions) == ["short"]
    assert decisions.index(decisions[0]) == 0
    assert decisions[0].job_id == "long"
    # The other way round: nothing to do.
    cluster = make_cluster(1)
    nearly_done = run_on(cluster, make_job("done-soon", oracle=1000, attained=990), started=0)
    s = state(cluster, [make_job("new", oracle=50, submitted=100)], [nearly_done])
    assert simulation_policy("srtf-oracle").decide(s, 990) == []


def test_las_preempts_a_job_of_a_higher_level_after_its_protection() -> None:
    cluster = make_cluster(1)
    las = get_policy("las", thresholds=[100.0], min_run_s=60)
    old = run_on(cluster, make_job("old", attained=500), started=0)
    new = make_job("new", submitted=500)
    decisions = las.decide(state(cluster, [new], [old]), 500)
    assert preempts(decisions) == ["old"]
    assert starts(decisions) == ["new"]
    # Protected: it (re)started less than min_run_s ago.
    old.started_at = 480
    assert las.decide(state(cluster, [new], [old]), 500) == []
    # Same level: no preemption.
    old.started_at = 0
    old.attained_s = 50
    assert las.decide(state(cluster, [new], [old]), 500) == []


def test_las_levels_use_gpu_service() -> None:
    las = get_policy("las", thresholds=[100.0])
    one = make_job("one", 1, attained=60)
    four = make_job("four", 4, attained=60)
    assert las.level(one, 0) == 0
    assert las.level(four, 0) == 1  # 240 GPU-seconds


def test_las_revisits_a_running_job_when_it_crosses_a_threshold() -> None:
    las = get_policy("las", thresholds=[100.0, 1000.0], min_run_s=10)
    job = make_job("j", 2, attained=0)
    job.started_at = 0
    job.phase = job.phase.RUNNING
    job.attained_as_of = 0
    assert las.revisit_at(job, 0) == pytest.approx(10)  # protection ends first
    assert las.revisit_at(job, 20) == pytest.approx(50, abs=0.01)  # 100 GPU-s at 2 GPUs
    assert las.revisit_at(job, 60) == pytest.approx(500, abs=0.01)
    assert las.revisit_at(job, 600) is None


def test_preemption_happens_only_when_the_preemptor_can_then_start() -> None:
    cluster = make_cluster(4)
    las = get_policy("las", thresholds=[100.0], min_run_s=0)
    protected = [run_on(cluster, make_job(f"young{i}", attained=10), started=0) for i in range(2)]
    victims = [run_on(cluster, make_job(f"old{i}", attained=500), started=0) for i in range(2)]
    big = make_job("big", 4, submitted=100)
    # The two old jobs free 2 GPUs; the young ones are at the same level as `big`:
    # `big` could not start, so nobody is preempted.
    assert las.decide(state(cluster, [big], protected + victims), 100) == []


def test_victims_the_placement_does_not_need_keep_running() -> None:
    cluster = make_cluster(2, 2)
    las = get_policy("las", thresholds=[100.0], min_run_s=0)
    # n0 holds two old 1-GPU jobs, n1 two old 1-GPU jobs; a 2-GPU job needs one node.
    old = [run_on(cluster, make_job(f"old{i}", attained=1000 + i), started=0) for i in range(4)]
    decisions = las.decide(state(cluster, [make_job("pair", 2, submitted=5)], old), 10)
    assert starts(decisions) == ["pair"]
    victims = preempts(decisions)
    assert len(victims) == 2
    start = next(d for d in decisions if isinstance(d, Start))
    victim_nodes = {
        j.placement.slots[0].node for j in old if j.id in victims and j.placement is not None
    }
    assert victim_nodes == {start.placement.slots[0].node}


def test_a_started_job_is_not_preempted_again_in_the_next_round() -> None:
    """Apply a round's decisions and decide again: no loop."""
    cluster = make_cluster(1)
    las = get_policy("las", thresholds=[100.0], min_run_s=300)
    old = run_on(cluster, make_job("old", attained=500), started=0)
    new = make_job("new", submitted=500)
    decisions = las.decide(state(cluster, [new], [old]), 500)
    assert preempts(decisions) == ["old"]
    # Apply: old back to the queue, new running.
    from shamal.scheduler.core import JobPhase, allocate, release

    assert old.placement is not None
    release(cluster, old.placement)
    old.phase, old.placement, old.started_at = JobPhase.QUEUED, None, None
    start = next(d for d in decisions if isinstance(d, Start))
    allocate(cluster, start.placement)
    new.phase, new.placement, new.started_at = JobPhase.RUNNING, start.placement, 500
    # Later, `new` has crossed the threshold too but is protected; then, once
    # unprotected, `old` (level 1 as well) still may not preempt it back.
    new.attained_s = 200
    assert las.decide(state(cluster, [old], [new]), 700) == []
    assert las.decide(state(cluster, [old], [new]), 900) == []


def test_gang_is_all_or_nothing_and_consolidated() -> None:
    cluster = make_cluster(4, 4)
    blocker = run_on(cluster, make_job("blocker", 2), started=0)
    gang = make_job("gang", 4, workers=2, submitted=1)
    assert get_policy("priority").decide(state(cluster, [gang], [blocker]), 5) == []
    cluster = make_cluster(4, 4, 4)
    decisions = get_policy("priority").decide(state(cluster, [gang]), 5)
    assert starts(decisions) == ["gang"]
    start = decisions[0]
    assert isinstance(start, Start)
    assert len(start.placement.slots) == 2
    assert len(set(start.placement.nodes)) == 2


def test_priority_classes_preempt_lower_classes_only_when_allowed() -> None:
    cluster = make_cluster(1)
    low = run_on(cluster, make_job("low"), started=0)
    urgent = make_job("urgent", priority=HIGH, submitted=1000)
    decisions = get_policy("priority").decide(state(cluster, [urgent], [low]), 1000)
    assert preempts(decisions) == ["low"]
    assert starts(decisions) == ["urgent"]
    # A class that does not preempt, and a victim class that is not preemptible.
    polite = make_job("polite", priority=PriorityClass("polite", 10, preempts=False))
    assert get_policy("priority").decide(state(cluster, [polite], [low]), 1000) == []
    cluster = make_cluster(1)
    shielded = run_on(
        cluster,
        make_job("shielded", priority=PriorityClass("system", 0, preemptible=False)),
        started=0,
    )
    assert get_policy("priority").decide(state(cluster, [urgent], [shielded]), 1000) == []
    # Same class: the priority policy never preempts.
    cluster = make_cluster(1)
    peer = run_on(cluster, make_job("peer", priority=HIGH), started=0)
    assert get_policy("priority").decide(state(cluster, [urgent], [peer]), 1000) == []


def test_fifo_ignores_classes_and_never_preempts() -> None:
    cluster = make_cluster(1)
    low = run_on(cluster, make_job("low"), started=0)
    urgent = make_job("urgent", priority=HIGH, submitted=1000)
    assert get_policy("fifo").decide(state(cluster, [urgent], [low]), 1000) == []


def test_backfill_starts_short_jobs_that_end_before_the_reservation() -> None:
    cluster = make_cluster(4)
    running = run_on(cluster, make_job("running", 2, predicted=100), started=0)
    head = make_job("head", 4, submitted=1, predicted=1000)
    short = make_job("short", 1, submitted=2, predicted=50)
    long = make_job("long", 1, submitted=3, predicted=5000)
    s = state(cluster, [head, short, long], [running])
    assert starts(get_policy("backfill").decide(s, 10)) == ["short"]
    # FIFO would start nothing; greedy priority order would start both.
    assert get_policy("fifo").decide(s, 10) == []
    assert sorted(starts(get_policy("priority").decide(s, 10))) == ["long", "short"]


def test_fair_share_favours_the_team_with_less_usage_and_alternates() -> None:
    cluster = make_cluster(1)
    heavy = make_job("heavy", team="a", submitted=0)
    light = make_job("light", team="b", submitted=10)
    s = state(cluster, [heavy, light], usage={"a": 1e6, "b": 0.0})
    assert starts(get_policy("fair").decide(s, 20)) == ["light"]
    cluster = make_cluster(4)
    jobs = [make_job(f"a{i}", team="a", submitted=i) for i in range(4)]
    jobs += [make_job(f"b{i}", team="b", submitted=10 + i) for i in range(4)]
    started = starts(get_policy("fair").decide(state(cluster, jobs), 20))
    assert sorted(started) == ["a0", "a1", "b0", "b1"]


def test_preemption_stays_within_the_job_pool() -> None:
    from shamal.scheduler.core import Cluster, Pool
    from tests.scheduler.helpers import make_node

    cluster = Cluster.of([Pool("a"), Pool("b")], [make_node("na", 1, "a"), make_node("nb", 1, "b")])
    las = get_policy("las", thresholds=[100.0], min_run_s=0)
    in_a = make_job("in-a", attained=1000)
    in_a.pool = "a"
    in_b = make_job("in-b", attained=1000)
    in_b.pool = "b"
    running = [run_on(cluster, in_a, started=0), run_on(cluster, in_b, started=0)]
    new = make_job("new", submitted=1000)
    new.pool = "b"
    decisions = las.decide(state(cluster, [new], running), 1000)
    assert preempts(decisions) == ["in-b"]
    start = decisions[-1]
    assert isinstance(start, Start)
    assert start.placement.nodes == ("nb",)


def test_a_round_bounds_its_fruitless_preemption_searches() -> None:
    cluster = make_cluster(2)
    las = get_policy("las", thresholds=[100.0], min_run_s=0)
    las.max_failed_searches = 1
    running = [run_on(cluster, make_job(f"old{i}", attained=1000), started=0) for i in range(2)]
    wide = make_job("wide", 4, submitted=10)  # can never fit on a 2-GPU node
    narrow = make_job("narrow", 1, submitted=20)
    assert las.decide(state(cluster, [wide, narrow], running), 1000) == []
    las.max_failed_searches = 16
    assert starts(las.decide(state(cluster, [wide, narrow], running), 1000)) == ["narrow"]


def test_attained_service_of_a_running_job_as_the_simulator_keeps_it() -> None:
    job = make_job("j", attained=100)
    assert job.attained_at(500) == 100  # queued: no service accrues
    job.phase = job.phase.RUNNING
    job.attained_as_of = 400
    assert job.attained_at(500) == 200
    job.attained_as_of = None  # the live scheduler: attained_s is current
    assert job.attained_at(500) == 100
