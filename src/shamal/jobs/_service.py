"""Rules of jobs: who may submit, see, cancel and preempt them; every change audited.

Access: a job belongs to a team. Members of the team submit and cancel its jobs,
viewers see them and their logs; another team's job answers 404. Priorities above
the default class need the team's maintainer role; ``preempt`` is for platform
admins. Platform admins see and do everything; an admin may run jobs without a team.

The live scheduler (:mod:`shamal.scheduler.live`) drives jobs through their states; this
class only takes requests from people, and asks the live scheduler's model of the cluster
(a :class:`Capacity`, handed in) whether a job could ever start and why it waits.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import tempfile
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol

from sqlalchemy.orm import Session

from shamal.artifacts import ArtifactService
from shamal.clock import Clock, utc_now
from shamal.config import SchedulerSettings
from shamal.db import Database
from shamal.errors import AlreadyExists, Conflict, InvalidParameter, NotFound, PermissionDenied
from shamal.events import EventKind, NewEvent, emit
from shamal.executors import check_executor
from shamal.jobs import _cost, _rules, _store, snapshot
from shamal.jobs._convert import placement_from_json, record_of, request_of
from shamal.jobs._entities import (
    ACTIVE_STATES,
    Amount,
    CostLine,
    Job,
    JobEvent,
    JobSpec,
    JobState,
    QuotaUse,
)
from shamal.scheduler.core import (
    GPU_MILLI,
    Cluster,
    Request,
    Resources,
    RuntimePredictor,
    pools_in_regions,
)
from shamal.security import AuditContext, AuditLog, Principal, Role, SecurityService

logger = logging.getLogger(__name__)

NAMESPACE = "jobs"
"""Artifact namespace of snapshots and logs (access is checked here, by job)."""
MAX_LIST = 1000
MAX_LOG_READ = 1024 * 1024
#: The most datasets one job may name as read (its regions are their policies' intersection).
MAX_DATASETS = 32
_JOB_ID = re.compile(r"^[0-9a-f]{32}$")


def snapshot_path(digest: str) -> str:
    return f"snapshots/{digest}.tar.gz"


def log_prefix(job_id: str, attempt: int) -> str:
    return f"logs/{job_id}/{attempt}"


def _visibility(principal: Principal) -> _store.Visibility:
    return None if principal.user.is_admin else frozenset(principal.roles)


@dataclass(frozen=True, slots=True)
class LogChunk:
    """Bytes of one attempt's log from ``offset``; ``complete``: nothing more will come."""

    data: bytes
    offset: int
    next_offset: int
    attempt: int
    complete: bool


def _amount(resources: Resources) -> Amount:
    return Amount(
        cpus=resources.cpu_milli / 1000,
        memory_mib=resources.memory_mib,
        gpus=resources.gpu_milli / GPU_MILLI,
    )


class Capacity(Protocol):
    """The cluster as the live scheduler models it, asked about jobs people submit and list."""

    def refusal(self, request: Request, pool: str | None, team: str) -> str | None:
        """Why a job of this shape could never start for ``team`` (None: it could)."""

    def pools_for(self, request: Request, team: str) -> list[str]:
        """The pools where a job of this shape could start for ``team``."""

    def waiting(self, queued: Sequence[Job], active: Sequence[Job]) -> dict[str, str]:
        """Why each queued job waits, by job id, given the jobs holding resources."""


class DataRegions(Protocol):
    """The regions where a job reading the datasets ``references`` may run, as the
    datasets' residency policies say (None: anywhere; empty: nowhere), checking that
    ``principal`` may read them (NotFound otherwise). Handed in by the server's wiring."""

    def __call__(
        self, principal: Principal, references: Sequence[str]
    ) -> frozenset[str] | None: ...


class JobService:
    """Submit, list, show, cancel and preempt jobs; read their logs and their cost.

    Thread-safe; one instance per process. Changes take the request's AuditContext and
    record their audit entry in the transaction that makes the change.
    """

    def __init__(  # noqa: PLR0913 - the services it uses, then keyword-only models
        self,
        db: Database,
        audit: AuditLog,
        security: SecurityService,
        artifacts: ArtifactService,
        settings: SchedulerSettings,
        cluster: Cluster,
        clock: Clock = utc_now,
        *,
        capacity: Capacity | None = None,
        data_regions: DataRegions | None = None,
    ) -> None:
        """``cluster`` is the configured cluster; with ``capacity`` (the live scheduler's
        model of it), jobs that could never start on it are refused at submission and
        waiting ones are told why (without: not checked). ``data_regions`` resolves the
        datasets a job reads into the regions it may run in (without: a job naming
        datasets is refused)."""
        self._db = db
        self._audit = audit
        self._security = security
        self._artifacts = artifacts
        self._settings = settings
        self._pools = dict(cluster.pools)
        self._node_pools = {node.name: node.pool for node in cluster.nodes.values()}
        self._capacity = capacity
        self._data_regions = data_regions
        self._classes = {c.name: c for c in settings.priority_classes}
        self._clock = clock
        #: Called after each submission (the live scheduler in this process wakes up).
        self.on_submit: list[Callable[[], None]] = []

    # ------------------------------------------------------------------ snapshots
    def _snapshot_team(self, principal: Principal | None, team: str | None) -> str | None:
        """The id of the team whose snapshots the caller reads or adds; None: a platform
        admin (or an open server) that names no team, for whom every snapshot is visible."""
        if principal is None or (principal.user.is_admin and team is None):
            return None
        return self._team(principal, team)[1]

    def _require_snapshot(self, principal: Principal | None, digest: str, team: str | None) -> int:
        """The size of a snapshot the caller's team uploaded.

        Raises:
            NotFound: not stored, or stored by other teams only (the same answer: a digest
                learned from another team reveals nothing and runs nothing).
        """
        if not snapshot.is_digest(digest):
            raise InvalidParameter("a snapshot is named by its sha256 (64 lowercase hex digits)")
        team_id = self._snapshot_team(principal, team)
        missing = NotFound(f"snapshot {digest[:12]} is not stored: upload it first")
        if team_id is not None and (principal is None or not principal.user.is_admin):
            with self._db.unit_of_work(write=False) as s:
                if not _store.snapshot_owned(s, digest, team_id):
                    raise missing
        try:
            return self._artifacts.file_info(NAMESPACE, snapshot_path(digest)).size
        except NotFound:
            raise missing from None

    def snapshot_size(self, principal: Principal, digest: str, team: str | None = None) -> int:
        """The size of a snapshot that ``team`` (default: the caller's only team) uploaded.

        Raises:
            NotFound: not uploaded (yet) by that team.
            InvalidParameter: no team named, and the caller is in several.
        """
        return self._require_snapshot(principal, digest, team)

    def has_snapshot(self, principal: Principal, digest: str, team: str | None = None) -> bool:
        try:
            self._require_snapshot(principal, digest, team)
        except NotFound:
            return False
        return True

    def store_snapshot(
        self, ctx: AuditContext, digest: str, chunks: Iterable[bytes], team: str | None = None
    ) -> int:
        """Store an uploaded snapshot after checking its sha256 and that it is one, for
        ``team`` (default: the uploader's only team): that team's jobs may run it.

        Raises:
            InvalidParameter: the digest does not match the bytes, or the archive holds
                anything a snapshot may not (links, escaping names, too much data); no team
                named and the uploader is in several.
            PermissionDenied: the uploader could submit no job (see
                :func:`_require_job_submitter`), or not for ``team``.
        """
        if not snapshot.is_digest(digest):
            raise InvalidParameter("a snapshot is named by its sha256 (64 lowercase hex digits)")
        _require_job_submitter(ctx.principal)
        team_id = self._snapshot_team(ctx.principal, team)
        with tempfile.TemporaryDirectory(prefix="shamal-upload-") as tmp:
            path = Path(tmp) / "snapshot.tar.gz"
            hasher = hashlib.sha256()
            size = 0
            with path.open("wb") as handle:
                for chunk in chunks:
                    size += len(chunk)
                    if size > snapshot.MAX_SNAPSHOT_BYTES:
                        raise InvalidParameter("snapshot is larger than a snapshot may be")
                    hasher.update(chunk)
                    handle.write(chunk)
            if hasher.hexdigest() != digest:
                raise InvalidParameter("the uploaded bytes do not match the snapshot's sha256")
            try:
                snapshot.check(path)
            except snapshot.SnapshotError as exc:
                raise InvalidParameter(str(exc)) from None
            ctx.target = f"snapshot:{digest}"
            with path.open("rb") as handle:
                self._artifacts.store_file(
                    ctx, NAMESPACE, snapshot_path(digest), iter(lambda: handle.read(1 << 20), b"")
                )
        if team_id is not None:
            owner = team_id
            # AlreadyExists: the same team's upload at the same moment recorded it.
            with contextlib.suppress(AlreadyExists):
                self._db.run(lambda s: _store.add_snapshot_owner(s, digest, owner, self._clock()))
        return size

    def open_snapshot(self, digest: str) -> Iterator[bytes]:
        """The snapshot's bytes, for the executor that unpacks it."""
        return self._artifacts.read_file(NAMESPACE, snapshot_path(digest))[1]

    # ------------------------------------------------------------------ submit
    def _team(self, principal: Principal, team: str | None) -> tuple[str, str | None]:
        """(team name, team id) the job belongs to."""
        return self._security.owning_team(principal, team, "runs this job with --team")

    def _priority(self, principal: Principal, team: str, name: str | None) -> tuple[str, int]:
        default = self._classes[self._settings.default_priority]
        chosen = self._classes.get(name or default.name)
        if chosen is None:
            names = ", ".join(self._classes)
            raise InvalidParameter(f"no priority class {name!r} (classes: {names})")
        elevated = chosen.value > default.value and not principal.user.is_admin
        if elevated and principal.roles.get(team, Role.VIEWER) < Role.MAINTAINER:
            raise PermissionDenied(
                f"priority {chosen.name} needs the maintainer role in team {team}"
            )
        return chosen.name, chosen.value

    def check_executor(self, name: str | None) -> None:
        """Refuse a job naming an executor the scheduler does not run (``None``, the
        default, always passes).

        Raises:
            InvalidParameter: saying which executors run and how to enable another.
        """
        check_executor(name, self._settings.executor_names)

    def submit(self, ctx: AuditContext, spec: JobSpec) -> Job:
        """Queue a job.

        Raises:
            InvalidParameter: a malformed request, an unknown pool, class or snapshot, an
                executor this server does not run, or a job that no node (set of nodes,
                for a gang) of its pool could ever hold or that needs more than its team's
                quota plus borrow limit.
            NotFound / PermissionDenied: the team is not the caller's, or the role is low;
                the snapshot is not one the job's team uploaded (NotFound).
        """
        principal = ctx.require_principal()
        if spec.id is not None:
            existing = self._submitted(principal, spec.id)
            if existing is not None:
                return existing
        command = _rules.check_command(spec.command)
        env = _rules.check_env(spec.env)
        _rules.check_resources(spec)
        pool = _rules.check_pool(spec.pool, set(self._pools))
        self.check_executor(spec.executor)
        team, team_id = self._team(principal, spec.team)
        priority, value = self._priority(principal, team, spec.priority)
        if spec.snapshot is not None:
            self._require_snapshot(principal, spec.snapshot, team or None)
        regions = self._job_regions(ctx, spec.datasets, pool, team)
        now = self._clock()
        retries = self._settings.default_retries if spec.retries is None else spec.retries
        job = Job(
            id=spec.id or uuid.uuid4().hex,
            name=_rules.check_name(spec.name) or _rules.default_name(command),
            team=team,
            user=principal.name,
            command=command,
            env=env,
            snapshot=spec.snapshot,
            cpu_milli=round(spec.cpus * 1000),
            memory_mib=spec.memory_mib,
            gpus=spec.gpus,
            gpu_milli=round(spec.gpu_fraction * GPU_MILLI),
            mig_profile=spec.mig_profile,
            gpu_models=tuple(spec.gpu_models),
            gpu_memory_mib=spec.gpu_memory_mib,
            workers=spec.workers,
            pool=pool,
            priority=priority,
            priority_value=value,
            time_limit_s=spec.time_limit_s,
            max_retries=retries,
            retries_used=0,
            attempt=0,
            state=JobState.QUEUED,
            reason="submitted",
            exit_code=None,
            submitted_at=now,
            updated_at=now,
            started_at=None,
            finished_at=None,
            placement=None,
            handle=None,
            claimed_by=None,
            stop_request=None,
            attained_s=0.0,
            preemptions=0,
            fingerprint=_rules.fingerprint(command),
            predicted_s=None,
            datasets=tuple(spec.datasets),
            regions=regions,
            executor=spec.executor,
        )
        self._check_capacity(job, pool, team)

        def work(s: Session) -> Job:
            stored = _store.insert_job(s, job, team_id, principal.name)
            self._audit.record(
                s, ctx, f"job:{job.id}", team=team, command=list(command[:8]), priority=priority
            )
            return stored

        try:
            stored = self._db.run(work)
        except AlreadyExists:
            found = self._submitted(principal, job.id) if spec.id is not None else None
            if found is None:
                raise
            return found  # the same submission, made twice at once
        for wake in self.on_submit:
            wake()
        return stored

    def _submitted(self, principal: Principal, job_id: str) -> Job | None:
        """The job ``job_id`` if the caller submitted it already (an idempotent retry)."""
        if not _JOB_ID.match(job_id):
            raise InvalidParameter("a job id is 32 lower-case hex digits")
        with self._db.unit_of_work(write=False) as s:
            try:
                job = _store.get_job(s, job_id)
            except NotFound:
                return None
        if job.user != principal.name:
            raise InvalidParameter("that job id is taken; leave the id out to get a new one")
        return job

    def _check_capacity(self, job: Job, pool: str | None, team: str) -> None:
        """Refuse a job that could never start: in its pool, else in any pool of the
        regions it is held to (any pool at all when it is not)."""
        if self._capacity is None:
            return
        candidates: list[str | None] = [pool]
        if pool is None and job.regions is not None:
            candidates = list(pools_in_regions(self._pools, job.regions))
        reasons = [self._capacity.refusal(request_of(job), p, team) for p in candidates]
        if all(reason is not None for reason in reasons):
            raise InvalidParameter(f"this job could never start: {'; '.join(map(str, reasons))}")

    def _job_regions(
        self, ctx: AuditContext, datasets: Sequence[str], pool: str | None, team: str
    ) -> tuple[str, ...] | None:
        """The regions a job reading ``datasets`` may run in (None: anywhere); a job that no
        pool of those regions could take, or that names a pool outside them, is refused
        (audited, outcome ``residency_denied``)."""
        if not datasets:
            return None
        if len(datasets) > MAX_DATASETS:
            raise InvalidParameter(f"a job names at most {MAX_DATASETS} datasets it reads")
        if self._data_regions is None:
            raise InvalidParameter("this server cannot resolve datasets for jobs; leave them out")
        allowed = self._data_regions(ctx.require_principal(), datasets)
        if allowed is None:
            return None
        regions = tuple(sorted(allowed))
        pools = pools_in_regions(self._pools, allowed)
        names = ", ".join(datasets)
        within = ", ".join(regions) or "no region common to all of them"
        problem = None
        if not pools:
            problem = (
                f"no pool is in a region the residency policies of {names} allow ({within}): "
                "an operator labels a pool there (labels.region), or read other data"
            )
        elif pool is not None and pool not in pools:
            region = self._pools[pool].labels.get("region") or "unlabelled"
            problem = (
                f"pool {pool!r} is in region {region}, and the residency policies of {names} "
                f"allow only {within}: submit to {', '.join(pools)} (--pool), or name no pool"
            )
        if problem is not None:
            ctx.target = f"team:{team}/job"
            ctx.detail.update(datasets=list(datasets), regions=list(regions), pool=pool)
            self._audit.record_outcome(ctx, "residency_denied")
            raise PermissionDenied(problem)
        return regions

    # ------------------------------------------------------------------ read
    def get(self, principal: Principal, job_id: str) -> Job:
        with self._db.unit_of_work(write=False) as s:
            return _store.get_job(s, job_id, _visibility(principal))

    def list_jobs(
        self,
        principal: Principal,
        *,
        states: Iterable[JobState] = (),
        team: str | None = None,
        user: str | None = None,
        limit: int = 100,
        after: tuple[datetime, str] | None = None,
    ) -> list[Job]:
        """Newest first; ``after`` (submitted_at, id): the page after that job's."""
        if not 1 <= limit <= MAX_LIST:
            raise InvalidParameter(f"limit must be between 1 and {MAX_LIST}")
        with self._db.unit_of_work(write=False) as s:
            return _store.list_jobs(
                s,
                _visibility(principal),
                states=set(states),
                team=team,
                user=user,
                limit=limit,
                after=after,
            )

    def waiting(self, jobs: Sequence[Job]) -> dict[str, str]:
        """What each queued job of ``jobs`` waits for now: quota, resources or the
        scheduler's next pass (job id -> a sentence; jobs in other states are left out)."""
        queued = [job for job in jobs if job.state is JobState.QUEUED]
        if not queued or self._capacity is None:
            return {}
        with self._db.unit_of_work(write=False) as s:
            active = _store.jobs_in_states(s, ACTIVE_STATES)
        return self._capacity.waiting(queued, active)

    def jobs_of(self, ids: Collection[str]) -> dict[str, Job]:
        """The jobs ``ids`` that exist, by id, whoever's they are: for services that submitted
        them on a user's behalf (a pipeline following its steps), never for callers."""
        with self._db.unit_of_work(write=False) as s:
            return {job.id: job for job in _store.jobs_by_id(s, ids)}

    def events(self, principal: Principal, job_id: str) -> list[JobEvent]:
        with self._db.unit_of_work(write=False) as s:
            job = _store.get_job(s, job_id, _visibility(principal))
            return _store.events(s, job.id)

    def read_log(
        self, principal: Principal, job_id: str, attempt: int | None, offset: int
    ) -> LogChunk:
        """Up to 1 MiB of an attempt's log from ``offset`` (default: the latest attempt)."""
        job = self.get(principal, job_id)
        number = job.attempt if attempt is None else attempt
        if offset < 0 or not 0 <= number <= job.attempt:
            raise InvalidParameter(f"attempt must be between 1 and {job.attempt}; offset >= 0")
        data = bytearray()
        position = offset
        for item in self._artifacts.files_under(NAMESPACE, log_prefix(job.id, number)):
            start = int(item.path.rsplit("/", 1)[-1])
            if start + item.size <= position or start > position:
                continue
            _, chunks = self._artifacts.read_file(NAMESPACE, item.path)
            blob = b"".join(chunks)
            data += blob[position - start :]
            position = start + len(blob)
            if len(data) >= MAX_LOG_READ:
                break
        ended = job.state not in (JobState.ADMITTED, JobState.RUNNING) or number < job.attempt
        return LogChunk(bytes(data), offset, position, number, ended and not data)

    # ------------------------------------------------------------------ stop
    def cancel(self, ctx: AuditContext, job_id: str) -> Job:
        """Cancel: at once when queued; a running job is stopped by its scheduler.

        Returns:
            The job: cancelled, or still admitted/running with ``stop_request="cancel"``.

        Raises:
            Conflict: the job has already ended.
        """
        principal = ctx.require_principal()
        job = self.get(principal, job_id)
        if not principal.user.is_admin:
            principal.require_team_role(job.team, Role.MEMBER)
        now = self._clock()

        def work(s: Session) -> Job:
            # Two rounds: a running job may go back to the queue between the two
            # statements (preempted, or retried), and must then be cancelled there.
            for _ in range(2):
                done = _store.transition(
                    s,
                    job.id,
                    JobState.QUEUED,
                    JobState.CANCELLED,
                    at=now,
                    actor=ctx.actor,
                    reason=f"cancelled by {ctx.actor}",
                    finished_at=now,
                )
                if done is None and _store.request_stop(s, job.id, "cancel"):
                    done = _store.get_job(s, job.id)
                if done is not None:
                    self._audit.record(s, ctx, f"job:{job.id}", request="cancel")
                    if done.state is JobState.CANCELLED:  # ended here; a running one, later
                        emit(s, job_finished(done, ctx.actor))
                    return done
            current = _store.get_job(s, job.id)
            raise Conflict(f"job {job.id[:12]} is {current.state.value}: nothing to cancel")

        return self._db.run(work)

    def preempt(self, ctx: AuditContext, job_id: str) -> Job:
        """Push a running job through the preemption path (admins only): its scheduler
        sends SIGTERM, waits the grace period, and puts the job back in the queue.

        Returns:
            The job, still admitted or running, with ``stop_request="preempt"``.

        Raises:
            Conflict: the job is not admitted or running when the request lands (a job
                that is queued, even one just requeued, is never touched).
        """
        principal = ctx.require_principal()
        principal.require_admin()
        job = self.get(principal, job_id)

        def work(s: Session) -> Job:
            # One conditional UPDATE: a job the scheduler requeued (or ended) since it was
            # read above is left as it is, never cancelled or flagged in the queue.
            if not _store.request_stop(s, job.id, "preempt"):
                current = _store.get_job(s, job.id)
                raise Conflict(
                    f"job {job.id[:12]} is {current.state.value}: only running jobs preempt"
                )
            self._audit.record(s, ctx, f"job:{job.id}", request="preempt")
            return _store.get_job(s, job.id)

        return self._db.run(work)

    # ------------------------------------------------------------------ predictor
    def quota_use(self, principal: Principal) -> list[QuotaUse]:
        """Each configured team quota (by pool, then team) and what the team holds in
        that pool now, and how many of its jobs wait that the pool could run: those naming
        it, and those naming no pool that could start there (they count in each such
        pool); accounts that are not admins see their own teams' rows only."""
        with self._db.unit_of_work(write=False) as s:
            jobs = _store.jobs_in_states(s, {*ACTIVE_STATES, JobState.QUEUED})
        held: dict[tuple[str, str], Resources] = {}
        running: dict[tuple[str, str], int] = {}
        queued: dict[tuple[str, str], int] = {}
        for job in jobs:
            if job.state is JobState.QUEUED:
                for pool_name in self._waits_in(job):
                    queued[(job.team, pool_name)] = queued.get((job.team, pool_name), 0) + 1
                continue
            slots = placement_from_json(job.placement).slots if job.placement else ()
            pool = self._node_pools.get(slots[0].node) if slots else None
            if pool is not None:
                key = (job.team, pool)
                held[key] = held.get(key, Resources()) + request_of(job).total
                running[key] = running.get(key, 0) + 1
        visible = _visibility(principal)
        return [
            QuotaUse(
                team=quota.team,
                pool=quota.pool,
                cohort=quota.cohort,
                weight=quota.weight,
                guaranteed=Amount(quota.cpus, quota.memory_mib, quota.gpus),
                borrow_limit=Amount(quota.borrow_cpus, quota.borrow_memory_mib, quota.borrow_gpus),
                held=_amount(held.get((quota.team, quota.pool), Resources())),
                running=running.get((quota.team, quota.pool), 0),
                queued=queued.get((quota.team, quota.pool), 0),
            )
            for quota in sorted(self._settings.quotas, key=lambda q: (q.pool, q.team))
            if visible is None or quota.team in visible
        ]

    def _waits_in(self, job: Job) -> list[str]:
        """The pools a queued job waits for: the one it names, else every pool it could
        start in."""
        if job.pool:
            return [job.pool]
        if self._capacity is None:  # no nodes: nothing could start it anywhere
            return []
        return self._capacity.pools_for(request_of(job), job.team)

    def predictor_report(self, principal: Principal, limit: int = 5_000) -> dict[str, float]:
        """How well runtimes are predicted from history, measured honestly.

        Replays the last ``limit`` succeeded jobs in time: each is predicted at its
        submission from the jobs that finished before it, then learned. Figures:
        ``n``, ``mae_s``, ``mdape``, ``within_2x``, ``median_log2_ratio``, ``unpredicted``.
        """
        del principal  # aggregate figures only; no job of another team is revealed
        with self._db.unit_of_work(write=False) as s:
            history = _store.finished_runtimes(s, limit)
        records = [record_of(job, runtime) for job, runtime in history]
        return RuntimePredictor().evaluate_online(records)

    # ------------------------------------------------------------------ cost
    def cost_report(
        self,
        principal: Principal,
        *,
        by: str,
        since: datetime,
        until: datetime | None = None,
    ) -> list[CostLine]:
        """Usage and cost per ``by`` (team, pool, user or job) over [since, until)."""
        since = since if since.tzinfo else since.replace(tzinfo=UTC)
        until = until if until is None or until.tzinfo else until.replace(tzinfo=UTC)
        end = until or self._clock()
        if end - since > timedelta(days=3660) or since >= end:
            raise InvalidParameter("the period must be non-empty and at most ten years")
        with self._db.unit_of_work(write=False) as s:
            attempts = _store.attempts_overlapping(s, since, end, _visibility(principal))
        open_end = self._clock()
        closed = [a if a.ended_at else replace(a, ended_at=open_end) for a in attempts]
        return _cost.report(closed, self._pools, by=by, since=since, until=end)


def _require_job_submitter(principal: Principal | None) -> None:
    """Only who may submit a job may upload its code (up to a snapshot's 1 GiB): an admin,
    or a member (or more) of some team.

    Raises:
        PermissionDenied: a viewer-only account, or one in no team.
    """
    if principal is None or principal.user.is_admin:
        return
    if not any(role >= Role.MEMBER for role in principal.roles.values()):
        raise PermissionDenied(
            "uploading a job's code needs the member role in a team (jobs run for a team)"
        )


def job_finished(job: Job, actor: str) -> NewEvent:
    """The stream's ``job_finished`` event of a job that ended for good: here for a job
    cancelled before it started, by the live scheduler for the jobs it ran."""
    payload = {
        "job_id": job.id,
        "name": job.name,
        "team": job.team,
        "state": job.state.value,
        "exit_code": job.exit_code,
        "reason": job.reason[:200],
    }
    return NewEvent(EventKind.JOB_FINISHED, f"jobs:/{job.id}", job.team or None, actor, payload)
