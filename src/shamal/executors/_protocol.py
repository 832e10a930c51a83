"""The executor contract: what runs a placed job, and the values it trades in.

An :class:`Executor` turns a :class:`LaunchSpec` (a job attempt that the scheduler has
placed) into running processes, reports how they ended as an :class:`ExitStatus`, and
hands out a :class:`Handle` that the caller stores (as JSON, in the job's row) so that a
*new* server process can :meth:`Executor.reattach` to the attempt after a restart.

Contract shared by every implementation:

- **Thread safety.** An executor may be called from several threads at once. All state
  that matters lives outside the executor object (files next to the log, or the Ray
  cluster), so two executor objects, even in two processes, see the same truth.
- **At most one copy.** :meth:`Executor.launch` is idempotent per ``(job_id, attempt)``:
  calling it again, from this or another executor object, returns the handle of the
  run already started and never starts a second copy. :meth:`Executor.reattach` never
  starts anything.
- **Non-blocking control.** :meth:`Executor.poll`, :meth:`Executor.preempt` and
  :meth:`Executor.cancel` return promptly; the grace period of a preemption runs
  outside the caller (in the supervisor or the Ray actor), so a server restart during
  the grace period does not stop the SIGKILL from coming. Control calls on a finished
  attempt are no-ops; so are repeated calls.
- **Final is final.** Once :meth:`Executor.poll` returned an :class:`ExitStatus` for a
  handle, every later call returns the same status.
- **Errors.** :class:`LaunchFailed` when an attempt cannot be started (nothing is left
  running then); :class:`~shamal.errors.InvalidParameter` for a malformed spec or
  handle. A job that disappears is not an exception: it is an ``ExitStatus`` with
  reason ``lost`` (or ``None`` from :meth:`Executor.reattach`).

Environment conventions (both executors): a worker starts from a clean, minimal
environment (a short allow-list of the server's variables such as ``PATH``, ``HOME`` and
the locale; never the server's ``SHAMAL_*`` secrets), then ``LaunchSpec.env``, then the
variables the platform owns, which win over ``LaunchSpec.env``:

- ``SHAMAL_JOB_ID``, ``SHAMAL_ATTEMPT``;
- ``CUDA_VISIBLE_DEVICES`` pinned per worker (an empty string for a worker without a
  GPU, so a CPU job cannot grab one) and ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so that GPU
  indices mean what NVML (and therefore the scheduler) means by them; each worker sees
  only its own GPUs and should use ``cuda:0`` (not ``cuda:$LOCAL_RANK``);
- ``SHAMAL_GPU_FRACTION`` for a fractional GPU (e.g. ``"0.25"``), so the training runtime
  can cap its memory;
- for gangs (more than one worker): ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``,
  ``RANK``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` as torchrun sets them.

``PYTHONUNBUFFERED=1`` is set by default (``LaunchSpec.env`` may override it) so that
logs stream while the job runs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from shamal.errors import InvalidParameter, ServiceUnavailable

if TYPE_CHECKING:
    from shamal.scheduler.core import Placement

__all__ = [
    "DISK_LIMIT",
    "OUT_OF_MEMORY",
    "REQUEUE_EXIT_CODE",
    "ExitReason",
    "ExitStatus",
    "Executor",
    "Handle",
    "LaunchFailed",
    "LaunchSpec",
]

REQUEUE_EXIT_CODE = 75
"""``EX_TEMPFAIL``: the exit code with which the training runtime says "I saved a
checkpoint after SIGTERM; run me again". An attempt ending with it has ``requeue=True``."""


OUT_OF_MEMORY = "out of memory"
"""The :attr:`ExitStatus.detail` of an attempt that failed because the kernel killed a
worker over its memory limit (where the executor can tell: a cgroup)."""


DISK_LIMIT = "disk limit exceeded"
"""The :attr:`ExitStatus.detail` of an attempt stopped because its working folder grew past
its executor's disk limit."""


class LaunchFailed(ServiceUnavailable):
    """The attempt could not be started; nothing of it is left running."""


class ExitReason(StrEnum):
    """Why an attempt ended."""

    SUCCEEDED = "succeeded"
    """Every worker exited 0."""
    FAILED = "failed"
    """A worker exited non-zero (or could not start) on its own; the gang was stopped."""
    TIMEOUT = "timeout"
    """The time limit passed: SIGTERM, the grace period, then SIGKILL."""
    PREEMPTED = "preempted"
    """:meth:`Executor.preempt` stopped it (``requeue`` is true)."""
    KILLED = "killed"
    """:meth:`Executor.cancel` stopped it."""
    LOST = "lost"
    """Its supervisor (or Ray actor) vanished without reporting; the outcome is unknown."""


@dataclass(frozen=True, slots=True)
class ExitStatus:
    """How an attempt ended.

    Attributes:
        reason: see :class:`ExitReason`.
        exit_codes: one per worker in rank order, with the ``subprocess`` convention:
            ``-N`` when killed by signal ``N``; ``None`` when unknown (lost) or never
            started; 127 (126) when the command was not found (not executable).
        requeue: true when the attempt should run again without counting as a failure:
            it was preempted by us, or it ended (not by timeout or cancel) with a worker
            exiting :data:`REQUEUE_EXIT_CODE`.
        culprit_rank: the worker whose own failure ended the gang, if any.
        detail: a short, human-readable explanation (no secrets).
    """

    reason: ExitReason
    exit_codes: tuple[int | None, ...] = ()
    requeue: bool = False
    culprit_rank: int | None = None
    detail: str = ""

    @property
    def exit_code(self) -> int | None:
        """The code that explains the outcome: the culprit's, else the first non-zero."""
        if self.culprit_rank is not None and self.culprit_rank < len(self.exit_codes):
            return self.exit_codes[self.culprit_rank]
        for code in self.exit_codes:
            if code != 0:
                return code
        return 0 if self.exit_codes else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "reason": self.reason.value,
            "exit_codes": list(self.exit_codes),
            "requeue": self.requeue,
            "culprit_rank": self.culprit_rank,
            "detail": self.detail,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExitStatus:
        """Rebuild a status written by :meth:`to_dict`; raises ``ValueError`` if malformed."""
        try:
            codes = tuple(None if c is None else int(c) for c in data["exit_codes"])
            culprit = data.get("culprit_rank")
            return cls(
                reason=ExitReason(data["reason"]),
                exit_codes=codes,
                requeue=bool(data["requeue"]),
                culprit_rank=None if culprit is None else int(culprit),
                detail=str(data.get("detail", "")),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed exit status: {exc}") from None


@dataclass(frozen=True)
class LaunchSpec:
    """One attempt of a placed job.

    Attributes:
        job_id: the job's id; with ``attempt`` it names the run (idempotency key).
        attempt: 0, 1, ... one per (re)start of the job.
        command: argv of every worker (no shell).
        workdir: the extracted code snapshot; workers start in it (the Ray executor
            ships a copy to the nodes unless told the folder is shared).
        env: variables added to the clean, minimal environment (see module docs).
        placement: one slot per worker, rank order. Its GPU indices pin
            ``CUDA_VISIBLE_DEVICES`` on the local executor; a MIG slot is pinned to its
            MIG device UUID (resolved with NVML on the node).
        log_path: the attempt's log file: combined stdout/stderr of all workers, lines
            prefixed ``[rank N] `` for gangs. The executor also keeps its small state
            files next to it (``<log>.status.json`` ...), so use one folder the server
            owns and one log path per attempt.
        time_limit_s: wall-clock limit per attempt, or ``None``.
        grace_s: seconds between SIGTERM and SIGKILL (time limit, gang failure, and
            preemption unless :meth:`Executor.preempt` gives another).
        device_ids: optional per-rank override of the device identifiers put in
            ``CUDA_VISIBLE_DEVICES`` (GPU index, ``GPU-...`` or ``MIG-...`` UUIDs), for
            callers that know better than the slot (local executor only; Ray assigns
            its own devices).
        tenant: whose code it is (the job's team, ``""`` for none): an executor with a
            sandbox runs it as that tenant's OS user.
        executor: the executor the job asked for (``local``, ``ray``), ``None`` for the
            server's default: an :class:`~shamal.executors.ExecutorSet` launches it there;
            a single executor ignores it.
    """

    job_id: str
    attempt: int
    command: tuple[str, ...]
    workdir: Path
    env: Mapping[str, str]
    placement: Placement
    log_path: Path
    time_limit_s: float | None = None
    grace_s: float = 30.0
    device_ids: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    tenant: str = ""
    executor: str | None = None

    def __post_init__(self) -> None:
        if not self.job_id or "/" in self.job_id or "\0" in self.job_id:
            raise InvalidParameter("job_id must be a non-empty name without '/'")
        if self.attempt < 0:
            raise InvalidParameter("attempt must be >= 0")
        if not self.command or not all(isinstance(arg, str) for arg in self.command):
            raise InvalidParameter("command must be a non-empty argv of strings")
        if not self.placement.slots:
            raise InvalidParameter("placement must have at least one slot")
        if self.time_limit_s is not None and self.time_limit_s <= 0:
            raise InvalidParameter("time_limit_s must be positive")
        if self.grace_s < 0:
            raise InvalidParameter("grace_s must be >= 0")

    @property
    def world_size(self) -> int:
        return len(self.placement.slots)


@dataclass(frozen=True)
class Handle:
    """A started attempt, persistable as JSON.

    ``data`` holds what the executor that made it needs to find the attempt again
    (JSON values only); callers treat it as opaque.
    """

    executor: str
    job_id: str
    attempt: int
    log_path: Path
    data: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "executor": self.executor,
                "job_id": self.job_id,
                "attempt": self.attempt,
                "log_path": str(self.log_path),
                "data": dict(self.data),
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> Handle:
        """Parse :meth:`to_json` output; raises ``InvalidParameter`` if malformed."""
        try:
            raw = json.loads(text)
            data = raw.get("data", {})
            if not isinstance(data, dict):
                raise TypeError("data is not an object")
            return cls(
                executor=str(raw["executor"]),
                job_id=str(raw["job_id"]),
                attempt=int(raw["attempt"]),
                log_path=Path(raw["log_path"]),
                data=data,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InvalidParameter(f"not an executor handle: {exc}") from None


def poll_until(
    poll: Callable[[Handle], ExitStatus | None],
    handle: Handle,
    timeout: float | None,
    *,
    first_delay: float,
    max_delay: float,
) -> ExitStatus | None:
    """Call ``poll`` with growing pauses until it answers or ``timeout`` seconds pass.

    What every executor's :meth:`Executor.wait` does; ``None`` at the deadline.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = first_delay
    while (status := poll(handle)) is None:
        if deadline is not None and time.monotonic() >= deadline:
            return None
        pause = delay if deadline is None else min(delay, deadline - time.monotonic())
        time.sleep(max(pause, 0.0))
        delay = min(delay * 1.5, max_delay)
    return status


class Executor(Protocol):
    """Runs placed jobs; see the module docstring for the shared contract."""

    @property
    def name(self) -> str:
        """The name it is registered under (``local``, ``ray``)."""
        ...

    def launch(self, spec: LaunchSpec) -> Handle:
        """Start every worker of the attempt; return once they are started.

        Idempotent per ``(job_id, attempt)``. Raises :class:`LaunchFailed` if the attempt
        cannot be started (a worker whose command does not exist is not that: it is a
        started attempt that fails with exit code 127).
        """
        ...

    def poll(self, handle: Handle) -> ExitStatus | None:
        """The attempt's final status, or ``None`` while any worker runs. Non-blocking."""
        ...

    def wait(self, handle: Handle, timeout: float | None = None) -> ExitStatus | None:
        """Poll until the attempt ends or ``timeout`` seconds pass (then ``None``)."""
        ...

    def preempt(self, handle: Handle, grace_s: float | None = None) -> None:
        """SIGTERM every worker's process group, SIGKILL after ``grace_s`` (default: the
        spec's). Non-blocking; the attempt then ends ``preempted`` with ``requeue=True``
        (or ``succeeded`` if every worker exits 0)."""
        ...

    def cancel(self, handle: Handle) -> None:
        """Stop the attempt for good (SIGTERM, a short grace, SIGKILL). Non-blocking;
        it then ends ``killed`` with ``requeue=False``."""
        ...

    def reattach(self, handle_json: str) -> Handle | None:
        """Find a stored attempt again (after a server restart).

        Returns the handle when the attempt still runs or has a final status to read,
        ``None`` when it is gone without one: the caller reports it ``lost``. Any
        remains of a lost attempt are stopped first, so a retry cannot overlap it.
        Raises ``InvalidParameter`` for a malformed handle or another executor's.
        """
        ...

    def close(self) -> None:
        """Release client resources (connections). Never stops running attempts."""
        ...
