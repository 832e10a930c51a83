"""GPU placement: whole GPUs, fractions, MIG slices, gangs, constraints and bookkeeping."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shamal.scheduler.core._fragmentation import FragModel
from shamal.scheduler.core._placement import STRATEGIES, allocate, place, release
from shamal.scheduler.core._resources import (
    GPU_MILLI,
    Cluster,
    Gpu,
    Node,
    Placement,
    Pool,
    Request,
    RequestMix,
    Slot,
    free_whole_gpus,
)
from shamal.scheduler.core._strategies import strategy_named


def node(
    name: str,
    gpus: int,
    *,
    pool: str = "p",
    model: str = "A100",
    memory_gb: int = 80,
    cpu: int = 64_000,
    memory: int = 256 * 1024,
    mig: int = 0,
) -> Node:
    return Node(
        name=name,
        pool=pool,
        cpu_milli=cpu,
        memory_mib=memory,
        gpus=[Gpu(i, model, memory_gb * 1024, mig_slices=mig) for i in range(gpus)],
    )


def cluster(*nodes: Node) -> Cluster:
    return Cluster.of([Pool(p) for p in dict.fromkeys(n.pool for n in nodes)], nodes)


def state(c: Cluster) -> list[tuple[object, ...]]:
    """Everything allocate/release may change, for before/after comparisons."""
    return [
        (n.name, n.free_cpu_milli, n.free_memory_mib, [(g.free_milli, g.mig_used) for g in n.gpus])
        for n in c.nodes.values()
    ]


def take(c: Cluster, request: Request, **kwargs: object) -> Placement:
    placement = place(c, request, **kwargs)  # type: ignore[arg-type]
    assert placement is not None
    allocate(c, placement)
    return placement


WHOLE = Request(cpu_milli=1000, memory_mib=1024, gpus=1)


# ------------------------------------------------------------------ whole GPUs


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_whole_gpus_fit_on_one_node_and_run_out(strategy: str) -> None:
    c = cluster(node("a", 4), node("b", 2))
    placements = [take(c, Request(gpus=2), strategy=strategy) for _ in range(3)]
    for p in placements:
        (slot,) = p.slots
        assert len(slot.gpus) == 2
    held = sorted((s.node, g) for p in placements for s in p.slots for g in s.gpus)
    assert len(set(held)) == 6  # no GPU given twice
    assert place(c, Request(gpus=1), strategy=strategy) is None


def test_a_gpu_with_a_fraction_in_use_is_not_free_as_a_whole() -> None:
    c = cluster(node("a", 2))
    take(c, Request(gpu_milli=100))
    assert free_whole_gpus(c.nodes["a"]) == 1
    assert place(c, Request(gpus=2)) is None
    assert place(c, Request(gpus=1)) is not None


def test_best_fit_takes_the_node_left_with_fewest_free_gpus() -> None:
    c = cluster(node("big", 8), node("small", 2))
    (slot,) = take(c, Request(gpus=2), strategy="best-fit").slots
    assert slot.node == "small"


def test_place_fails_fast_when_the_pool_lacks_gpus() -> None:
    c = cluster(node("a", 8), node("b", 8, pool="q"))
    assert place(c, Request(gpus=8), pool="p") is not None
    take(c, Request(gpus=1), pool="p")
    assert place(c, Request(gpus=8), pool="p") is None
    assert place(c, Request(gpus=9)) is None
    assert place(c, Request(gpus=1), pool="nowhere") is None


# ------------------------------------------------------------------ fractions


def test_fractions_share_a_gpu_up_to_its_capacity() -> None:
    c = cluster(node("a", 1))
    take(c, Request(gpu_milli=600))
    take(c, Request(gpu_milli=400))
    assert c.nodes["a"].gpus[0].free_milli == 0
    assert place(c, Request(gpu_milli=1)) is None


@pytest.mark.parametrize("strategy", ["fgd", "fgd-pack", "best-fit", "gpu-packing"])
def test_a_fraction_fills_a_shared_gpu_before_opening_a_fresh_one(strategy: str) -> None:
    c = cluster(node("a", 2), node("b", 2))
    first = take(c, Request(gpu_milli=500), strategy=strategy).slots[0]
    second = take(c, Request(gpu_milli=500), strategy=strategy).slots[0]
    assert (second.node, second.gpus) == (first.node, first.gpus)


def test_fgd_keeps_whole_nodes_for_the_typical_big_request() -> None:
    # The workload is mostly 8-GPU jobs: a 1-GPU job goes where it breaks no 8-GPU slot.
    c = cluster(node("fresh", 8), node("used", 8))
    take(c, Request(gpus=1), strategy="best-fit")  # lands on one of them
    used = next(n for n in c.nodes.values() if free_whole_gpus(n) == 7).name
    c.typical = RequestMix.of([(Request(gpus=8), 0.9), (Request(gpus=1), 0.1)])
    for strategy in ("fgd", "fgd-pack"):
        (slot,) = place(c, Request(gpus=1), strategy=strategy).slots  # type: ignore[union-attr]
        assert slot.node == used


def test_packed_fragmentation_counts_what_a_request_cannot_refill() -> None:
    mix = RequestMix.of([(Request(cpu_milli=0, memory_mib=0, gpu_milli=470), 1.0)])
    paper, packed = FragModel(mix), FragModel(mix, packing=1.0)
    gpus = (("A100", 700),)
    assert paper.frag(64_000, gpus) == 0  # one 470 fits: nothing counted
    assert packed.frag(64_000, gpus) == 700 - 470  # the 230 left after it
    assert paper.frag(64_000, (("A100", 400),)) == 400  # nothing fits: all of it


def test_random_is_seeded_and_spreads() -> None:
    c = cluster(*(node(f"n{i}", 8) for i in range(6)))
    first = {
        place(c, WHOLE, strategy=strategy_named("random", seed=s)).slots[0].node  # type: ignore[union-attr]
        for s in range(40)
    }
    again = {
        place(c, WHOLE, strategy=strategy_named("random", seed=s)).slots[0].node  # type: ignore[union-attr]
        for s in range(40)
    }
    assert first == again
    assert len(first) > 1


def test_unknown_strategy_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown placement strategy"):
        place(cluster(node("a", 1)), WHOLE, strategy="nope")


# ------------------------------------------------------------------ MIG


def test_mig_slices_follow_the_placement_rules() -> None:
    c = cluster(node("a", 1, mig=7))
    three = take(c, Request(mig_profile="3g.40gb")).slots[0]
    assert three.mig_start == 4  # keeps 0-3 open for a 4g
    four = take(c, Request(mig_profile="4g.40gb")).slots[0]
    assert four.mig_start == 0
    assert place(c, Request(mig_profile="1g.10gb")) is None
    assert c.nodes["a"].gpus[0].mig_used == 0xFF


def test_seven_small_slices_and_no_eighth() -> None:
    c = cluster(node("a", 1, mig=7))
    starts = sorted(take(c, Request(mig_profile="1g.10gb")).slots[0].mig_start for _ in range(7))
    assert starts == list(range(7))
    assert place(c, Request(mig_profile="1g.10gb")) is None


def test_mig_needs_a_partitioned_gpu_with_the_profile() -> None:
    c = cluster(node("plain", 2), node("mig40", 1, memory_gb=40, mig=7))
    assert place(c, Request(mig_profile="1g.5gb")).slots[0].node == "mig40"  # type: ignore[union-attr]
    assert place(c, Request(mig_profile="3g.40gb")) is None  # an 80 GB profile
    # A MIG GPU is never handed out whole or as a fraction.
    take(c, Request(gpus=2))
    assert place(c, Request(gpus=1)) is None
    assert place(c, Request(gpu_milli=100)) is None


def test_allocate_refuses_a_mig_slot_at_a_start_the_profile_does_not_allow() -> None:
    c = cluster(node("a", 1, mig=7))
    bad = Placement((Slot("a", 0, 0, (0,), mig_profile="3g.40gb", mig_start=2),))
    with pytest.raises(ValueError, match="cannot start"):
        allocate(c, bad)
    assert c.nodes["a"].gpus[0].mig_used == 0


# ------------------------------------------------------------------ gangs and constraints


def test_a_gang_goes_on_one_node_when_one_holds_it() -> None:
    c = cluster(node("four-a", 4), node("eight", 8), node("four-b", 4))
    gang = take(c, Request(gpus=4, workers=2))
    assert gang.nodes == ("eight",)
    assert len({g for s in gang.slots for g in s.gpus}) == 8


def test_a_gang_spans_the_fewest_nodes_or_none() -> None:
    c = cluster(*(node(f"n{i}", 8) for i in range(4)), node("two", 2))
    gang = take(c, Request(gpus=8, workers=3))
    assert len(gang.nodes) == 3
    assert len(gang.slots) == 3
    before = state(c)
    assert place(c, Request(gpus=8, workers=2)) is None
    assert state(c) == before
    mixed = take(c, Request(gpus=1, workers=10))  # 8 on the last big node, 2 on "two"
    assert len(mixed.nodes) == 2
    assert "two" in mixed.nodes


def test_fractional_gang_shares_gpus_on_one_node() -> None:
    c = cluster(node("a", 2), node("b", 2))
    gang = take(c, Request(gpu_milli=500, workers=4))
    assert len(gang.nodes) == 1
    assert all(g.free_milli == 0 for g in c.nodes[gang.nodes[0]].gpus)


def test_cpu_and_memory_must_fit_on_the_same_node() -> None:
    c = cluster(node("cpu-poor", 8, cpu=2000), node("rich", 1, cpu=64_000))
    (slot,) = take(c, Request(cpu_milli=8000, gpus=1)).slots
    assert slot.node == "rich"
    assert place(c, Request(cpu_milli=8000, gpus=1)) is None
    assert place(c, Request(cpu_milli=0, memory_mib=10**9)) is None


def test_gpu_models_and_pools_restrict_the_nodes() -> None:
    c = cluster(node("t4", 2, model="T4", pool="cheap"), node("a100", 2, pool="fast"))
    (slot,) = take(c, Request(gpus=1, gpu_models=frozenset({"T4"}))).slots
    assert slot.node == "t4"
    assert place(c, Request(gpus=1, gpu_models=frozenset({"H100"}))) is None
    assert place(c, Request(gpu_milli=300, gpu_models=frozenset({"T4"})), pool="fast") is None
    assert place(c, WHOLE, pool="fast").slots[0].node == "a100"  # type: ignore[union-attr]


# ------------------------------------------------------------------ bookkeeping


def test_place_does_not_change_the_cluster() -> None:
    c = cluster(node("a", 2), node("b", 1, mig=7))
    before = state(c)
    for request in (WHOLE, Request(gpu_milli=250), Request(mig_profile="2g.20gb"), Request()):
        for strategy in STRATEGIES:
            assert place(c, request, strategy=strategy) is not None
    assert state(c) == before


def test_allocate_is_all_or_nothing_and_release_restores() -> None:
    c = cluster(node("a", 2))
    before = state(c)
    over = Placement((Slot("a", 1000, 1024, (0,)), Slot("a", 1000, 1024, (0,))))
    with pytest.raises(ValueError, match="GPU 0"):
        allocate(c, over)
    assert state(c) == before
    with pytest.raises(ValueError, match="no node"):
        allocate(c, Placement((Slot("zz", 0, 0),)))
    with pytest.raises(ValueError, match="no GPU 7"):
        allocate(c, Placement((Slot("a", 0, 0, (7,)),)))
    placement = take(c, Request(gpus=2))
    release(c, placement)
    assert state(c) == before
    with pytest.raises(ValueError, match="does not hold"):
        release(c, placement)
    assert state(c) == before


def test_index_follows_nodes_added_after_it_was_built() -> None:
    c = cluster(node("a", 1))
    take(c, WHOLE)
    assert place(c, WHOLE) is None
    c.nodes["b"] = node("b", 1)
    assert place(c, WHOLE).slots[0].node == "b"  # type: ignore[union-attr]


def test_reindex_after_changing_free_capacity_by_hand() -> None:
    c = cluster(node("a", 1))
    assert place(c, WHOLE) is not None
    c.nodes["a"].gpus[0].free_milli = 0
    c.reindex()
    assert place(c, WHOLE) is None


# ------------------------------------------------------------------ property test

_REQUESTS = st.one_of(
    st.builds(Request, cpu_milli=st.integers(0, 8000), gpus=st.integers(1, 4)),
    st.builds(Request, cpu_milli=st.integers(0, 8000), gpu_milli=st.integers(1, 999)),
    st.builds(
        Request,
        cpu_milli=st.integers(0, 4000),
        mig_profile=st.sampled_from(["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb"]),
    ),
    st.builds(Request, cpu_milli=st.integers(0, 16_000), memory_mib=st.integers(0, 64_000)),
    st.builds(
        Request,
        cpu_milli=st.integers(0, 4000),
        gpus=st.integers(1, 2),
        workers=st.integers(2, 4),
    ),
)
_STEPS = st.lists(
    st.tuples(st.booleans(), _REQUESTS, st.sampled_from(STRATEGIES), st.integers(0, 10**6)),
    max_size=40,
)


def _check_invariants(c: Cluster, held: list[Placement], initial: Cluster) -> None:
    for n in c.nodes.values():
        start = initial.nodes[n.name]
        slots = [s for p in held for s in p.slots if s.node == n.name]
        assert n.free_cpu_milli == start.cpu_milli - sum(s.cpu_milli for s in slots) >= 0
        assert n.free_memory_mib == start.memory_mib - sum(s.memory_mib for s in slots) >= 0
        for g in n.gpus:
            on_gpu = [s for s in slots if g.index in s.gpus]
            assert 0 <= g.free_milli <= GPU_MILLI
            if g.mig_slices:
                assert all(s.mig_profile for s in on_gpu)
            else:
                taken = sum(s.gpu_milli or GPU_MILLI for s in on_gpu)
                assert g.free_milli == GPU_MILLI - taken
    index = c.free_index()
    assert index.free_whole[None] == sum(free_whole_gpus(n) for n in c.nodes.values())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=_STEPS)
def test_random_allocate_release_never_overallocates_and_restores(
    steps: list[tuple[bool, Request, str, int]],
) -> None:
    c = cluster(
        node("a", 4, cpu=16_000, memory=64_000),
        node("b", 2, cpu=8000, memory=32_000, model="T4", memory_gb=16),
        node("m", 2, cpu=16_000, memory=64_000, mig=7),
        node("cpu", 0, cpu=8000, memory=16_000, pool="q"),
    )
    initial = copy.deepcopy(c)
    held: list[Placement] = []
    for add, request, strategy, pick in steps:
        if add or not held:
            placement = place(c, request, strategy=strategy)
            if placement is not None:
                assert len(placement.slots) == request.workers
                allocate(c, placement)
                held.append(placement)
        else:
            release(c, held.pop(pick % len(held)))
        _check_invariants(c, held, initial)
    for placement in reversed(held):
        release(c, placement)
    assert state(c) == state(initial)
