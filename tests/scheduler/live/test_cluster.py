"""The live cluster from configuration: declared pools and nodes, this machine, a TOML file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shamal.config import (
    GpuSettings,
    NodeSettings,
    PoolSettings,
    QuotaSettings,
    SchedulerSettings,
)
from shamal.errors import InvalidParameter
from shamal.scheduler.core._resources import Gpu
from shamal.scheduler.live import build_cluster, effective_settings


def no_gpus() -> list[Gpu]:
    return []


def test_without_pools_this_machine_is_the_local_pool() -> None:
    cluster = build_cluster(SchedulerSettings(), no_gpus)
    (node,) = cluster.nodes.values()
    assert (node.pool, list(cluster.pools)) == ("local", ["local"])
    assert node.cpu_milli == len(os.sched_getaffinity(0)) * 1000
    assert node.memory_mib > 0
    assert node.gpus == []


def test_declared_nodes_carry_gpus_by_model_mig_and_labels() -> None:
    a100 = GpuSettings(model="A100-40GB", memory_mib=40960, count=2, mig_slices=7)
    settings = SchedulerSettings(
        pools=(
            PoolSettings(
                name="gpu",
                labels={"region": "eu", "cost_per_gpu_hour": "2.5"},
                nodes=(NodeSettings(name="g1", cpus=32, memory_mib=256_000, gpus=(a100,)),),
            ),
        )
    )
    cluster = build_cluster(settings, no_gpus)
    node = cluster.nodes["g1"]
    assert [(g.index, g.model, g.mig_slices) for g in node.gpus] == [
        (0, "A100-40GB", 7),
        (1, "A100-40GB", 7),
    ]
    assert cluster.pools["gpu"].price("cost_per_gpu_hour") == 2.5
    assert cluster.capacity("gpu").gpu_milli == 2000


def test_a_cluster_file_adds_pools_quotas_and_classes(tmp_path: Path) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(
        """
[[pools]]
name = "cpu"
labels = { cost_per_cpu_hour = "0.04" }
[[pools.nodes]]
name = "c1"
cpus = 8
memory_mib = 32768

[[quotas]]
team = "vision"
pool = "cpu"
cpus = 4
borrow_cpus = 4

[[priority_classes]]
name = "batch"
value = 10
"""
    )
    settings = effective_settings(SchedulerSettings(cluster_file=path))
    assert [p.name for p in settings.pools] == ["cpu"]
    assert (settings.quotas[0].team, settings.quotas[0].borrow_cpus) == ("vision", 4)
    assert [c.name for c in settings.priority_classes] == ["batch"]
    assert build_cluster(settings, no_gpus).nodes["c1"].cpu_milli == 8000


@pytest.mark.parametrize(
    "text",
    ["[[pools]]\nname = 'UPPER'\n", "pools = 3\n", "[[pools]\n", "[[pools]]\nname='a'\nx=1\n"],
)
def test_a_bad_cluster_file_says_what_is_wrong(tmp_path: Path, text: str) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    with pytest.raises(InvalidParameter, match="cannot use cluster file"):
        effective_settings(SchedulerSettings(cluster_file=path))
    with pytest.raises(InvalidParameter, match="cannot use cluster file"):
        effective_settings(SchedulerSettings(cluster_file=tmp_path / "missing.toml"))


def test_node_names_must_be_unique() -> None:
    node = NodeSettings(name="n", cpus=1, memory_mib=1024)
    settings = SchedulerSettings(
        pools=(PoolSettings(name="a", nodes=(node,)), PoolSettings(name="b", nodes=(node,)))
    )
    with pytest.raises(InvalidParameter, match="unique"):
        build_cluster(settings, no_gpus)


@pytest.mark.parametrize(
    ("quotas", "message"),
    [
        (
            (QuotaSettings(team="vision", pool="gpus", gpus=2),),
            "the quota of team 'vision' names pool 'gpus', which the cluster does not have "
            "(pools: gpu, cpu)",
        ),
        (
            (
                QuotaSettings(team="vision", pool="gpu", gpus=2),
                QuotaSettings(team="vision", pool="gpu", gpus=4),
            ),
            "team 'vision' has two quotas in pool 'gpu': give it one",
        ),
    ],
)
def test_a_quota_must_name_a_pool_of_the_cluster_once_per_team(
    quotas: tuple[QuotaSettings, ...], message: str
) -> None:
    node = NodeSettings(name="n", cpus=1, memory_mib=1024)
    pools = (PoolSettings(name="gpu", nodes=(node,)), PoolSettings(name="cpu", local=True))
    settings = SchedulerSettings(pools=pools, quotas=quotas)
    with pytest.raises(InvalidParameter) as refused:
        build_cluster(settings, no_gpus)
    assert refused.value.message == message
    other_team = QuotaSettings(team="nlp", pool="gpu", gpus=2)
    fine = SchedulerSettings(
        pools=pools, quotas=(quotas[0].model_copy(update={"pool": "gpu"}), other_team)
    )
    assert sorted(build_cluster(fine, no_gpus).pools) == ["cpu", "gpu"]
