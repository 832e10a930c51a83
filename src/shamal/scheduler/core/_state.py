"""What a scheduling policy sees and what it answers.

A policy is a pure function of (state, clock) -> decisions: it reads a
:class:`SchedulerState` and returns :class:`Start` / :class:`Preempt` decisions
without changing anything. The live scheduler loop (jobs in the database, executors)
and the trace simulator apply those decisions the same way; there is no second,
simplified scheduler for the simulator.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from shamal.scheduler.core._resources import (
    GPU_MILLI,
    Cluster,
    Placement,
    Pool,
    Request,
    Resources,
)

__all__ = [
    "DEFAULT_PREEMPTION_COST_S",
    "Decision",
    "JobPhase",
    "Policy",
    "Preempt",
    "PriorityClass",
    "SchedJob",
    "SchedulerState",
    "Start",
    "TeamQuota",
    "job_pool",
    "pools_in_regions",
    "job_shape",
]

DEFAULT_PREEMPTION_COST_S = 60.0
"""Seconds of restore work a preempted job adds when it resumes (the simulator's model of a
checkpoint's restore; the live scheduler measures what really happens)."""


class JobPhase(enum.Enum):
    """The two phases a policy cares about (the database knows more states)."""

    QUEUED = "queued"
    RUNNING = "running"


@dataclass(frozen=True, slots=True)
class PriorityClass:
    """A named priority; jobs of a class with ``preempts=True`` may preempt lower ones."""

    name: str
    value: int
    preempts: bool = True
    preemptible: bool = True


@dataclass(slots=True)
class SchedJob:
    """The scheduler core's view of one job (queued or running).

    Only the scheduler's apply step mutates these; policies read them.

    Attributes:
        attained_s: seconds of service received over all attempts so far (running
            time of the current attempt included up to ``now`` by whoever builds the
            state).
        predicted_s: the runtime predictor's estimate of the whole run, if any.
        oracle_s: the true run time: known only to the simulator's oracle policies.
        fingerprint: a stable digest of the command for the runtime predictor.
        started_at: when the current attempt started (running jobs).
        last_preempted_at: when the job was last preempted (queued again since).
        borrowed: the running job holds capacity borrowed beyond its team's guarantee
            (reclaimable by preemption when the lender needs it).
        stopping: the running job was told to stop (preempted or cancelled) and has not
            exited yet: it still holds its placement, is no victim for another
            preemption, and while it stops its team borrows nothing in its pool. The
            live scheduler sets it for the rounds between a preemption and the exit;
            the simulator applies preemptions at once and never sets it.
        attained_as_of: when set on a running job, the instant ``attained_s`` was
            computed at; :meth:`attained_at` then adds the running time since. The live
            scheduler leaves it ``None`` (``attained_s`` is current); the simulator sets
            it to the attempt's start so it need not touch every running job per event.
    """

    id: str
    team: str
    request: Request
    submitted_at: float
    priority: PriorityClass
    pool: str | None = None
    user: str = ""
    fingerprint: str = ""
    phase: JobPhase = JobPhase.QUEUED
    placement: Placement | None = None
    started_at: float | None = None
    attained_s: float = 0.0
    preemptions: int = 0
    last_preempted_at: float | None = None
    predicted_s: float | None = None
    oracle_s: float | None = None
    time_limit_s: float | None = None
    borrowed: bool = False
    attained_as_of: float | None = None
    stopping: bool = False
    regions: frozenset[str] | None = None
    """The regions it may run in: only pools whose ``region`` label is one of them (a
    residency policy of the data it reads); None: anywhere."""

    def attained_at(self, now: float) -> float:
        """Seconds of service received up to ``now`` (the running attempt included)."""
        if self.attained_as_of is None or self.phase is not JobPhase.RUNNING:
            return self.attained_s
        return self.attained_s + max(0.0, now - self.attained_as_of)

    @property
    def gpus(self) -> float:
        """GPUs the whole job holds (fractions and MIG slices count by their share)."""
        return self.request.gpu_milli_per_worker * self.request.workers / GPU_MILLI


@dataclass(frozen=True, slots=True)
class TeamQuota:
    """A team's guaranteed share of a pool, and how much idle quota it may borrow.

    Teams of the same ``cohort`` lend each other their idle guaranteed quota; what a
    team runs beyond its guarantee is *borrowed* and is reclaimed by preemption when
    the lender needs it back.
    """

    team: str
    pool: str
    guaranteed: Resources
    borrow_limit: Resources = Resources()
    cohort: str = "default"
    weight: float = 1.0


@dataclass(slots=True)
class SchedulerState:
    """Everything a policy may look at, at one instant."""

    cluster: Cluster
    queued: Collection[SchedJob]
    """Every queued job, in any order."""
    running: Sequence[SchedJob]
    """Every running job (in ``run_key`` order when ``ordered_by`` names the policy)."""
    quotas: Mapping[tuple[str, str], TeamQuota] = field(default_factory=dict)
    """Quotas by (team, pool); empty: no quotas, every team may use the whole cluster."""
    usage: Mapping[str, float] = field(default_factory=dict)
    """Decayed past usage per team (GPU-seconds-equivalent) for fair share."""
    ordered_by: str | None = None
    """Name of the policy whose keys ``queue_groups`` and ``running`` are sorted by.

    The simulator keeps the queue grouped by :func:`job_shape` with each group sorted
    by the policy's ``order_key``, and ``running`` sorted by its ``run_key``, so the
    policy does not sort per event; ``None`` (the live scheduler): the policy groups
    and sorts them itself. Either way the decisions are the same.
    """
    queue_groups: Collection[Sequence[SchedJob]] | None = None
    """The queued jobs grouped by :func:`job_shape`, each group in ``order_key`` order
    (only meaningful with ``ordered_by``)."""
    free: Mapping[str, Resources] | None = None
    """Free capacity per pool, if the builder maintains it; else computed from ``cluster``."""
    allocated: Mapping[tuple[str, str], Resources] | None = None
    """What running jobs hold per (team, pool), if the builder maintains it; else computed."""
    stopping: Sequence[SchedJob] | None = None
    """The running jobs with ``stopping`` set, if the builder knows them (the simulator:
    none); else found in ``running``."""

    def free_by_pool(self) -> Mapping[str, Resources]:
        """Free capacity per pool (computed once from the nodes when not supplied)."""
        if self.free is None:
            free: dict[str, Resources] = {name: Resources() for name in self.cluster.pools}
            for node in self.cluster.nodes.values():
                gpu = sum(g.free_milli for g in node.gpus)
                free[node.pool] = free.get(node.pool, Resources()) + Resources(
                    node.free_cpu_milli, node.free_memory_mib, gpu
                )
            self.free = free
        return self.free

    def stopping_jobs(self) -> Sequence[SchedJob]:
        """The running jobs told to stop that have not exited (found once when not supplied)."""
        if self.stopping is None:
            self.stopping = [job for job in self.running if job.stopping]
        return self.stopping

    def allocated_by_team(self) -> Mapping[tuple[str, str], Resources]:
        """What running jobs hold per (team, pool) (computed once when not supplied)."""
        if self.allocated is None:
            held: dict[tuple[str, str], Resources] = {}
            for job in self.running:
                key = (job.team, job_pool(self.cluster, job))
                held[key] = held.get(key, Resources()) + job.request.total
            self.allocated = held
        return self.allocated


def job_shape(job: SchedJob) -> Hashable:
    """Jobs of one shape compete identically for placement and quota: same request,
    pool, team and regions. The scheduler walks the queue shape by shape (see
    ``ordered_by``)."""
    if job.regions is None:
        return (job.request, job.pool, job.team)
    return (job.request, job.pool, job.team, job.regions)


def pools_in_regions(pools: Mapping[str, Pool], regions: Collection[str]) -> list[str]:
    """The names of ``pools`` whose ``region`` label is one of ``regions``, sorted."""
    return sorted(name for name, pool in pools.items() if pool.labels.get("region") in regions)


def job_pool(cluster: Cluster, job: SchedJob) -> str:
    """The pool a job counts against: where it runs, else the one it asked for.

    A job that names no pool and is not running counts against the cluster's only pool
    (or ``""`` when there are several: such a job is checked against every pool it
    could land in by the placement code, and against quotas only once placed).
    """
    if job.placement is not None and job.placement.slots:
        return cluster.nodes[job.placement.slots[0].node].pool
    if job.pool is not None:
        return job.pool
    if len(cluster.pools) == 1:
        return next(iter(cluster.pools))
    return ""


@dataclass(frozen=True, slots=True)
class Start:
    """Start (or resume) a queued job at this placement."""

    job_id: str
    placement: Placement
    borrowed: bool = False


@dataclass(frozen=True, slots=True)
class Preempt:
    """Stop a running job (SIGTERM, grace period, SIGKILL) and requeue it."""

    job_id: str
    reason: str


Decision = Start | Preempt


class Policy(Protocol):
    """A scheduling policy, chosen by name.

    ``decide`` must not mutate ``state``; it returns decisions that, applied in order,
    are feasible: preemptions first free what the starts that follow need.
    """

    name: str

    def decide(self, state: SchedulerState, now: float) -> list[Decision]: ...
