"""The live scheduler: every tick, reconcile running jobs, then let the policy decide.

One tick:

1. **Reconcile.** Poll the executor for each job this scheduler runs; ship new log
   bytes to the artifact store; act on stop requests (cancel, admin preemption); record
   every attempt that ended, requeueing it when the rules say so.
2. **Decide.** Build the policy's view (the cluster with every running job's placement
   allocated, the queue, quotas) and call the *same* policy the trace simulator replays.
3. **Apply.** Preemptions first (SIGTERM, grace, SIGKILL through the executor), then
   starts: claim the job (a compare-and-set in the database, under the scheduling lock
   on PostgreSQL), unpack its snapshot, launch it. Under :meth:`SchedulerLoop.run` the
   claims are made in the tick and the launches by threads of their own, so the next tick
   (another job's end, the next pipeline step) does not wait for a supervisor to start.

After a restart :meth:`SchedulerLoop.recover` re-attaches to every job this scheduler
had claimed (the local executor's supervisors outlive the server), declares the ones
whose processes are gone lost (and retries them if they have retries left), and gives
never-started claims back to the queue. No job runs twice at the same time: a job is
launched only by the scheduler whose claim won, and only once per attempt.

A scheduler that never comes back is not waited for: every scheduler beats a heartbeat each
tick, and the jobs of one silent for longer than ``lease_s`` are adopted by a live one
(:meth:`SchedulerLoop.adopt_orphans`), which then treats them exactly as after its own
restart. Executors that can reach the jobs from anywhere (Ray; the local executor on the same
machine) re-attach; otherwise the attempt is declared lost and retried by the rules, so a lease
should be longer than any restart that is expected to come back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from shamal.artifacts import ArtifactService
from shamal.config import SchedulerSettings
from shamal.executors import (
    DISK_LIMIT,
    OUT_OF_MEMORY,
    Executor,
    ExitStatus,
    Handle,
    LaunchSpec,
)
from shamal.jobs import (
    NAMESPACE,
    Attempt,
    Job,
    JobService,
    JobState,
    log_prefix,
    placement_from_json,
    placement_to_json,
    record_of,
    request_of,
    snapshot,
)
from shamal.scheduler.core import (
    Cluster,
    JobPhase,
    Placement,
    Policy,
    Preempt,
    PriorityClass,
    RuntimePredictor,
    SchedJob,
    SchedulerState,
    Start,
    decay_all,
    decayed_usage,
)
from shamal.scheduler.live._fit import device_memory_env, fits_beside, held_by, quotas_of
from shamal.scheduler.live._lifecycle import JobLifecycle

logger = logging.getLogger(__name__)

#: How often a waiting loop looks for ended jobs on the local executor (reading two small
#: files a job): every END_POLL_MIN_S with a few jobs, every END_POLL_S at most with many,
#: so that the looks never cost more than about 1% of a CPU.
END_POLL_S = 0.05
END_POLL_MIN_S = 0.01
END_POLL_PER_JOB_S = 0.002

LOG_SHIP_BYTES = 4 * 1024 * 1024
"""Largest log chunk shipped at once."""

UNPACKED_KEPT = 16
"""Snapshots kept unpacked for the next job that runs one (the most recently used)."""


@dataclass(frozen=True)
class SchedulerParts:
    """What a scheduler loop works with, built once by the process that runs it."""

    lifecycle: JobLifecycle
    jobs: JobService
    artifacts: ArtifactService
    executor: Executor
    """What runs the jobs: the server builds an :class:`~shamal.executors.ExecutorSet`,
    which launches each job on the executor it names."""
    cluster: Cluster
    settings: SchedulerSettings
    jobs_dir: Path
    """The attempts' logs and the executor's files about them (the server's, hidden from
    jobs)."""
    work_root: Path | None = None
    """Where attempts' working folders go (outside the server's home); default
    ``jobs_dir``."""


@dataclass
class Tracked:
    """A job this scheduler runs, and how far its log has been shipped."""

    job: Job
    handle: Handle
    log_path: Path
    shipped: int = 0
    stopping: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class AttemptCredentials(Protocol):
    """What a job attempt is handed to reach the platform, and its withdrawal."""

    def env(self, job: Job) -> Mapping[str, str]:
        """Variables for the attempt's environment (a token of its own among them)."""
        ...

    def release(self, job: Job) -> None:
        """The attempt ended: withdraw what :meth:`env` handed it."""
        ...


class SchedulerLoop:
    """The live scheduler of one process (see the module docstring).

    Not thread-safe: one thread calls :meth:`recover` once, then :meth:`tick` (or
    :meth:`run` does both).
    """

    def __init__(
        self,
        parts: SchedulerParts,
        policy: Policy,
        *,
        credentials: AttemptCredentials | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = parts.lifecycle.name
        self._life = parts.lifecycle
        self._jobs = parts.jobs
        self._artifacts = parts.artifacts
        self._executor = parts.executor
        self.policy = policy
        self._template = parts.cluster
        self._settings = settings = parts.settings
        self._jobs_dir = parts.jobs_dir
        self._work_root = parts.work_root or parts.jobs_dir
        self._credentials = credentials
        self._clock = clock
        self._classes = {
            c.name: PriorityClass(c.name, c.value, c.preempts, c.preemptible)
            for c in settings.priority_classes
        }
        self._quotas = quotas_of(settings)
        self.tracked: dict[str, Tracked] = {}
        self.predictor = RuntimePredictor()
        self._usage: dict[str, float] = {}
        self._usage_at: float | None = None
        self._rates: dict[str, float] = {}
        self._adopted_at = self._beat_at = float("-inf")
        #: Set to start the next tick now (a job was submitted in this process).
        self.wake = threading.Event()
        self.periodic: list[tuple[float, Callable[[], object]]] = []
        """Housekeeping other domains hand the loop: (every N seconds, task)."""
        #: While :meth:`run` runs: the threads that launch admitted jobs, so that the loop
        #: reconciles, admits and moves pipelines on while a supervisor starts.
        self._launcher: ThreadPoolExecutor | None = None
        self._unpacked_lock = threading.Lock()
        self._in_flight: set[Future[None]] = set()

    # ------------------------------------------------------------------ run
    def run(self, stop: threading.Event) -> None:
        """Recover, then tick every ``tick_s`` until ``stop`` is set. Jobs keep running."""
        self.recover()
        last = [0.0] * len(self.periodic)
        workers = self._settings.launch_concurrency
        self._launcher = ThreadPoolExecutor(workers, thread_name_prefix="launch")
        try:
            while not stop.is_set():
                try:
                    self.tick()
                except Exception:  # one bad tick must not stop scheduling for good
                    logger.exception("scheduler tick failed; trying again next tick")
                now = time.monotonic()
                for index, (every, task) in enumerate(self.periodic):
                    if now - last[index] >= every:
                        last[index] = now
                        try:
                            task()
                        except Exception:
                            logger.exception("scheduler housekeeping %r failed", task)
                self._rest(stop)
        finally:
            # Launches under way finish (their jobs are tracked, or failed) before the loop
            # ends: none is left admitted without a supervisor by this process.
            launcher, self._launcher = self._launcher, None
            launcher.shutdown(wait=True)

    def _rest(self, stop: threading.Event) -> None:
        """Wait for the next tick: ``tick_s``, or less when a job was submitted in this
        process (:attr:`wake`) or, for jobs on the local executor, when one has ended (its
        files say so: a cheap look every 10 to 50 ms, by their number; jobs on other
        executors wait for the tick). A job's successor, such as a pipeline's next step,
        then starts within milliseconds instead of a tick."""
        deadline = time.monotonic() + self._settings.tick_s
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            # A launch under way is about to add a job to watch: look often, not in a tick.
            fast = bool(self._in_flight) or any(
                t.handle.executor == "local" for t in self.tracked.values()
            )
            if self.wake.wait(min(left, self._end_poll_s()) if fast else left):
                self.wake.clear()
                return
            if fast and self._any_ended():
                return

    def _end_poll_s(self) -> float:
        watched = len(self.tracked) + len(self._in_flight)
        return min(END_POLL_S, max(END_POLL_MIN_S, END_POLL_PER_JOB_S * watched))

    def _any_ended(self) -> bool:
        for tracked in list(self.tracked.values()):
            if tracked.handle.executor != "local":
                continue  # a remote poll (Ray) is no cheap look
            try:
                if self._executor.poll(tracked.handle) is not None:
                    return True
            except Exception:  # the tick's reconcile reports it
                return True
        return False

    def learn_history(self) -> int:
        """Teach the runtime predictor every succeeded job's runtime; returns how many."""
        records = [record_of(job, runtime) for job, runtime in self._life.history()]
        self.predictor.fit(records)
        return len(records)

    def recover(self) -> None:
        """Re-attach to this scheduler's jobs after a restart (see the module docstring)."""
        self._life.heartbeat()
        self._beat_at = time.monotonic()
        self.learn_history()
        self.restore_usage()
        for job in self._life.mine():
            self._resume(job, "the scheduler restarted")

    def _resume(self, job: Job, why: str) -> None:
        """Take charge of a claimed job this process did not start: give a never-started claim
        back, re-attach to a running attempt, or declare it lost (and retry it if it may)."""
        if job.state is JobState.ADMITTED and not job.handle:
            self._life.unclaim(job, f"{why} before starting it")
            return
        handle = self._executor.reattach(json.dumps(dict(job.handle or {})))
        if handle is None:
            self._life.ended(job, JobState.LOST, reason=f"its processes were gone after {why}")
            self._release(job)
            self._remove_workdir(job)
            return
        shipped = self._shipped_bytes(job)
        self.tracked[job.id] = Tracked(job, handle, self._log_path(job), shipped)
        logger.info("re-attached to job %s (attempt %d): %s", job.id, job.attempt, why)

    @property
    def lease_s(self) -> float:
        """How long another scheduler may be silent before this one adopts its jobs."""
        return max(self._settings.lease_s, 5 * self._settings.tick_s)

    def adopt_orphans(self) -> list[str]:
        """Adopt the jobs of schedulers silent for over :attr:`lease_s`; their ids."""
        adopted = self._life.adopt_orphans(self.lease_s)
        for job in adopted:
            logger.warning(
                "adopting job %s of a scheduler silent for over %.0f s", job.id, self.lease_s
            )
            self._resume(job, "its scheduler went silent")
        return [job.id for job in adopted]

    def tick(self) -> None:
        """One pass: beat and adopt orphans when it is time, reconcile, decide, apply."""
        now_mono = time.monotonic()
        if now_mono - self._beat_at >= self.lease_s / 5:  # a write a tick would be 1/s
            self._beat_at = now_mono
            self._life.heartbeat()
        if now_mono - self._adopted_at >= self.lease_s / 4:
            self._adopted_at = now_mono
            self.adopt_orphans()
        self._reconcile()
        queued, active = self._life.pending()
        self._let_go_of_adopted(active)
        now = self._clock()
        usage = self._decayed_usage(active, now)
        if not queued:
            return
        state = self._state(queued, active, now, usage)
        decisions = self.policy.decide(state, now)
        by_id = {job.id: job for job in (*queued, *active)}
        for decision in decisions:
            if isinstance(decision, Preempt):
                self._preempt(by_id[decision.job_id], decision.reason)
        self._apply_starts([d for d in decisions if isinstance(d, Start)], by_id)

    def _apply_starts(self, starts: Sequence[Start], by_id: Mapping[str, Job]) -> None:
        # Admitted here, one after the other (the next tick must see them hold their
        # capacity); launched by threads, since a launch mostly waits for the job's
        # supervisor to report in.
        admitted = [
            (job, decision.placement)
            for decision in starts
            if (job := self._admit(by_id[decision.job_id], decision.placement, decision.borrowed))
        ]
        if self._launcher is not None:  # run(): the loop goes on while they start
            for job, placement in admitted:
                future = self._launcher.submit(self._launch, job, placement)
                self._in_flight.add(future)
                future.add_done_callback(self._in_flight.discard)
            return
        workers = min(len(admitted), self._settings.launch_concurrency)
        if workers <= 1:
            for job, placement in admitted:
                self._launch(job, placement)
            return
        with ThreadPoolExecutor(workers, thread_name_prefix="launch") as pool:
            for _ in pool.map(lambda pair: self._launch(*pair), admitted):
                pass

    def _let_go_of_adopted(self, active: Sequence[Job]) -> None:
        """Stop watching jobs another scheduler adopted (this one was silent past its lease,
        e.g. a tick that hung); the adopter has re-attached to them."""
        owners = {job.id: job.claimed_by for job in active}
        for job_id in [j for j in self.tracked if owners.get(j, self.name) != self.name]:
            logger.warning(
                "job %s was adopted by scheduler %s; no longer watching it", job_id, owners[job_id]
            )
            del self.tracked[job_id]

    # ------------------------------------------------------------------ decide
    def _sched_job(self, job: Job, now: float) -> SchedJob:
        running = job.state in (JobState.ADMITTED, JobState.RUNNING)
        started = job.updated_at.timestamp() if running else None
        attained = job.attained_s + (now - started if started is not None else 0.0)
        placement = placement_from_json(job.placement) if running and job.placement else None
        sched = SchedJob(
            id=job.id,
            team=job.team,
            request=request_of(job),
            submitted_at=job.submitted_at.timestamp(),
            priority=self._classes.get(job.priority)
            or PriorityClass(job.priority, job.priority_value),
            pool=job.pool,
            user=job.user,
            fingerprint=job.fingerprint,
            phase=JobPhase.RUNNING if running else JobPhase.QUEUED,
            placement=placement,
            started_at=started,
            attained_s=max(attained, 0.0),
            preemptions=job.preemptions,
            time_limit_s=job.time_limit_s,
            borrowed=bool(job.placement and job.placement.get("borrowed")),
            # Told to stop and not exited yet: no victim again, and its capacity is awaited.
            stopping=(tracked := self.tracked.get(job.id)) is not None
            and tracked.stopping is not None,
            regions=None if job.regions is None else frozenset(job.regions),
        )
        sched.predicted_s = self.predictor.predict(sched)
        return sched

    def _state(
        self, queued: Sequence[Job], active: Sequence[Job], now: float, usage: dict[str, float]
    ) -> SchedulerState:
        cluster = held_by(self._template, active)
        running = [self._sched_job(job, now) for job in active]
        return SchedulerState(
            cluster=cluster,
            queued=[self._sched_job(job, now) for job in queued],
            running=running,
            quotas=self._quotas,
            usage=usage,
        )

    def _share(self, job: Job) -> float:
        """The job's dominant share of the cluster (DRF): GPUs, CPUs or memory, whichever
        it holds most of, so CPU-only pools get fair share too."""
        total = request_of(job).total
        capacity = self._template.capacity(job.pool)
        shares = [
            total.gpu_milli / capacity.gpu_milli if capacity.gpu_milli else 0.0,
            total.cpu_milli / capacity.cpu_milli if capacity.cpu_milli else 0.0,
            total.memory_mib / capacity.memory_mib if capacity.memory_mib else 0.0,
        ]
        return max(shares)

    def restore_usage(self) -> dict[str, float]:
        """Rebuild each team's decayed usage from the attempts on record, so fair share
        remembers past usage across restarts (and counts every scheduler's jobs)."""
        now = self._clock()
        half_life = self._settings.fair_share_half_life_h * 3600
        since = datetime.fromtimestamp(max(now - 20 * half_life, 0.0), UTC)  # < 1e-6 left
        usage: dict[str, float] = {}
        for attempt in self._life.attempts_since(since):
            start = attempt.started_at.timestamp()
            end = now if attempt.ended_at is None else attempt.ended_at.timestamp()
            capacity = self._template.capacity(attempt.pool)
            share = max(
                attempt.gpu_milli / capacity.gpu_milli if capacity.gpu_milli else 0.0,
                attempt.cpu_milli / capacity.cpu_milli if capacity.cpu_milli else 0.0,
                attempt.memory_mib / capacity.memory_mib if capacity.memory_mib else 0.0,
            )
            held = decayed_usage(0.0, min(end, now) - start, share, half_life)
            usage[attempt.team] = usage.get(attempt.team, 0.0) + decayed_usage(
                held, now - min(end, now), 0.0, half_life
            )
        _, active = self._life.pending()
        self._usage, self._usage_at = usage, now
        self._rates = {}
        for job in active:
            self._rates[job.team] = self._rates.get(job.team, 0.0) + self._share(job)
        return dict(usage)

    def _decayed_usage(self, active: Sequence[Job], now: float) -> dict[str, float]:
        """Each team's past usage in share-seconds, halving every ``fair_share_half_life_h``:
        what the ``fair`` policy orders teams by. Advanced by the shares held since the last
        tick (exact under the exponential decay, whatever the tick rate)."""
        rates: dict[str, float] = {}
        for job in active:
            rates[job.team] = rates.get(job.team, 0.0) + self._share(job)
        elapsed = 0.0 if self._usage_at is None else max(now - self._usage_at, 0.0)
        half_life = self._settings.fair_share_half_life_h * 3600
        self._usage = decay_all(self._usage, elapsed, self._rates, half_life)
        self._usage_at, self._rates = now, rates
        return dict(self._usage)

    # ------------------------------------------------------------------ apply
    def _preempt(self, job: Job, reason: str) -> None:
        tracked = self.tracked.get(job.id)
        if tracked is None:
            logger.info("job %s to preempt runs under another scheduler", job.id)
            return
        if tracked.stopping is None:
            tracked.stopping = "preempt"
            tracked.extra["reason"] = reason
            self._executor.preempt(tracked.handle, self._settings.grace_s)

    def _log_path(self, job: Job) -> Path:
        return self._jobs_dir / job.id / f"attempt-{job.attempt}.log"

    def _workdir_of(self, job: Job) -> Path:
        return self._work_root / job.id / f"attempt-{job.attempt}"

    def _workdir(self, job: Job) -> Path:
        folder = self._workdir_of(job)
        if folder.exists():
            shutil.rmtree(folder)
        if job.snapshot and snapshot.is_digest(job.snapshot):
            # Copied from the snapshot unpacked once (a pipeline's steps share one): no
            # download, gunzip and tar walk per job.
            unpacked = self._unpacked(job.snapshot)
            shutil.copytree(unpacked, folder, symlinks=True)
            return folder
        folder.mkdir(parents=True)
        if job.snapshot:
            self._unpack(job.snapshot, folder)
        return folder

    def _unpack(self, digest: str, folder: Path) -> None:
        # Streamed to a file beside the folder: a snapshot may be large.
        archive = folder.with_name(folder.name + ".tar.gz")
        with archive.open("wb") as handle:
            for chunk in self._jobs.open_snapshot(digest):
                handle.write(chunk)
        try:
            snapshot.extract(archive, folder)
        finally:
            archive.unlink()

    def _unpacked(self, digest: str) -> Path:
        """The snapshot ``digest`` unpacked in the server's own folder (hidden from jobs), made
        on first use; the least recently used beyond :data:`UNPACKED_KEPT` go, once unused
        for a minute."""
        root = self._jobs_dir / ".snapshots"
        target = root / digest
        with self._unpacked_lock:
            if target.is_dir():
                os.utime(target)
                return target
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".unpacking-", dir=root))
        try:
            self._unpack(digest, staging / "tree")
            with self._unpacked_lock:
                if not target.is_dir():
                    (staging / "tree").rename(target)
                os.utime(target)
                self._forget_unpacked(root, keep=target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return target

    @staticmethod
    def _forget_unpacked(root: Path, keep: Path) -> None:
        trees = sorted(
            (p for p in root.iterdir() if p.is_dir() and snapshot.is_digest(p.name)),
            key=lambda p: p.stat().st_mtime,
            reverse=True,
        )
        idle_since = time.time() - 60.0  # one copying from it now was touched since
        for old in trees[UNPACKED_KEPT:]:
            if old != keep and old.stat().st_mtime < idle_since:
                shutil.rmtree(old, ignore_errors=True)

    def _admit(self, queued: Job, placement: Placement, borrowed: bool) -> Job | None:
        """Claim a queued job for this scheduler (None: another took it, or it changed)."""
        stored = {**placement_to_json(placement), "borrowed": borrowed}
        reason = "admitted on borrowed quota" if borrowed else "admitted"
        return self._life.admit(queued.id, stored, reason, fits_beside(self._template, placement))

    def _launch(self, job: Job, placement: Placement) -> None:
        """Start an admitted job's attempt and watch it; a failure to start ends the job."""
        try:
            self._launch_admitted(job, placement)
        except Exception:  # in a launch thread: logged, and the tick's reconcile goes on
            logger.exception("could not record the start of job %s", job.id)

    def _launch_admitted(self, job: Job, placement: Placement) -> None:
        try:
            workdir = self._workdir(job)
            log_path = self._log_path(job)
            spec = LaunchSpec(
                job_id=job.id,
                attempt=job.attempt,
                command=job.command,
                workdir=workdir,
                env={
                    **job.env,
                    **device_memory_env(self._template, placement, request_of(job)),
                    **(self._credentials.env(job) if self._credentials else {}),
                },
                placement=placement,
                time_limit_s=job.time_limit_s,
                log_path=log_path,
                grace_s=self._settings.grace_s,
                tenant=job.team,
                executor=job.executor,
            )
            handle = self._executor.launch(spec)
        except Exception as exc:
            logger.exception("could not start job %s", job.id)
            self._life.ended(job, JobState.FAILED, reason=f"could not start: {type(exc).__name__}")
            self._release(job)
            return
        pool = self._template.nodes[placement.slots[0].node].pool
        attempt = Attempt(
            job_id=job.id,
            attempt=job.attempt,
            team=job.team,
            user=job.user,
            pool=pool,
            nodes=placement.nodes,
            cpu_milli=job.cpu_milli * job.workers,
            memory_mib=job.memory_mib * job.workers,
            gpu_milli=request_of(job).total.gpu_milli,
            started_at=self._life.now(),
            ended_at=None,
            outcome=None,
            exit_code=None,
        )
        running = self._life.started(job, json.loads(handle.to_json()), attempt)
        if running is None:  # cancelled between claim and launch
            self._executor.cancel(handle)
            self._release(job)
            return
        self.tracked[job.id] = Tracked(running, handle, log_path)

    def _remove_workdir(self, job: Job) -> None:
        """An ended attempt's working folder goes (a retry gets a fresh one); what a job
        keeps belongs in the artifact store."""
        folder = self._workdir_of(job)
        if self._work_root != self._jobs_dir and folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)
            with contextlib.suppress(OSError):
                folder.parent.rmdir()  # the job's folder, once its last attempt is gone

    def _release(self, job: Job) -> None:
        """Withdraw an ended attempt's credentials; a failure is logged, never fatal (the
        token expires on its own)."""
        if self._credentials is None:
            return
        try:
            self._credentials.release(job)
        except Exception:
            logger.exception("could not revoke the token of job %s attempt %d", job.id, job.attempt)

    # ------------------------------------------------------------------ reconcile
    def _reconcile(self) -> None:
        for job_id, tracked in list(self.tracked.items()):
            status = self._executor.poll(tracked.handle)
            self._ship_log(tracked, final=status is not None)
            if status is None:
                self._honour_stop_request(tracked)
                continue
            del self.tracked[job_id]
            outcome, reason = self._outcome(tracked, status)
            ended = self._life.ended(
                tracked.job, outcome, reason=reason, exit_code=status.exit_code
            )
            self._release(tracked.job)
            self._remove_workdir(tracked.job)
            if ended is not None and outcome is JobState.SUCCEEDED:
                self.predictor.update(record_of(ended, ended.attained_s))

    def _honour_stop_request(self, tracked: Tracked) -> None:
        if tracked.stopping is not None:
            return
        request = self._life.get(tracked.job.id).stop_request
        if request == "cancel":
            tracked.stopping = "cancel"
            self._executor.cancel(tracked.handle)
        elif request == "preempt":
            tracked.stopping = "preempt"
            tracked.extra["reason"] = "preempted by an admin"
            self._executor.preempt(tracked.handle, self._settings.grace_s)

    @staticmethod
    def _outcome(tracked: Tracked, status: ExitStatus) -> tuple[JobState, str]:
        if tracked.stopping == "cancel":
            return JobState.CANCELLED, "cancelled"
        if tracked.stopping == "preempt" or status.requeue:
            why = tracked.extra.get("reason") or "asked to be requeued"
            return JobState.PREEMPTED, str(why)
        if status.reason == "succeeded":
            return JobState.SUCCEEDED, "exited 0"
        if status.reason == "timeout":
            return JobState.FAILED, "stopped at its time limit"
        if status.reason == "lost":
            return JobState.LOST, "its processes disappeared"
        return JobState.FAILED, _failure(status)

    # ------------------------------------------------------------------ logs
    def _shipped_bytes(self, job: Job) -> int:
        files = self._artifacts.files_under(NAMESPACE, log_prefix(job.id, job.attempt))
        return max((int(f.path.rsplit("/", 1)[-1]) + f.size for f in files), default=0)

    def _ship_log(self, tracked: Tracked, *, final: bool) -> None:
        try:
            with tracked.log_path.open("rb") as handle:
                handle.seek(tracked.shipped)
                while data := handle.read(LOG_SHIP_BYTES):
                    path = (
                        f"{log_prefix(tracked.job.id, tracked.job.attempt)}/{tracked.shipped:015d}"
                    )
                    self._artifacts.store_file(None, NAMESPACE, path, [data])
                    tracked.shipped += len(data)
                    if not final:
                        break
        except FileNotFoundError:
            return


_SHELL_CODES = {126: "the command is not executable", 127: "command not found"}


def _failure(status: ExitStatus) -> str:
    """How a failed attempt ended, in words: 'killed by SIGKILL', 'rank 1 exited with
    code 3', 'exited with code 127 (command not found)'."""
    code = status.exit_code
    gang = len(status.exit_codes) > 1 and status.culprit_rank is not None
    if status.detail in (OUT_OF_MEMORY, DISK_LIMIT):
        return f"{status.detail} (rank {status.culprit_rank})" if gang else status.detail
    if code is not None and code < 0:
        try:
            what = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            what = f"killed by signal {-code}"
    else:
        what = f"exited with code {code}"
        if code in _SHELL_CODES:
            what += f" ({_SHELL_CODES[code]})"
    return f"rank {status.culprit_rank} {what}" if gang else what
