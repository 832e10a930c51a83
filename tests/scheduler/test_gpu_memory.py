"""Memory per device: a request's ``gpu_memory_mib`` and where its workers may go.

A worker's device memory is what it gets of a GPU: a whole GPU's memory, a fraction's
share of it, a MIG slice's memory slices (of 8 on the 7-slice GPUs, of 4 on the A30).
A gang (pipeline stages, one per worker) is placed only where every worker gets a device
with at least that much memory, by every strategy.
"""

from __future__ import annotations

import pytest

from shamal.scheduler.core import device_memory_mib
from shamal.scheduler.core._placement import STRATEGIES, allocate, place
from shamal.scheduler.core._resources import Cluster, Gpu, Node, Pool, Request

GIB = 1024


def node(name: str, gpus: int, memory_gb: int, *, model: str = "A100", mig: int = 0) -> Node:
    return Node(
        name=name,
        pool="p",
        cpu_milli=64_000,
        memory_mib=256 * GIB,
        gpus=[Gpu(i, model, memory_gb * GIB, mig_slices=mig) for i in range(gpus)],
    )


def cluster(*nodes: Node) -> Cluster:
    return Cluster.of([Pool("p")], nodes)


@pytest.mark.parametrize(
    ("memory_gb", "mig", "request_", "expected_mib"),
    [
        (80, 0, Request(gpus=1), 80 * GIB),
        (80, 0, Request(gpu_milli=250), 20 * GIB),
        (80, 0, Request(gpu_milli=333), 80 * GIB * 333 // 1000),
        (80, 7, Request(mig_profile="1g.10gb"), 10 * GIB),
        (80, 7, Request(mig_profile="1g.20gb"), 20 * GIB),
        (80, 7, Request(mig_profile="3g.40gb"), 40 * GIB),
        (80, 7, Request(mig_profile="7g.80gb"), 80 * GIB),
        (24, 4, Request(mig_profile="1g.6gb"), 6 * GIB),
        (24, 4, Request(mig_profile="2g.12gb"), 12 * GIB),
        (80, 7, Request(mig_profile="1g.5gb"), 0),  # a 40 GB profile: not offered here
        (80, 0, Request(), 0),  # no GPU asked for
    ],
)
def test_the_memory_a_worker_gets_of_a_gpu(
    memory_gb: int, mig: int, request_: Request, expected_mib: int
) -> None:
    gpu = Gpu(0, "A100", memory_gb * GIB, mig_slices=mig)
    assert device_memory_mib(gpu, request_) == expected_mib


@pytest.mark.parametrize(
    "kwargs",
    [
        {"gpus": 1, "gpu_memory_mib": -1},
        {"gpu_memory_mib": 1024},  # no GPU form
        {"cpu_milli": 1000, "gpu_memory_mib": 1},
    ],
)
def test_a_request_with_impossible_device_memory_is_refused(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="device memory must be >= 0, and asked for with a GPU"):
        Request(**kwargs)


def _gang(memory_mib: int, workers: int = 2) -> Request:
    return Request(
        cpu_milli=1000, memory_mib=GIB, gpus=1, workers=workers, gpu_memory_mib=memory_mib
    )


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_pipeline_stages_go_only_where_each_gets_a_device_with_enough_memory(
    strategy: str,
) -> None:
    small = node("small", 4, 24)  # room for the whole gang, but 24 GB GPUs
    c = cluster(small, node("big1", 1, 80), node("big2", 1, 80))
    anywhere = place(c, _gang(0), strategy=strategy)
    assert anywhere is not None
    assert anywhere.nodes == ("small",)  # without the memory floor one node holds both
    stages = place(c, _gang(40 * GIB), strategy=strategy)
    assert stages is not None
    assert sorted(stages.nodes) == ["big1", "big2"]
    assert all(slot.gpus == (0,) for slot in stages.slots)
    exact = place(c, _gang(80 * GIB), strategy=strategy)  # "at least": equal is enough
    assert exact is not None
    assert sorted(exact.nodes) == ["big1", "big2"]
    assert place(c, _gang(80 * GIB + 1), strategy=strategy) is None
    assert place(c, _gang(40 * GIB, workers=3), strategy=strategy) is None  # only two big GPUs


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_gang_waits_while_the_big_devices_are_held(strategy: str) -> None:
    c = cluster(node("small", 4, 24), node("big1", 1, 80), node("big2", 1, 80))
    held = place(c, Request(gpus=1, gpu_memory_mib=80 * GIB), strategy=strategy)
    assert held is not None
    allocate(c, held)
    assert place(c, _gang(40 * GIB), strategy=strategy) is None  # one big GPU left
    one = place(c, _gang(40 * GIB, workers=1), strategy=strategy)
    assert one is not None
    assert one.nodes == tuple({"big1", "big2"} - set(held.nodes))


def test_whole_gpus_per_worker_each_need_the_memory() -> None:
    mixed = Node(
        name="mixed",
        pool="p",
        cpu_milli=64_000,
        memory_mib=256 * GIB,
        gpus=[Gpu(0, "A100", 80 * GIB), Gpu(1, "L4", 24 * GIB), Gpu(2, "A100", 80 * GIB)],
    )
    c = cluster(mixed)
    two = place(c, Request(gpus=2, gpu_memory_mib=40 * GIB))
    assert two is not None
    assert two.slots[0].gpus == (0, 2)
    assert place(c, Request(gpus=3, gpu_memory_mib=40 * GIB)) is None
    assert place(c, Request(gpus=3)) is not None


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_fractions_count_their_share_of_the_gpus_memory(strategy: str) -> None:
    c = cluster(node("l40", 1, 48, model="L40S"), node("h100", 1, 80, model="H100"))
    half = Request(gpu_milli=500, gpu_memory_mib=30 * GIB)  # 24 GiB on the L40S, 40 on the H100
    placed = place(c, half, strategy=strategy)
    assert placed is not None
    assert placed.nodes == ("h100",)
    assert place(c, Request(gpu_milli=500, gpu_memory_mib=41 * GIB), strategy=strategy) is None
    quarter = Request(gpu_milli=500, gpu_memory_mib=24 * GIB)
    assert place(c, quarter, strategy=strategy) is not None


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_mig_slices_count_their_memory_slices(strategy: str) -> None:
    c = cluster(node("mig", 1, 80, mig=7))
    assert (
        place(c, Request(mig_profile="1g.10gb", gpu_memory_mib=20 * GIB), strategy=strategy) is None
    )
    slice_ = place(c, Request(mig_profile="1g.20gb", gpu_memory_mib=20 * GIB), strategy=strategy)
    assert slice_ is not None
    assert slice_.slots[0].mig_profile == "1g.20gb"
    gang = Request(mig_profile="3g.40gb", gpu_memory_mib=40 * GIB, workers=2)
    both = place(c, gang, strategy=strategy)  # 3g + 3g fit one 7-slice GPU
    assert both is not None
    assert sorted(s.mig_start for s in both.slots) == [0, 4]
