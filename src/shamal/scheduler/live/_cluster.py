"""The cluster the live scheduler places jobs on: pools and nodes from configuration.

Without any pool configured, one pool ``local`` holds this machine: its CPUs, its
memory and the GPUs NVML sees (none on a machine without an NVIDIA driver). A pool
with ``local = true`` gets this machine added to the nodes it declares. Nodes
declared in configuration stand for machines NVML cannot see (tests, simulation,
remote machines of a Ray cluster).
"""

from __future__ import annotations

import logging
import os
import socket
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from shamal.config import (
    NodeSettings,
    PoolSettings,
    PriorityClassSettings,
    QuotaSettings,
    SchedulerSettings,
)
from shamal.errors import InvalidParameter
from shamal.scheduler.core import Cluster, Gpu, Node, Pool

logger = logging.getLogger(__name__)

GpuDetector = Callable[[], list[Gpu]]


class ClusterFile(BaseModel):
    """The TOML file named by ``scheduler.cluster_file``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pools: tuple[PoolSettings, ...] = ()
    quotas: tuple[QuotaSettings, ...] = ()
    priority_classes: tuple[PriorityClassSettings, ...] = ()


def effective_settings(settings: SchedulerSettings) -> SchedulerSettings:
    """``settings`` with the cluster file's pools, quotas and classes added.

    Raises:
        InvalidParameter: the file is unreadable or not valid (the message says where).
    """
    if settings.cluster_file is None:
        return settings
    try:
        raw = tomllib.loads(Path(settings.cluster_file).read_text(encoding="utf-8"))
        extra = ClusterFile.model_validate(raw)
    except (OSError, tomllib.TOMLDecodeError, ValidationError) as exc:
        raise InvalidParameter(
            f"cannot use cluster file {settings.cluster_file}: {str(exc)[:500]}"
        ) from None
    classes = settings.priority_classes
    if extra.priority_classes:
        classes = extra.priority_classes
    return settings.model_copy(
        update={
            "pools": settings.pools + extra.pools,
            "quotas": settings.quotas + extra.quotas,
            "priority_classes": classes,
            "cluster_file": None,
        }
    )


def _local_memory_mib() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    except (ValueError, OSError):  # pragma: no cover - every Linux has both
        return 1024


def local_node(pool: str, detect: GpuDetector) -> Node:
    """This machine as a node: usable CPUs, physical memory, detected GPUs."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return Node(
        name=socket.gethostname() or "localhost",
        pool=pool,
        cpu_milli=(cpus or 1) * 1000,
        memory_mib=_local_memory_mib(),
        gpus=detect(),
        labels={"local": "true"},
    )


def _declared_node(pool: str, node: NodeSettings) -> Node:
    gpus: list[Gpu] = []
    for spec in node.gpus:
        for _ in range(spec.count):
            gpus.append(
                Gpu(
                    index=len(gpus),
                    model=spec.model,
                    memory_mib=spec.memory_mib,
                    mig_slices=spec.mig_slices,
                )
            )
    return Node(
        name=node.name,
        pool=pool,
        cpu_milli=round(node.cpus * 1000),
        memory_mib=node.memory_mib,
        gpus=gpus,
        labels=dict(node.labels),
    )


def build_cluster(settings: SchedulerSettings, detect: GpuDetector) -> Cluster:
    """An empty cluster (nothing allocated) from the effective settings."""
    pools: Sequence[PoolSettings] = settings.pools or (PoolSettings(name="local", local=True),)
    nodes: list[Node] = []
    for pool in pools:
        if pool.local:
            nodes.append(local_node(pool.name, detect))
        nodes.extend(_declared_node(pool.name, node) for node in pool.nodes)
    names = [node.name for node in nodes]
    if len(set(names)) != len(names):
        raise InvalidParameter("node names must be unique across pools")
    _check_quotas(settings.quotas, [pool.name for pool in pools])
    return Cluster.of((Pool(p.name, dict(p.labels)) for p in pools), nodes)


def _check_quotas(quotas: Sequence[QuotaSettings], pools: Sequence[str]) -> None:
    """A quota must name a pool of the cluster, once per team: a misspelt pool would
    otherwise leave that pool without the quota, silently.

    Raises:
        InvalidParameter: which quota is wrong, and the pools there are.
    """
    seen: set[tuple[str, str]] = set()
    for quota in quotas:
        if quota.pool not in pools:
            raise InvalidParameter(
                f"the quota of team {quota.team!r} names pool {quota.pool!r}, which the "
                f"cluster does not have (pools: {', '.join(pools)})"
            )
        if (quota.team, quota.pool) in seen:
            raise InvalidParameter(
                f"team {quota.team!r} has two quotas in pool {quota.pool!r}: give it one"
            )
        seen.add((quota.team, quota.pool))
