"""Scheduling policies, chosen by name.

Each policy is a small class on top of :class:`~shamal.scheduler.core._engine.BasePolicy`:
it says how the queue is ordered, when one job may preempt another and (for the
simulator's speed) how running jobs are ordered as victims. ``decide(state, now)`` is a
pure function of the state and the clock; the live scheduler and the simulator call the
same object.

=============== =====================================================================
``fifo``        submission order, head-of-line blocking (what users get today);
                ignores priority classes
``priority``    priority class, then submission; higher classes preempt lower ones
``fair``        weighted fair share: the team with the least decayed usage per weight
                goes first (then submission order)
``sjf-oracle``  shortest true runtime first (simulation only: needs ``oracle_s``)
``srtf-oracle`` shortest true remaining time first, preemptive (simulation only)
``predicted-sjf`` shortest predicted runtime first (``predicted_s`` from the runtime
                predictor; jobs without a prediction go last)
``las``         least attained GPU-service first (Tiresias' discretized 2D-LAS):
                preemptive, needs no prediction. The default.
``backfill``    EASY backfill: submission order; while the first waiting job holds a
                reservation, later jobs start if their predicted end is before it (or
                they use GPUs it does not need)
=============== =====================================================================

Every policy but ``fifo`` orders by priority class first and lets a class with
``preempts=True`` preempt lower classes (``backfill`` never preempts for priority).
Every policy reclaims borrowed team quota by preemption.

Options (``get_policy(name, **options)``; the server's ``SHAMAL_SCHEDULER__POLICY_OPTIONS``):

* every policy: ``min_run_s``, seconds a (re)started job is protected from preemption,
  for priority, for its level and for reclaim (default 300; ``srtf-oracle``: 0);
* ``fifo``: ``strict`` (head-of-line blocking, default true);
* ``fair``: ``charge_s`` (seconds of usage a start adds per GPU within a round, 3600);
* ``las``: ``thresholds`` (queue boundaries in GPU-seconds, default 3600, 36000);
* ``backfill``: ``max_candidates`` (waiting jobs examined for backfill per round, 200).

``sjf-oracle`` and ``srtf-oracle`` need each job's true runtime, which only a trace
knows: :func:`get_policy` (the live scheduler) refuses them; the simulator builds its
policy with :func:`simulation_policy`.
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Sequence
from typing import Any

from shamal.scheduler.core._engine import BasePolicy, Key, Round
from shamal.scheduler.core._state import SchedJob

__all__ = [
    "DEFAULT_POLICY",
    "Backfill",
    "FairShare",
    "Fifo",
    "LeastAttainedService",
    "PredictedSjf",
    "PriorityFifo",
    "SjfOracle",
    "SrtfOracle",
    "SIMULATION_ONLY",
    "get_policy",
    "policy_defaults",
    "policy_names",
    "policy_options",
    "policy_summary",
    "simulation_policy",
]

_INF = math.inf


def _protection(min_run_s: float) -> float:
    try:
        value = float(min_run_s)
    except (TypeError, ValueError):
        value = math.nan
    if not value >= 0 or math.isinf(value):
        raise ValueError(f"min_run_s must be a number of seconds >= 0, not {min_run_s!r}")
    return value


def _oracle(job: SchedJob, policy: str) -> float:
    if job.oracle_s is None:
        raise ValueError(
            f"policy {policy!r} needs each job's true runtime (SchedJob.oracle_s): it is "
            f"for the simulator only; job {job.id!r} has none"
        )
    return job.oracle_s


class Fifo(BasePolicy):
    """First in, first out with head-of-line blocking; no preemption, classes ignored."""

    name = "fifo"
    class_aware = False
    strict = True
    description = "submission order, head-of-line blocking"

    def __init__(self, *, strict: bool = True, min_run_s: float = 300.0) -> None:
        self.strict = bool(strict)
        self.min_run_s = _protection(min_run_s)


class PriorityFifo(BasePolicy):
    """Priority class first, then submission order; higher classes preempt lower ones."""

    name = "priority"
    description = "priority class, then submission order; classes preempt lower ones"

    def __init__(self, *, min_run_s: float = 300.0) -> None:
        self.min_run_s = _protection(min_run_s)


class FairShare(BasePolicy):
    """Weighted fair share among teams by decayed past usage.

    A team's score is (decayed past usage + GPUs it holds x ``charge_s``) / weight;
    the waiting job of the team with the lowest score goes next, and each start in the
    round adds its GPUs x ``charge_s`` to its team's score. Within a team: priority
    class, then submission order.
    """

    name = "fair"
    dynamic_merge = True
    description = "weighted fair share among teams by decayed usage"

    def __init__(self, *, charge_s: float = 3600.0, min_run_s: float = 300.0) -> None:
        self.charge_s = float(charge_s)
        self.min_run_s = _protection(min_run_s)

    def merge_key(self, job: SchedJob, rnd: Round) -> Key:
        return (-job.priority.value, self._score(job.team, rnd), job.submitted_at, job.id)

    def _score(self, team: str, rnd: Round) -> float:
        scores: dict[str, float] | None = rnd.extra.get("fair_scores")
        if scores is None:
            scores = {}
            for (t, _), amount in rnd.state.allocated_by_team().items():
                scores[t] = scores.get(t, 0.0) + amount.gpu_milli / 1000 * self.charge_s
            rnd.extra["fair_scores"] = scores
            rnd.extra["fair_counted"] = 0
        counted: int = rnd.extra["fair_counted"]
        for started in rnd.started[counted:]:
            scores[started.team] = scores.get(started.team, 0.0) + started.gpus * self.charge_s
        rnd.extra["fair_counted"] = len(rnd.started)
        weight = rnd.book.weight(team) if rnd.book is not None else 1.0
        usage = rnd.state.usage.get(team, 0.0)
        return (usage + scores.get(team, 0.0)) / max(weight, 1e-9)


class SjfOracle(BasePolicy):
    """Shortest true runtime first, non-preemptive (simulation only)."""

    name = "sjf-oracle"
    needs = "oracle"
    description = "shortest true runtime first (simulation only)"

    def __init__(self, *, min_run_s: float = 300.0) -> None:
        self.min_run_s = _protection(min_run_s)

    def order_key(self, job: SchedJob) -> Key:
        return (-job.priority.value, _oracle(job, self.name), job.submitted_at, job.id)


class SrtfOracle(BasePolicy):
    """Shortest true remaining time first, preemptive (simulation only)."""

    name = "srtf-oracle"
    needs = "oracle"
    preemptive = True
    description = "shortest true remaining time first, preemptive (simulation only)"

    def __init__(self, *, min_run_s: float = 0.0) -> None:
        self.min_run_s = _protection(min_run_s)

    def order_key(self, job: SchedJob) -> Key:
        remaining = _oracle(job, self.name) - job.attained_s
        return (-job.priority.value, remaining, job.submitted_at, job.id)

    def level(self, job: SchedJob, now: float) -> Any:
        return _oracle(job, self.name) - job.attained_at(now)

    def run_key(self, job: SchedJob, now: float) -> Key:
        # now + remaining is the job's finish time: constant while it runs.
        finish = now + _oracle(job, self.name) - job.attained_at(now)
        return (job.priority.value, -finish, job.id)


class PredictedSjf(BasePolicy):
    """Shortest predicted runtime first, non-preemptive (no prediction: last)."""

    name = "predicted-sjf"
    needs = "prediction"
    description = "shortest predicted runtime first"

    def __init__(self, *, min_run_s: float = 300.0) -> None:
        self.min_run_s = _protection(min_run_s)

    def order_key(self, job: SchedJob) -> Key:
        predicted = job.predicted_s if job.predicted_s is not None else _INF
        return (-job.priority.value, predicted, job.submitted_at, job.id)


DEFAULT_LAS_THRESHOLDS = (3600.0, 36_000.0)
"""Queue boundaries of :class:`LeastAttainedService` in GPU-seconds of attained service."""


class LeastAttainedService(BasePolicy):
    """Discretized least-attained-service with preemption (Tiresias' 2D-LAS).

    A job's level is the number of ``thresholds`` (GPU-seconds: attained seconds x
    GPUs) its attained service has passed. Lower levels go first (submission order
    within a level) and a waiting job preempts running jobs of a strictly higher level
    of its class when it can then start. Attained service only grows, so a job that
    was preempted cannot preempt back the job that displaced it; ``min_run_s``
    protects a freshly (re)started job.
    """

    name = "las"
    preemptive = True
    description = "least attained GPU-service first, preemptive (Tiresias 2D-LAS)"

    def __init__(
        self,
        *,
        thresholds: Sequence[float] = DEFAULT_LAS_THRESHOLDS,
        min_run_s: float = 300.0,
    ) -> None:
        self.thresholds = tuple(sorted(float(t) for t in thresholds))
        if any(t <= 0 for t in self.thresholds):
            raise ValueError("LAS thresholds must be positive GPU-seconds")
        self.min_run_s = _protection(min_run_s)

    def _queue(self, service: float) -> int:
        level = 0
        for threshold in self.thresholds:
            if service >= threshold:
                level += 1
            else:
                break
        return level

    def order_key(self, job: SchedJob) -> Key:
        service = job.attained_s * max(job.gpus, 1e-3)
        return (-job.priority.value, self._queue(service), job.submitted_at, job.id)

    def level(self, job: SchedJob, now: float) -> Any:
        return self._queue(job.attained_at(now) * max(job.gpus, 1e-3))

    def run_key(self, job: SchedJob, now: float) -> Key:
        return (job.priority.value, -self.level(job, now), -job.submitted_at, job.id)

    def revisit_at(self, job: SchedJob, now: float) -> float | None:
        soonest = super().revisit_at(job, now)
        gpus = max(job.gpus, 1e-3)
        service = job.attained_at(now) * gpus
        for threshold in self.thresholds:
            if service < threshold:
                crossing = now + (threshold - service) / gpus + 1e-3
                return crossing if soonest is None else min(soonest, crossing)
        return soonest


class Backfill(BasePolicy):
    """EASY backfill with predicted runtimes; never preempts.

    Jobs start in submission order (class first). The first job that cannot start gets
    a reservation: the predicted time (``shadow``) when enough GPUs will be free, from
    the predicted ends of running jobs. Later jobs then start only if they fit now and
    are predicted to end before the shadow time, or use GPUs the reserved job will not
    need (``extra``). A running job past its prediction is assumed to end now; a job
    without a prediction is assumed to run forever (it is never backfilled). At most
    ``max_candidates`` waiting jobs that fit are examined for backfill per round (like
    Slurm's ``bf_max_job_test``), so a round stays cheap with a long queue.
    """

    name = "backfill"
    needs = "prediction"
    class_preemption = False
    description = "EASY backfill using predicted runtimes"

    def __init__(self, *, max_candidates: int = 200, min_run_s: float = 300.0) -> None:
        self.max_candidates = int(max_candidates)
        self.min_run_s = _protection(min_run_s)

    @staticmethod
    def _predicted_end(job: SchedJob, now: float) -> float:
        if job.predicted_s is None:
            return _INF
        return now + max(job.predicted_s - job.attained_at(now), 0.0)

    def run_key(self, job: SchedJob, now: float) -> Key:
        return (self._predicted_end(job, now), job.id)

    def walk(self, rnd: Round) -> None:
        walk = rnd.queue_walk()
        now = rnd.now
        shadow: float | None = None
        extra = free = 0.0
        examined = 0
        while (job := walk.peek()) is not None:
            if shadow is None:
                if rnd.try_start(job):
                    walk.advance()
                else:
                    shadow, extra = self._reserve(rnd, job)
                    free = self._free_gpus(rnd)
                    walk.drop()
                continue
            gpus = job.gpus
            if gpus > free + 1e-9:
                walk.drop()  # does not fit now; neither does the rest of its shape group
                continue
            examined += 1
            if examined > self.max_candidates:
                break
            end = now + job.predicted_s if job.predicted_s is not None else _INF
            if end > shadow and gpus > extra:
                walk.advance()  # too long for the gap; a shorter one of its shape may fit
                continue
            if not rnd.try_start(job):
                walk.drop()
                continue
            free -= gpus
            if end > shadow:
                extra -= gpus
            walk.advance()

    @staticmethod
    def _free_gpus(rnd: Round) -> float:
        free = sum(r.gpu_milli for r in rnd.state.free_by_pool().values()) / 1000
        return free - sum(job.gpus for job in rnd.started)

    def _reserve(self, rnd: Round, head: SchedJob) -> tuple[float, float]:
        """(shadow time, extra GPUs) of the reservation for ``head``."""
        now = rnd.now
        free = self._free_gpus(rnd)
        need = head.gpus
        running = rnd.running()
        if rnd.state.ordered_by != self.name:
            running = sorted(running, key=lambda j: self._predicted_end(j, now))
        for job in running:
            if job.id in rnd.preempted:
                continue
            free += job.gpus
            if free >= need:
                return max(self._predicted_end(job, now), now), free - need
        return _INF, 0.0


# ----------------------------------------------------------------- registry

_REGISTRY: dict[str, str] = {
    "fifo": "shamal.scheduler.core._policies:Fifo",
    "priority": "shamal.scheduler.core._policies:PriorityFifo",
    "fair": "shamal.scheduler.core._policies:FairShare",
    "sjf-oracle": "shamal.scheduler.core._policies:SjfOracle",
    "srtf-oracle": "shamal.scheduler.core._policies:SrtfOracle",
    "predicted-sjf": "shamal.scheduler.core._policies:PredictedSjf",
    "las": "shamal.scheduler.core._policies:LeastAttainedService",
    "backfill": "shamal.scheduler.core._policies:Backfill",
}
"""Policy name -> ``"module:attribute"`` of its class, imported on first use."""

DEFAULT_POLICY = "las"
"""The policy the scheduler and the simulator use unless told otherwise."""


SIMULATION_ONLY = ("sjf-oracle", "srtf-oracle")
"""Policies that need each job's true runtime: only a trace knows it (``shamal sim``)."""


def policy_names(*, simulation: bool = False) -> list[str]:
    """The policy names the live scheduler takes; with ``simulation``, every one
    (the simulation-only oracles too)."""
    return [name for name in _REGISTRY if simulation or name not in SIMULATION_ONLY]


def policy_options(name: str) -> list[str]:
    """The options the policy called ``name`` takes (see the module docstring).

    Raises:
        ValueError: unknown name.
    """
    return list(inspect.signature(_policy_class(name, simulation=True)).parameters)


def policy_defaults(name: str) -> dict[str, Any]:
    """Each option of the policy called ``name`` and its default value.

    Raises:
        ValueError: unknown name.
    """
    parameters = inspect.signature(_policy_class(name, simulation=True)).parameters
    return {key: parameter.default for key, parameter in parameters.items()}


def policy_summary(name: str) -> str:
    """The first line of the policy's description (its class docstring).

    Raises:
        ValueError: unknown name.
    """
    doc = inspect.getdoc(_policy_class(name, simulation=True)) or ""
    return doc.split("\n", 1)[0]


def _policy_class(name: str, *, simulation: bool) -> type[BasePolicy]:
    target = _REGISTRY.get(name)
    if target is None or (name in SIMULATION_ONLY and not simulation):
        names = ", ".join(policy_names(simulation=simulation))
        if target is None:
            raise ValueError(f"unknown policy {name!r}; choose one of: {names}")
        raise ValueError(
            f"policy {name!r} needs each job's true runtime, which only a trace knows: it is "
            f"for `shamal sim` only; the live scheduler takes one of: {names}"
        )
    module_name, _, attribute = target.partition(":")
    cls: type[BasePolicy] = getattr(importlib.import_module(module_name), attribute)
    return cls


def get_policy(name: str, **options: Any) -> BasePolicy:
    """A fresh policy for the live scheduler by name; ``options`` go to its constructor.

    Args:
        name: one of :func:`policy_names` (the simulation-only oracles are refused).
        options: the policy's options (:func:`policy_options`, e.g. ``min_run_s``).

    Raises:
        ValueError: unknown name, a simulation-only policy, an option the policy does
            not take or a bad value (the message says which, and what is allowed).
    """
    return _build(name, options, simulation=False)


def simulation_policy(name: str, **options: Any) -> BasePolicy:
    """:func:`get_policy` for the trace simulator: every policy, the oracles too.

    Raises:
        ValueError: as :func:`get_policy`.
    """
    return _build(name, options, simulation=True)


def _build(name: str, options: dict[str, Any], *, simulation: bool) -> BasePolicy:
    cls = _policy_class(name, simulation=simulation)
    accepted = policy_options(name)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        takes = ", ".join(accepted) if accepted else "none"
        raise ValueError(
            f"policy {name!r} takes no option {', '.join(map(repr, unknown))}; its options: {takes}"
        )
    try:
        policy: BasePolicy = cls(**options)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"policy {name!r}: {exc}") from None
    return policy
