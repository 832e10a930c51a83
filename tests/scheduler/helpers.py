"""Hand-built clusters, jobs and states for the scheduler tests."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from shamal.scheduler.core import (
    Cluster,
    Decision,
    Gpu,
    JobPhase,
    Node,
    Pool,
    Preempt,
    PriorityClass,
    Request,
    SchedJob,
    SchedulerState,
    Start,
    TeamQuota,
    allocate,
    place,
)

NORMAL = PriorityClass("normal", 0)
HIGH = PriorityClass("high", 10)


def make_node(name: str, gpus: int, pool: str = "default") -> Node:
    return Node(
        name=name,
        pool=pool,
        cpu_milli=64_000,
        memory_mib=256 * 1024,
        gpus=[Gpu(index=i, model="A100", memory_mib=80 * 1024) for i in range(gpus)],
    )


def make_cluster(*gpus_per_node: int, pool: str = "default") -> Cluster:
    nodes = [make_node(f"n{i}", g, pool) for i, g in enumerate(gpus_per_node)]
    return Cluster.of([Pool(pool)], nodes)


def make_job(
    job_id: str,
    gpus: int = 1,
    *,
    submitted: float = 0.0,
    team: str = "t",
    priority: PriorityClass = NORMAL,
    oracle: float | None = None,
    predicted: float | None = None,
    workers: int = 1,
    attained: float = 0.0,
) -> SchedJob:
    return SchedJob(
        id=job_id,
        team=team,
        request=Request(cpu_milli=1000, memory_mib=1024, gpus=gpus, workers=workers),
        submitted_at=submitted,
        priority=priority,
        oracle_s=oracle,
        predicted_s=predicted,
        attained_s=attained,
    )


def run_on(cluster: Cluster, job: SchedJob, *, started: float, borrowed: bool = False) -> SchedJob:
    """Place and allocate ``job`` as if it had been running since ``started``
    (``attained_s`` is then its service up to the state's clock, set by the caller)."""
    placement = place(cluster, job.request, pool=job.pool)
    assert placement is not None, f"{job.id} does not fit"
    allocate(cluster, placement)
    job.placement = placement
    job.phase = JobPhase.RUNNING
    job.started_at = started
    job.borrowed = borrowed
    return job


def state(
    cluster: Cluster,
    queued: Iterable[SchedJob],
    running: Iterable[SchedJob] = (),
    *,
    quotas: Mapping[tuple[str, str], TeamQuota] | None = None,
    usage: Mapping[str, float] | None = None,
) -> SchedulerState:
    return SchedulerState(
        cluster=cluster,
        queued=list(queued),
        running=list(running),
        quotas=dict(quotas or {}),
        usage=dict(usage or {}),
    )


def starts(decisions: list[Decision]) -> list[str]:
    return [d.job_id for d in decisions if isinstance(d, Start)]


def preempts(decisions: list[Decision]) -> list[str]:
    return [d.job_id for d in decisions if isinstance(d, Preempt)]


def snapshot(cluster: Cluster) -> list[tuple[object, ...]]:
    """Every node's free capacity, to check that deciding changed nothing."""
    return [
        (
            n.name,
            n.free_cpu_milli,
            n.free_memory_mib,
            tuple((g.free_milli, g.mig_used) for g in n.gpus),
        )
        for n in cluster.nodes.values()
    ]
