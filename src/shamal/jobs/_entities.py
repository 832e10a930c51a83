"""Jobs as the rest of the platform sees them: frozen values, no ORM rows."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

__all__ = [
    "ACTIVE_STATES",
    "FINAL_STATES",
    "TRANSITIONS",
    "CostLine",
    "Job",
    "JobEvent",
    "JobSpec",
    "JobState",
]


class JobState(enum.StrEnum):
    """A job's life: queued -> admitted -> running -> one of the outcomes.

    ``preempted``, ``failed`` and ``lost`` go back to ``queued`` while the job has
    retries left (preemption never uses one up); otherwise ``failed`` and ``lost`` are
    final, like ``succeeded`` and ``cancelled``.
    """

    QUEUED = "queued"
    ADMITTED = "admitted"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PREEMPTED = "preempted"
    CANCELLED = "cancelled"
    LOST = "lost"


TRANSITIONS: Mapping[JobState | None, frozenset[JobState]] = {
    None: frozenset({JobState.QUEUED}),
    JobState.QUEUED: frozenset({JobState.ADMITTED, JobState.CANCELLED}),
    JobState.ADMITTED: frozenset(
        {JobState.RUNNING, JobState.QUEUED, JobState.CANCELLED, JobState.LOST, JobState.FAILED}
    ),
    JobState.RUNNING: frozenset(
        {
            JobState.SUCCEEDED,
            JobState.FAILED,
            JobState.PREEMPTED,
            JobState.CANCELLED,
            JobState.LOST,
        }
    ),
    JobState.PREEMPTED: frozenset({JobState.QUEUED}),
    JobState.FAILED: frozenset({JobState.QUEUED}),
    JobState.LOST: frozenset({JobState.QUEUED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.CANCELLED: frozenset(),
}
"""Every transition the store accepts; anything else is a bug and raises."""

ACTIVE_STATES = frozenset({JobState.ADMITTED, JobState.RUNNING})
"""States in which a job holds resources."""
FINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.CANCELLED})
"""States no job ever leaves (failed and lost may still be retried)."""


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What a user submits (validated by the service)."""

    command: tuple[str, ...]
    name: str = ""
    team: str | None = None
    priority: str | None = None
    cpus: float = 1.0
    memory_mib: int = 2048
    gpus: int = 0
    gpu_fraction: float = 0.0
    mig_profile: str | None = None
    gpu_models: tuple[str, ...] = ()
    #: The memory each worker's device must have, in MiB (0: any): a whole GPU, a
    #: fraction (its share of the GPU's memory) or a MIG slice (its memory slices).
    gpu_memory_mib: int = 0
    workers: int = 1
    pool: str | None = None
    time_limit_s: float | None = None
    retries: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    snapshot: str | None = None
    #: The datasets the job reads (``customers``, ``customers@prod``): their residency
    #: policies decide the regions it may run in.
    datasets: tuple[str, ...] = ()
    #: The executor that runs it (``local``, ``ray``); None: the server's default.
    executor: str | None = None
    #: The job's id, chosen by the caller (32 lower-case hex digits) so that a submission
    #: retried after a crash finds the job it made instead of making a second one.
    id: str | None = None


@dataclass(frozen=True, slots=True)
class Job:
    """One job and where it stands."""

    id: str
    name: str
    team: str
    user: str
    command: tuple[str, ...]
    env: Mapping[str, str]
    snapshot: str | None
    cpu_milli: int
    memory_mib: int
    gpus: int
    gpu_milli: int
    mig_profile: str | None
    gpu_models: tuple[str, ...]
    workers: int
    pool: str | None
    priority: str
    priority_value: int
    time_limit_s: float | None
    max_retries: int
    retries_used: int
    attempt: int
    state: JobState
    reason: str
    exit_code: int | None
    submitted_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    placement: Mapping[str, Any] | None
    handle: Mapping[str, Any] | None
    claimed_by: str | None
    stop_request: str | None
    attained_s: float
    preemptions: int
    fingerprint: str
    predicted_s: float | None
    #: The datasets it reads, and the regions their residency policies leave it to run in
    #: (None: anywhere).
    datasets: tuple[str, ...] = ()
    regions: tuple[str, ...] | None = None
    #: The executor it asked for (``local``, ``ray``); None: the server's default.
    executor: str | None = None
    #: The memory each worker's device must have, in MiB (0: any).
    gpu_memory_mib: int = 0

    @property
    def resources_text(self) -> str:
        """What the job asks for, the way the CLI shows it."""
        parts = [f"{self.cpu_milli / 1000:g} CPU", f"{self.memory_mib} MiB"]
        if self.gpus:
            parts.append(f"{self.gpus} GPU")
        elif self.gpu_milli:
            parts.append(f"{self.gpu_milli / 1000:g} GPU")
        elif self.mig_profile:
            parts.append(f"MIG {self.mig_profile}")
        if self.gpu_memory_mib:
            parts.append(f">= {self.gpu_memory_mib} MiB per device")
        if self.workers > 1:
            parts.append(f"x{self.workers} workers")
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class JobEvent:
    """One recorded transition of a job."""

    job_id: str
    at: datetime
    from_state: JobState | None
    to_state: JobState
    attempt: int
    actor: str
    reason: str


@dataclass(frozen=True, slots=True)
class CostLine:
    """Usage and cost of one group (a team, a pool, a job, a user) over a period."""

    key: str
    jobs: int
    attempts: int
    gpu_seconds: float
    cpu_seconds: float
    memory_gib_seconds: float
    cost: float


@dataclass(frozen=True, slots=True)
class Amount:
    """CPUs, memory and GPUs (a quota, a borrow limit or what a team holds)."""

    cpus: float = 0.0
    memory_mib: int = 0
    gpus: float = 0.0


@dataclass(frozen=True, slots=True)
class QuotaUse:
    """A team's configured quota in one pool and what the team's jobs hold there now.

    ``held`` counts admitted and running jobs; what it holds beyond ``guaranteed`` is
    borrowed from idle quota of its ``cohort`` and may be reclaimed by preemption.
    """

    team: str
    pool: str
    cohort: str
    weight: float
    guaranteed: Amount
    borrow_limit: Amount
    held: Amount
    running: int
    queued: int
