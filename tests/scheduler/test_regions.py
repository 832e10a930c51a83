"""Jobs held to regions (a residency policy of the data they read): placed only in pools whose
``region`` label is allowed, by every policy, preempting only there; unrestricted jobs of the
same shape are not held back by them."""

from __future__ import annotations

import dataclasses

import pytest

from shamal.scheduler.core import (
    Cluster,
    Pool,
    Start,
    get_policy,
    job_shape,
    pools_in_regions,
)
from tests.scheduler.helpers import HIGH, make_job, make_node, preempts, run_on, starts, state


def _two_regions() -> Cluster:
    """Pool ``fra`` (Frankfurt, first by name) and ``dxb`` (Dubai), one 2-GPU node each."""
    return Cluster.of(
        [Pool("dxb", {"region": "ae-dubai"}), Pool("fra", {"region": "eu-frankfurt"})],
        [make_node("fra-1", 2, "fra"), make_node("dxb-1", 2, "dxb")],
    )


def _pool_of(cluster: Cluster, decision: Start) -> str:
    return cluster.nodes[decision.placement.slots[0].node].pool


def test_pools_in_regions_reads_the_region_label() -> None:
    cluster = _two_regions()
    assert pools_in_regions(cluster.pools, {"ae-dubai", "ae-abudhabi"}) == ["dxb"]
    assert pools_in_regions(cluster.pools, {"eu-frankfurt", "ae-dubai"}) == ["dxb", "fra"]
    assert pools_in_regions(cluster.pools, set()) == []


@pytest.mark.parametrize("policy", ["fifo", "las", "fair", "backfill"])
def test_a_held_job_lands_only_in_its_region_while_another_is_idle(policy: str) -> None:
    cluster = _two_regions()
    held = [
        dataclasses.replace(make_job(f"h{i}", 1, submitted=i), regions=frozenset({"ae-dubai"}))
        for i in range(3)
    ]
    free = make_job("free", 1, submitted=1.5)  # queued before the last held one
    decisions = get_policy(policy).decide(state(cluster, [*held, free]), now=20.0)
    started = {d.job_id: _pool_of(cluster, d) for d in decisions if isinstance(d, Start)}
    # Dubai holds two of them; the third waits although Frankfurt is idle.
    assert sorted(j for j, pool in started.items() if j.startswith("h")) == ["h0", "h1"]
    assert {started["h0"], started["h1"]} == {"dxb"}
    assert started["free"] == "fra"  # not held back by the held jobs of its shape


def test_a_job_no_pool_of_its_regions_holds_never_starts() -> None:
    cluster = _two_regions()
    nowhere = dataclasses.replace(make_job("x", 1), regions=frozenset({"sa-riyadh"}))
    assert starts(get_policy("las").decide(state(cluster, [nowhere]), now=1.0)) == []
    both = dataclasses.replace(make_job("y", 1), regions=frozenset({"sa-riyadh", "eu-frankfurt"}))
    (decision,) = get_policy("las").decide(state(cluster, [both]), now=1.0)
    assert isinstance(decision, Start)
    assert _pool_of(cluster, decision) == "fra"


def test_shapes_tell_held_jobs_from_free_ones() -> None:
    job = make_job("a", 1)
    held = dataclasses.replace(job, regions=frozenset({"ae-dubai"}))
    assert job_shape(job) != job_shape(held)
    assert job_shape(held) == job_shape(dataclasses.replace(held, id="b"))


def test_preemption_for_a_held_job_takes_only_from_its_region() -> None:
    def decide(regions: frozenset[str] | None) -> tuple[list[str], str]:
        cluster = _two_regions()
        low = [run_on(cluster, make_job(f"low-{n}", 2), started=0.0) for n in ("fra", "dxb")]
        urgent = dataclasses.replace(
            make_job("urgent", 2, submitted=500.0, priority=HIGH), regions=regions
        )
        decisions = get_policy("priority").decide(state(cluster, [urgent], low), now=1000.0)
        (start,) = [d for d in decisions if isinstance(d, Start)]
        return preempts(decisions), _pool_of(cluster, start)

    assert decide(None) == (["low-dxb"], "dxb")  # unrestricted: the youngest victim
    assert decide(frozenset({"eu-frankfurt"})) == (["low-fra"], "fra")
