"""The event-driven trace simulator: the live scheduler's policies, admission and
placement, replayed over a trace.

Each decision comes from the same ``policy.decide(state, now)`` the live scheduler
calls, with the same admission (:mod:`shamal.scheduler.core._admission`) and placement
(:mod:`shamal.scheduler.core._placement`) code; the simulator only plays the part of the
database and the executors: it applies the decisions, advances the clock to the next
event and keeps the books.

Events are job arrivals, job completions and *revisits* (the policy's
``revisit_at``: e.g. a running job's attained service crossing a LAS threshold, or
its start protection ending). Events at the same instant are coalesced and the policy
runs once per instant, only when something changed and jobs are waiting. The state the
policy sees is kept incrementally: the queue grouped by job shape with each group in the
policy's order, the running jobs in its victim order (``SchedulerState.ordered_by``),
free capacity and per-team holdings, so a round costs little even with thousands of jobs
waiting.

Modelling choices (all of them affect the figures, so they are stated here):

* **Every job of the trace runs**, failed and cancelled ones included, for its
  ``duration_s``. A job that cannot fit the cluster (or its team's quota) even when
  idle is *rejected* at arrival and counted in ``jobs_rejected``.
* **Preemption has a cost**: a preempted job keeps its progress (it checkpoints in the
  grace period) but must run ``preemption_cost_s`` more seconds when it resumes
  (restore and warm-up), holding its GPUs meanwhile.
* **JCT** = finish - submission. **Queueing delay** = JCT - the time the job spent
  running (restores included), so time spent preempted counts as waiting.
* **GPU utilization** = GPU-seconds held by running jobs (restores included) /
  (cluster GPUs x makespan); ``None`` on a cluster without GPUs (there is nothing to
  utilize), 0 when no job finished. **Makespan** = last finish - first submission.
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from array import array
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from shamal.scheduler.core._admission import Admission, QuotaBook, decayed_usage
from shamal.scheduler.core._engine import BasePolicy
from shamal.scheduler.core._placement import allocate, place, release
from shamal.scheduler.core._policies import DEFAULT_POLICY, simulation_policy
from shamal.scheduler.core._predictor import ErrorTracker, JobRecord, RuntimePredictor
from shamal.scheduler.core._resources import (
    GPU_MILLI,
    Cluster,
    Gpu,
    Node,
    Placement,
    Request,
    Resources,
)
from shamal.scheduler.core._state import (
    DEFAULT_PREEMPTION_COST_S,
    Decision,
    JobPhase,
    Preempt,
    PriorityClass,
    SchedJob,
    SchedulerState,
    Start,
    TeamQuota,
    job_pool,
    job_shape,
)
from shamal.scheduler.core.sim._trace import TraceJob, gang_request

__all__ = [
    "DEFAULT_PREEMPTION_COST_S",
    "NORMAL",
    "SimOptions",
    "SimResult",
    "Simulator",
    "simulate",
]

NORMAL = PriorityClass("normal", 0)
"""The priority class of trace jobs."""

_FINISH = 0
_REVISIT = 1

Progress = Callable[[int, int], None]


@dataclass
class SimResult:
    """What a simulation produced: the metrics, and per-job and timeline arrays."""

    metrics: dict[str, Any]
    times: np.ndarray
    """Instants of the timeline (seconds from the first submission)."""
    queue_length: np.ndarray
    """Jobs waiting after the decisions at each instant."""
    busy_gpus: np.ndarray
    """GPUs held by running jobs after the decisions at each instant."""
    total_gpus: float
    jobs: dict[str, np.ndarray] = field(default_factory=dict)
    """Per job: ``submit``, ``first_start``, ``finish``, ``run_s``, ``preemptions``."""


class _UsageView(Mapping[str, float]):
    """Each team's decayed usage (GPU-seconds) at one instant, computed on access."""

    def __init__(self, sim: Simulator, now: float) -> None:
        self._sim = sim
        self._now = now

    def __getitem__(self, team: str) -> float:
        value, since = self._sim._usage[team]
        rate = self._sim._rate.get(team, 0.0)
        return decayed_usage(value, self._now - since, rate, self._sim.usage_half_life_s)

    def __iter__(self) -> Iterator[str]:
        return iter(self._sim._usage)

    def __len__(self) -> int:
        return len(self._sim._usage)


def _empty_copy(cluster: Cluster) -> Cluster:
    """A cluster with the same nodes, all free (to tell impossible jobs at arrival)."""
    nodes = [
        Node(
            name=n.name,
            pool=n.pool,
            cpu_milli=n.cpu_milli,
            memory_mib=n.memory_mib,
            gpus=[
                Gpu(g.index, g.model, g.memory_mib, g.uuid, GPU_MILLI, g.mig_slices, 0)
                for g in n.gpus
            ],
            labels=n.labels,
        )
        for n in cluster.nodes.values()
    ]
    return Cluster.of(cluster.pools.values(), nodes)


@dataclass(frozen=True)
class SimOptions:
    """How a simulation models and records (all optional).

    Attributes:
        preemption_cost_s: restore seconds a preempted job adds when it resumes.
        quotas: team quotas by (team, pool); empty: no quotas.
        usage_half_life_s: half-life of the decayed usage fair share sees.
        record_timeline: keep queue length and busy GPUs per instant (for plots).
        record_decisions: keep every applied decision in :attr:`Simulator.log` as
            ``(time, "start" | "preempt", job id)`` (for tests and debugging).
    """

    preemption_cost_s: float = DEFAULT_PREEMPTION_COST_S
    quotas: Mapping[tuple[str, str], TeamQuota] | None = None
    usage_half_life_s: float = 7 * 86_400.0
    record_timeline: bool = True
    record_decisions: bool = False


class Simulator:
    """Replays trace jobs on a cluster through a policy; :meth:`run` once.

    Args:
        jobs: the trace (any order; sorted by submission here).
        cluster: the machines; must be idle (the simulator allocates on it).
        policy: a registered name or a policy object.
        predictor: the runtime predictor fed online (predict at arrival, learn at
            finish); created when the policy needs predictions and none is given.
        progress: called as ``progress(finished, total)`` now and then.
        options: :class:`SimOptions`; keyword arguments named like its fields
            (``preemption_cost_s=30``, ``quotas=...``) override them.
    """

    def __init__(
        self,
        jobs: Sequence[TraceJob],
        cluster: Cluster,
        *,
        policy: str | BasePolicy = DEFAULT_POLICY,
        predictor: RuntimePredictor | None = None,
        progress: Progress | None = None,
        options: SimOptions | None = None,
        **overrides: Any,
    ) -> None:
        options = replace(options or SimOptions(), **overrides)
        if options.preemption_cost_s < 0:
            raise ValueError("the preemption cost must be >= 0 seconds")
        self.options = options
        self.policy = simulation_policy(policy) if isinstance(policy, str) else policy
        self.cluster = cluster
        self.preemption_cost_s = options.preemption_cost_s
        self.quotas = dict(options.quotas or {})
        self.usage_half_life_s = options.usage_half_life_s
        self.log: list[tuple[float, str, str]] | None = [] if options.record_decisions else None
        self.progress = progress
        if predictor is None and self.policy.needs == "prediction":
            predictor = RuntimePredictor()
        self.predictor = predictor
        self._tracker = ErrorTracker()
        self._trace = sorted(jobs, key=lambda j: j.submit_s)
        self.jobs = self._sched_jobs(self._trace)
        self._index = {job.id: i for i, job in enumerate(self.jobs)}
        self._per_job_books(len(self.jobs))
        # Incremental state the policy sees.
        self._queued: dict[str, SchedJob] = {}
        self._gkeys: dict[Hashable, list[Any]] = {}
        self._gjobs: dict[Hashable, list[SchedJob]] = {}
        self._rkeys: list[Any] = []
        self._rjobs: list[SchedJob] = []
        self._free: dict[str, Resources] = {}
        self._held: dict[tuple[str, str], Resources] = {}
        self._usage: dict[str, tuple[float, float]] = {}
        self._rate: dict[str, float] = {}
        self._busy_gpus = 0.0
        self._heap: list[tuple[float, int, int, int, int]] = []
        self._seq = 0
        self._feasible: dict[tuple[Request, str | None], bool] = {}
        self._empty: Cluster | None = None
        self._timeline = (array("d"), array("d"), array("d"))
        self._next_arrival = 0
        self.finished = 0
        self.events = 0
        self.policy_calls = 0
        self.decisions = 0
        self.preemptions = 0
        self._ran = False

    def _per_job_books(self, n: int) -> None:
        """Per-job bookkeeping, indexed like :attr:`jobs`."""
        self._attempt = [0] * n
        self._shape: list[Hashable] = [None] * n
        self._qkey: list[Any] = [None] * n
        self._rkey: list[Any] = [None] * n
        self._predicted: list[float | None] = [None] * n
        self._first_start = np.full(n, np.nan)
        self._finish = np.full(n, np.nan)
        self._run_s = np.zeros(n)
        self._preemptions = np.zeros(n, dtype=np.int64)
        self._rejected = np.zeros(n, dtype=bool)

    def _sched_jobs(self, trace: Sequence[TraceJob]) -> list[SchedJob]:
        """The scheduler's view of each trace job (gangs for jobs wider than a node)."""
        node_gpus = sorted({len(n.gpus) for n in self.cluster.nodes.values()})
        by_shape: dict[tuple[float, float | None, int | None], Request] = {}
        jobs: list[SchedJob] = []
        seen: set[str] = set()
        for tj in trace:
            shape = (tj.gpus, tj.cpus, tj.memory_mib)
            request = by_shape.get(shape)
            if request is None:
                request = by_shape[shape] = gang_request(tj, node_gpus)
            job_id = tj.id if tj.id not in seen else f"{tj.id}#{len(jobs)}"
            seen.add(job_id)
            jobs.append(
                SchedJob(
                    id=job_id,
                    team=tj.team,
                    request=request,
                    submitted_at=tj.submit_s,
                    priority=NORMAL,
                    user=tj.user,
                    fingerprint=tj.job_type,
                    oracle_s=tj.duration_s,
                )
            )
        return jobs

    # ------------------------------------------------------------- the loop
    def run(self) -> SimResult:
        """Simulate every job to completion; returns the result."""
        if self._ran:
            raise RuntimeError("a Simulator runs once; make a new one")
        self._ran = True
        started = time.perf_counter()
        for node in self.cluster.nodes.values():
            capacity = Resources(
                node.free_cpu_milli, node.free_memory_mib, sum(g.free_milli for g in node.gpus)
            )
            self._free[node.pool] = self._free.get(node.pool, Resources()) + capacity
        jobs, heap = self.jobs, self._heap
        n = len(jobs)
        next_report = 0
        while self._next_arrival < n or heap:
            now = jobs[self._next_arrival].submitted_at if self._next_arrival < n else math.inf
            if heap and heap[0][0] < now:
                now = heap[0][0]
            if self._events_at(now):
                if self._queued:
                    self._decide(now)
                if self.options.record_timeline:
                    times, queue_len, busy = self._timeline
                    times.append(now)
                    queue_len.append(len(self._queued))
                    busy.append(self._busy_gpus)
            if self.progress is not None and self.finished >= next_report:
                self.progress(self.finished, n)
                next_report = self.finished + max(1, n // 200)
        if self.progress is not None:
            self.progress(self.finished, n)
        return self._result(time.perf_counter() - started)

    def _events_at(self, now: float) -> bool:
        """Process every event at ``now`` (completions and revisits, then arrivals);
        whether anything changed."""
        heap, jobs = self._heap, self.jobs
        changed = False
        while heap and heap[0][0] <= now:
            _, _, kind, i, attempt = heapq.heappop(heap)
            if attempt != self._attempt[i]:
                continue  # the attempt it was for ended (preempted or finished)
            self.events += 1
            changed = True
            if kind == _FINISH:
                self._complete(i, now)
            else:
                self._revisit(i, now)
        n = len(jobs)
        while self._next_arrival < n and jobs[self._next_arrival].submitted_at <= now:
            self.events += 1
            if self._arrive(self._next_arrival, now):
                changed = True
            self._next_arrival += 1
        return changed

    def _decide(self, now: float) -> None:
        """One round of the policy on the current state; apply its decisions."""
        policy = self.policy
        state = SchedulerState(
            cluster=self.cluster,
            queued=self._queued.values(),
            running=self._rjobs,
            quotas=self.quotas,
            usage=_UsageView(self, now),
            ordered_by=policy.name,
            free=self._free,
            allocated=self._held,
            queue_groups=self._gjobs.values(),
            stopping=(),  # preemptions take effect at once here
        )
        decisions = policy.decide(state, now)
        self.policy_calls += 1
        if decisions:
            self._apply(decisions, now)

    # ------------------------------------------------------------- events
    def _arrive(self, i: int, now: float) -> bool:
        """Queue job ``i``; ``False`` when it can never run (rejected)."""
        job = self.jobs[i]
        if not self._can_ever_run(job):
            self._rejected[i] = True
            self.finished += 1
            return False
        if self.predictor is not None:
            predicted = self.predictor.predict(job)
            job.predicted_s = predicted
            self._predicted[i] = predicted
        self._shape[i] = job_shape(job)
        if job.team not in self._usage:
            self._usage[job.team] = (0.0, now)
        self._enqueue(i, job)
        return True

    def _complete(self, i: int, now: float) -> None:
        job = self.jobs[i]
        self._stop(i, job, now)
        self._finish[i] = now
        self.finished += 1
        if self.predictor is not None:
            duration = self._trace[i].duration_s
            self._tracker.add(self._predicted[i], duration)
            self.predictor.update(JobRecord.of(job, duration, now))

    def _revisit(self, i: int, now: float) -> None:
        job = self.jobs[i]
        key = self.policy.run_key(job, now)
        if key != self._rkey[i]:
            self._unrun(i)
            self._run(i, job, key)
        self._push_revisit(i, job, now)

    # ------------------------------------------------------------- decisions
    def _apply(self, decisions: list[Decision], now: float) -> None:
        index = self._index
        for decision in decisions:
            i = index[decision.job_id]
            job = self.jobs[i]
            if isinstance(decision, Preempt):
                if job.phase is not JobPhase.RUNNING:
                    raise RuntimeError(f"policy preempted {job.id}, which is not running")
                self._preempt(i, job, now)
                if self.log is not None:
                    self.log.append((now, "preempt", job.id))
            elif isinstance(decision, Start):
                if job.id not in self._queued:
                    raise RuntimeError(f"policy started {job.id}, which is not queued")
                self._start(i, job, decision.placement, decision.borrowed, now)
                if self.log is not None:
                    self.log.append((now, "start", job.id))
            self.decisions += 1

    def _start(
        self, i: int, job: SchedJob, placement: Placement, borrowed: bool, now: float
    ) -> None:
        allocate(self.cluster, placement)
        self._dequeue(i, job)
        job.phase = JobPhase.RUNNING
        job.placement = placement
        job.started_at = now
        job.attained_as_of = now
        job.borrowed = borrowed
        if math.isnan(self._first_start[i]):
            self._first_start[i] = now
        self._hold(job, now, +1)
        self._run(i, job, self.policy.run_key(job, now))
        self._attempt[i] += 1
        assert job.oracle_s is not None  # noqa: S101 - the simulator sets it
        self._push(now + max(job.oracle_s - job.attained_s, 0.0), _FINISH, i)
        self._push_revisit(i, job, now)

    def _preempt(self, i: int, job: SchedJob, now: float) -> None:
        self._stop(i, job, now)
        job.preemptions += 1
        job.last_preempted_at = now
        assert job.oracle_s is not None  # noqa: S101 - the simulator sets it
        job.oracle_s += self.preemption_cost_s
        self._preemptions[i] += 1
        self.preemptions += 1
        self._enqueue(i, job)

    def _stop(self, i: int, job: SchedJob, now: float) -> None:
        """Take a running job off the cluster (finished or preempted)."""
        assert job.placement is not None
        assert job.started_at is not None
        release(self.cluster, job.placement)
        self._unrun(i)
        self._hold(job, now, -1)
        ran = now - job.started_at
        self._run_s[i] += ran
        job.attained_s += ran
        job.attained_as_of = None
        job.placement = None
        job.started_at = None
        job.phase = JobPhase.QUEUED
        self._attempt[i] += 1

    # ------------------------------------------------------------- bookkeeping
    def _push(self, at: float, kind: int, i: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, kind, i, self._attempt[i]))

    def _push_revisit(self, i: int, job: SchedJob, now: float) -> None:
        at = self.policy.revisit_at(job, now)
        if at is not None and at > now:
            self._push(at, _REVISIT, i)

    def _enqueue(self, i: int, job: SchedJob) -> None:
        key = self.policy.order_key(job)
        self._qkey[i] = key
        shape = self._shape[i]
        keys = self._gkeys.get(shape)
        if keys is None:
            self._gkeys[shape] = [key]
            self._gjobs[shape] = [job]
        else:
            at = bisect.bisect(keys, key)
            keys.insert(at, key)
            self._gjobs[shape].insert(at, job)
        self._queued[job.id] = job

    def _dequeue(self, i: int, job: SchedJob) -> None:
        shape = self._shape[i]
        keys = self._gkeys[shape]
        at = bisect.bisect_left(keys, self._qkey[i])
        del keys[at]
        del self._gjobs[shape][at]
        if not keys:
            del self._gkeys[shape]
            del self._gjobs[shape]
        del self._queued[job.id]

    def _run(self, i: int, job: SchedJob, key: Any) -> None:
        self._rkey[i] = key
        at = bisect.bisect(self._rkeys, key)
        self._rkeys.insert(at, key)
        self._rjobs.insert(at, job)

    def _unrun(self, i: int) -> None:
        at = bisect.bisect_left(self._rkeys, self._rkey[i])
        del self._rkeys[at]
        del self._rjobs[at]

    def _hold(self, job: SchedJob, now: float, sign: int) -> None:
        """Count (sign +1) or stop counting (-1) what a running job holds."""
        total = job.request.total
        delta = total if sign > 0 else Resources() - total
        pool = job_pool(self.cluster, job)
        self._free[pool] = self._free[pool] - delta
        key = (job.team, pool)
        self._held[key] = self._held.get(key, Resources()) + delta
        gpus = job.gpus * sign
        self._busy_gpus += gpus
        team = job.team
        value, since = self._usage.get(team, (0.0, now))
        rate = self._rate.get(team, 0.0)
        self._usage[team] = (
            decayed_usage(value, now - since, rate, self.usage_half_life_s),
            now,
        )
        self._rate[team] = rate + gpus

    def _can_ever_run(self, job: SchedJob) -> bool:
        key = (job.request, job.pool)
        fits = self._feasible.get(key)
        if fits is None:
            if self._empty is None:
                self._empty = _empty_copy(self.cluster)
            fits = self._feasible[key] = place(self._empty, job.request, pool=job.pool) is not None
        if fits and self.quotas:
            book = QuotaBook(self.quotas, {})
            pool = job_pool(self.cluster, job)
            fits = not pool or book.admit(job, pool) is not Admission.NEVER
        return fits

    # ------------------------------------------------------------- results
    def _result(self, elapsed: float) -> SimResult:
        total_gpus = self.cluster.capacity().gpu_milli / GPU_MILLI
        times, queue_len, busy = (np.frombuffer(a) for a in self._timeline)
        submit = np.array([j.submitted_at for j in self.jobs], dtype=float)
        gpus = np.array([j.gpus for j in self.jobs], dtype=float)
        done = ~np.isnan(self._finish)
        jct = self._finish[done] - submit[done]
        queue = jct - self._run_s[done]
        metrics: dict[str, Any] = {
            "policy": self.policy.name,
            "jobs": len(self.jobs),
            "jobs_finished": int(done.sum()),
            "jobs_rejected": int(self._rejected.sum()),
            "gpus": total_gpus,
        }
        if done.any():
            makespan = float(self._finish[done].max() - submit.min())
            busy_gpu_s = float((gpus * self._run_s).sum())
            metrics.update(_time_metrics(jct, queue, busy_gpu_s, total_gpus, makespan))
        else:
            metrics.update(_NO_TIME_METRICS, gpu_utilization=0.0 if total_gpus else None)
        metrics.update(
            preemptions=self.preemptions,
            preempted_jobs=int((self._preemptions > 0).sum()),
            preemption_cost_s=self.preemption_cost_s,
            policy_calls=self.policy_calls,
            events=self.events,
            sim_seconds=elapsed,
        )
        teams = sorted({j.team for j in self.jobs})
        if len(teams) > 1 or (teams and teams[0]):
            team_of = np.array([j.team for j in self.jobs], dtype=object)[done]
            metrics["teams"] = _team_metrics(teams, team_of, jct, queue)
        if self.predictor is not None:
            metrics["prediction"] = self._tracker.report()
        return SimResult(
            metrics=metrics,
            times=times,
            queue_length=queue_len,
            busy_gpus=busy,
            total_gpus=total_gpus,
            jobs={
                "submit": submit,
                "first_start": self._first_start,
                "finish": self._finish,
                "run_s": self._run_s,
                "preemptions": self._preemptions,
            },
        )


_NO_TIME_METRICS: dict[str, Any] = {
    "avg_jct_s": 0.0,
    "p50_jct_s": 0.0,
    "p99_jct_s": 0.0,
    "avg_queue_s": 0.0,
    "p50_queue_s": 0.0,
    "p99_queue_s": 0.0,
    "gpu_utilization": None,
    "makespan_s": 0.0,
}
"""The time metrics of a run in which no job finished (utilization: 0 with GPUs)."""


def _time_metrics(
    jct: np.ndarray, queue: np.ndarray, busy_gpu_s: float, total_gpus: float, makespan: float
) -> dict[str, Any]:
    """JCT and queueing delay (mean, median, p99) of the finished jobs, GPU utilization
    (``None`` without GPUs) and makespan."""
    if not total_gpus:
        utilization = None
    else:
        utilization = busy_gpu_s / (total_gpus * makespan) if makespan > 0 else 0.0
    return {
        "avg_jct_s": float(jct.mean()),
        "p50_jct_s": float(np.percentile(jct, 50)),
        "p99_jct_s": float(np.percentile(jct, 99)),
        "avg_queue_s": float(queue.mean()),
        "p50_queue_s": float(np.percentile(queue, 50)),
        "p99_queue_s": float(np.percentile(queue, 99)),
        "gpu_utilization": utilization,
        "makespan_s": makespan,
    }


def _team_metrics(
    teams: Sequence[str], team_of: np.ndarray, jct: np.ndarray, queue: np.ndarray
) -> dict[str, dict[str, float]]:
    """Per team with finished jobs (``team_of``: the team of each): their count, average
    JCT and queueing delay, p99 queueing delay."""
    per_team: dict[str, dict[str, float]] = {}
    for team in teams:
        mask = team_of == team
        if not mask.any():
            continue
        per_team[team] = {
            "jobs": int(mask.sum()),
            "avg_jct_s": float(jct[mask].mean()),
            "avg_queue_s": float(queue[mask].mean()),
            "p99_queue_s": float(np.percentile(queue[mask], 99)),
        }
    return per_team


def simulate(
    jobs: Sequence[TraceJob],
    cluster: Cluster,
    policy: str | BasePolicy = DEFAULT_POLICY,
    **options: Any,
) -> SimResult:
    """Run a :class:`Simulator` (see its arguments) and return the result."""
    return Simulator(jobs, cluster, policy=policy, **options).run()
