"""The machinery every policy shares: order -> admit -> place -> preempt.

A policy (:mod:`shamal.scheduler.core._policies`) only says how jobs are ordered and when
one may preempt another; :func:`schedule` does the rest, the same way for the live
scheduler and the simulator:

1. **Order.** The queue is walked in the policy's order. Jobs are grouped by
   :func:`~shamal.scheduler.core._state.job_shape` (same request, pool and team); within a
   group the order is the policy's static ``order_key``, and the groups are merged by
   ``merge_key`` (which may change within a round, e.g. fair share). When the first
   waiting job of a group cannot start, no later job of that group can either (same
   request, same quota, no higher priority), so the whole group is skipped: a round
   costs O(groups + starts), not O(queue).
2. **Admit.** Team quotas (:mod:`shamal.scheduler.core._admission`): within the guarantee,
   by borrowing idle cohort quota, or wait. With quotas a round walks the queue twice:
   first every job that starts within its team's guarantee (a job that would borrow is
   put off), then the jobs put off, on what is left. So a lender's waiting job always
   gets its guaranteed capacity before another team borrows it (again).
3. **Place.** :func:`shamal.scheduler.core._placement.place`; a gang is all or nothing.
4. **Preempt.** If the job does not fit, running jobs it outranks are released
   tentatively, lowest first, until it fits (for whole GPUs: only victims on nodes
   that would then hold a worker). A job within its team's guarantee first reclaims
   capacity other teams of its cohort borrowed beyond theirs: their jobs that started
   on borrowed quota first, youngest first, and never so much that a team drops below
   its own guarantee. Preemption happens only when the job can then actually start
   (else everything is put back), and victims the final placement does not need are
   kept running. Jobs already told to stop (``SchedJob.stopping``) count as released
   first: if the job needs their capacity it waits for them to exit (no new
   preemption, no start), so a preemption that takes a while is never repeated on
   another victim.

Preemption never loops. A job may only preempt one it strictly outranks (a lower
priority class, or within its class a higher level of the policy: more attained service
for LAS, more remaining time for SRTF), only when it can then start, and a job that was
(re)started is protected for ``min_run_s``. Levels move one way (attained service grows,
a running job's remaining time shrinks), so a preempted job cannot displace the job that
displaced it until that one has passed it in attained service (LAS's intended time
sharing, at most once per threshold; with SRTF never). A round never preempts a job it
starts, and the failed preemption searches of a round are bounded
(``max_failed_searches``) so a long queue cannot make a round expensive.

Reclaim never loops either: jobs within their guarantee go before jobs that would
borrow (the two passes), and a team that capacity is reclaimed from borrows nothing
more in that pool in the same round nor while its preempted jobs are still stopping
(:attr:`~shamal.scheduler.core._admission.QuotaBook.no_borrow`), so a job preempted to give
quota back is not re-admitted on borrowed quota ahead of the lender, only to be
preempted again. Reclaim victims are chosen in a fixed order (borrowed first, then
lower classes, then the youngest), so repeated rounds while a victim stops pick it
again rather than another.

``decide`` is observationally pure: it places tentatively on the state's cluster
(allocate/release) and undoes every change before it returns.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from shamal.scheduler.core._admission import Admission, QuotaBook
from shamal.scheduler.core._placement import allocate, place, release
from shamal.scheduler.core._resources import (
    GPU_MILLI,
    Cluster,
    Node,
    Placement,
    Request,
    free_whole_gpus,
)
from shamal.scheduler.core._state import (
    Decision,
    Preempt,
    SchedJob,
    SchedulerState,
    Start,
    job_pool,
    job_shape,
    pools_in_regions,
)
from shamal.scheduler.core._strategies import gpu_allowed

__all__ = [
    "BasePolicy",
    "QueueWalk",
    "Round",
    "Work",
    "group_queue",
    "schedule",
]

Key = tuple[Any, ...]

_STOPPING = "stopping"
"""Reason of a tentative release of a job already told to stop (no new preemption)."""


class BasePolicy:
    """What a policy says; :func:`schedule` does the rest.

    Attributes:
        name: the registry name.
        preemptive: jobs of the same priority class preempt those of a higher
            :meth:`level` (e.g. more attained service).
        class_aware: order by priority class first.
        class_preemption: (with ``class_aware``) a class with ``preempts=True`` preempts
            ``preemptible`` jobs of lower classes.
        strict: stop at the first job that cannot start (head-of-line blocking, per
            team when quotas apply) instead of looking further down the queue.
        min_run_s: a started job is not preempted before it ran this long.
        max_failed_searches: a round stops looking for victims for a team's jobs after
            this many searches found no way to start one (the walk goes on without
            preemption; the next round, at the next event, tries again). Bounds the
            cost of a round when many jobs wait.
        needs: ``"oracle"`` (true runtimes: simulation only), ``"prediction"``
            (``SchedJob.predicted_s`` from the runtime predictor) or ``None``.
    """

    name = "base"
    preemptive = False
    class_aware = True
    class_preemption = True
    strict = False
    dynamic_merge = False
    min_run_s = 300.0
    max_failed_searches = 16
    needs: str | None = None
    description = ""

    # ------------------------------------------------------------- what policies say
    def order_key(self, job: SchedJob) -> Key:
        """The queue order (ascending: first to start); static while the job waits."""
        return (-job.priority.value if self.class_aware else 0, job.submitted_at, job.id)

    def merge_key(self, job: SchedJob, rnd: Round) -> Key:
        """The order across shape groups; ``order_key`` unless ``dynamic_merge``."""
        return self.order_key(job)

    def level(self, job: SchedJob, now: float) -> Any:
        """Within a class, a job may preempt one of a strictly higher level."""
        return 0

    def run_key(self, job: SchedJob, now: float) -> Key:
        """The victim order of running jobs (ascending: preempted first).

        Must list lower classes first and, within a class, higher levels first, so
        the search for victims stops at the first job the preemptor does not outrank.
        Valid from ``now`` until :meth:`revisit_at`.
        """
        started = job.started_at if job.started_at is not None else now
        return (job.priority.value, -started, job.id)

    def revisit_at(self, job: SchedJob, now: float) -> float | None:
        """When this running job's :meth:`run_key` or eligibility changes by itself.

        The simulator re-sorts the job then and runs a round; the live scheduler ticks
        anyway. Preemptive policies revisit when the start protection ends.
        """
        if self.preemptive and job.started_at is not None:
            end = job.started_at + self.min_run_s
            if end > now:
                return end
        return None

    # ------------------------------------------------------------- the round
    def decide(self, state: SchedulerState, now: float) -> list[Decision]:
        return schedule(self, state, now)

    def walk(self, rnd: Round) -> None:
        """Walk the queue and start what can start (backfill overrides this)."""
        walk = rnd.queue_walk()
        while (job := walk.peek()) is not None:
            if rnd.try_start(job):
                walk.advance()
            elif not self.strict:
                walk.drop()
            elif rnd.book is not None and rnd.book.active:
                walk.drop_team(job.team)
            else:
                break

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def schedule(policy: BasePolicy, state: SchedulerState, now: float) -> list[Decision]:
    """Run one scheduling round of ``policy``; the state is left unchanged."""
    if not state.queued:
        return []
    rnd = Round(policy, state, now)
    try:
        policy.walk(rnd)
        if rnd.open_borrowing():
            policy.walk(rnd)  # the jobs that would borrow, with what the first pass left
    finally:
        rnd.work.undo()
    return rnd.decisions


# ----------------------------------------------------------------- queue walk


def group_queue(queued: Iterable[SchedJob], key: Callable[[SchedJob], Key]) -> list[list[SchedJob]]:
    """The queue grouped by :func:`job_shape`, each group sorted by ``key``."""
    groups: dict[Hashable, list[SchedJob]] = {}
    for job in queued:
        groups.setdefault(job_shape(job), []).append(job)
    out = list(groups.values())
    for group in out:
        group.sort(key=key)
    return out


class QueueWalk:
    """A k-way merge of sorted groups where a whole group can be skipped at once.

    With a dynamic key (it may only grow within a round), a head whose key changed is
    pushed back before it is returned. Jobs whose ids are in ``skip`` are passed over.
    """

    def __init__(
        self,
        groups: Collection[Sequence[SchedJob]],
        key: Callable[[SchedJob], Key],
        *,
        dynamic: bool = False,
        skip: Collection[str] = (),
    ) -> None:
        self._groups = [g for g in groups if g]
        self._key = key
        self._dynamic = dynamic
        self._skip = skip
        self._heap: list[tuple[Key, int, int]] = [
            (key(g[0]), i, 0) for i, g in enumerate(self._groups)
        ]
        heapq.heapify(self._heap)

    def peek(self) -> SchedJob | None:
        heap = self._heap
        while heap:
            key, i, pos = heap[0]
            job = self._groups[i][pos]
            if self._skip and job.id in self._skip:
                self.advance()  # started by an earlier pass of the round
                continue
            if self._dynamic:
                fresh = self._key(job)
                if fresh != key:
                    heapq.heapreplace(heap, (fresh, i, pos))
                    continue
            return job
        return None

    def advance(self) -> None:
        """Move past the job :meth:`peek` returned (it started)."""
        _, i, pos = self._heap[0]
        group = self._groups[i]
        if pos + 1 < len(group):
            heapq.heapreplace(self._heap, (self._key(group[pos + 1]), i, pos + 1))
        else:
            heapq.heappop(self._heap)

    def drop(self) -> None:
        """Skip the rest of the group of the job :meth:`peek` returned."""
        heapq.heappop(self._heap)

    def drop_team(self, team: str) -> None:
        """Skip every group of ``team`` (groups are per team: see ``job_shape``)."""
        self._heap = [e for e in self._heap if self._groups[e[1]][0].team != team]
        heapq.heapify(self._heap)


# ----------------------------------------------------------------- tentative work


class Work:
    """Tentative placement on the live cluster, undone by :meth:`undo`."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._log: list[tuple[bool, Placement]] = []

    def place(self, job: SchedJob) -> Placement | None:
        if job.regions is None:
            return place(self.cluster, job.request, pool=job.pool)
        # Restricted to regions: the first of its allowed pools (by name) that holds it.
        for pool in pools_in_regions(self.cluster.pools, job.regions):
            if job.pool is None or job.pool == pool:
                found = place(self.cluster, job.request, pool=pool)
                if found is not None:
                    return found
        return None

    def take(self, placement: Placement) -> None:
        allocate(self.cluster, placement)
        self._log.append((True, placement))

    def try_take(self, placement: Placement) -> bool:
        """Take ``placement`` if every slot still fits (nothing changes otherwise)."""
        try:
            allocate(self.cluster, placement)
        except ValueError:
            return False
        self._log.append((True, placement))
        return True

    def give(self, placement: Placement) -> None:
        release(self.cluster, placement)
        self._log.append((False, placement))

    def undo(self) -> None:
        cluster = self.cluster
        for took, placement in reversed(self._log):
            if took:
                release(cluster, placement)
            else:
                allocate(cluster, placement)
        self._log.clear()


def _node_could_host(node: Node, request: Request) -> bool:
    """Whether an empty ``node`` could hold one worker of ``request`` (static check)."""
    if request.gpus:
        return len(node.gpus) >= request.gpus
    if request.gpu_milli or request.mig_profile is not None:
        return bool(node.gpus)
    return True


def _node_fits_now(node: Node, request: Request) -> bool:
    """Whether one worker of ``request`` fits on ``node`` as it is now (cheap check)."""
    if node.free_cpu_milli < request.cpu_milli or node.free_memory_mib < request.memory_mib:
        return False
    if request.gpus:
        whole = 0
        for gpu in node.gpus:
            if gpu.free_milli == GPU_MILLI and not gpu.mig_slices:
                whole += 1
        return whole >= request.gpus
    if request.gpu_milli:
        return any(g.free_milli >= request.gpu_milli and not g.mig_slices for g in node.gpus)
    return True


# ----------------------------------------------------------------- one round


class Round:
    """One scheduling round: the tentative state and the decisions so far."""

    def __init__(self, policy: BasePolicy, state: SchedulerState, now: float) -> None:
        self.policy = policy
        self.state = state
        self.now = now
        self.cluster = state.cluster
        self.work = Work(state.cluster)
        self.decisions: list[Decision] = []
        self.started: list[SchedJob] = []
        self.preempted: set[str] = set()
        self.extra: dict[str, Any] = {}
        """Scratch space for a policy's per-round bookkeeping."""
        self._ordered = state.ordered_by == policy.name
        self._running: Sequence[SchedJob] | None = None
        self._streams: dict[str | None, tuple[list[_Candidate], Iterator[SchedJob]]] = {}
        self._by_team: dict[str, list[SchedJob]] | None = None
        self._reclaim_by_team: dict[str, list[tuple[Key, _Candidate]]] = {}
        self._only_pool = next(iter(state.cluster.pools)) if len(state.cluster.pools) == 1 else None
        self.failed_searches: dict[str, int] = {}
        self._started_ids: set[str] = set()
        self.borrowing = not state.quotas
        """Whether jobs may start on borrowed quota: not in the first pass of a round
        with quotas (every job within its guarantee goes first), then in a second pass
        over the jobs the first one put off (see :meth:`open_borrowing`)."""
        self._deferred: set[str] = set()
        self._failed: set[str] = set()
        self._stopping = [job for job in state.stopping_jobs() if job.placement is not None]
        self.book: QuotaBook | None = None
        if state.quotas:
            self.book = QuotaBook(state.quotas, state.allocated_by_team())
            for job in self._stopping:
                pool = self.pool_of(job)
                if self.book.over_guarantee(job.team, pool):
                    self.book.no_borrow.add((job.team, pool))  # being reclaimed from

    # ------------------------------------------------------------- views
    def queue_walk(self) -> QueueWalk:
        policy = self.policy
        if self._ordered and self.state.queue_groups is not None:
            groups: Collection[Sequence[SchedJob]] = self.state.queue_groups
        else:
            groups = group_queue(self.state.queued, policy.order_key)
        skip = self._started_ids
        if policy.dynamic_merge:
            return QueueWalk(
                groups, lambda job: policy.merge_key(job, self), dynamic=True, skip=skip
            )
        return QueueWalk(groups, policy.order_key, skip=skip)

    def open_borrowing(self) -> bool:
        """End the first pass; whether a second one is needed (a job was put off because
        it would borrow). The second pass tries again only the jobs put off (and those
        the first did not reach): the others failed for reasons that starting more jobs
        cannot change."""
        if self.borrowing or not self._deferred:
            return False
        self.borrowing = True
        return True

    def running(self) -> Sequence[SchedJob]:
        """Running jobs in victim order (sorted once per round when not supplied)."""
        if self._running is None:
            if self._ordered:
                self._running = self.state.running
            else:
                now = self.now
                run_key = self.policy.run_key
                self._running = sorted(self.state.running, key=lambda j: run_key(j, now))
        return self._running

    def pool_of(self, job: SchedJob) -> str:
        if self._only_pool is not None:
            return self._only_pool
        return job_pool(self.cluster, job)

    # ------------------------------------------------------------- start one job
    def try_start(self, job: SchedJob) -> bool:
        """Admit, place (preempting if allowed) and record the start of ``job``.

        Until :attr:`borrowing` opens, a job that would borrow is put off (``False``)."""
        if self.book is None:
            return self._try_start(job)  # no quotas: one pass
        if self.borrowing and job.id in self._failed:
            return False  # failed in the first pass: starts since cannot have helped
        started = self._try_start(job)
        if started:
            self._started_ids.add(job.id)
        elif not self.borrowing and job.id not in self._deferred:
            self._failed.add(job.id)
        return started

    def _try_start(self, job: SchedJob) -> bool:
        book = self.book
        pool = self.pool_of(job)
        admission = self._admission(job, pool)
        if admission is None:
            return False
        placement = None if admission is Admission.WAIT else self.work.place(job)
        victims: list[tuple[SchedJob, str]] = []
        if placement is None:
            # Over quota (its team may make room by preempting its own lower jobs) or
            # no room: try preemption.
            found = self._preempt_for(job, pool, admission)
            if found is None:
                return False
            placement, victims = found
            if book is not None and pool:
                admission = book.admit(job, pool)
        else:
            self.work.take(placement)
        if book is not None and not pool:
            pool = self.cluster.nodes[placement.slots[0].node].pool
            verdict = self._admission(job, pool)
            if verdict is None or verdict is Admission.WAIT:
                # Undo this job only: its placement, then its victims in reverse.
                self.work.give(placement)
                self._restore(victim for victim, _ in reversed(victims))
                return False
            admission = verdict
        self._record_start(job, pool, placement, victims, admission)
        return True

    def _record_start(
        self,
        job: SchedJob,
        pool: str,
        placement: Placement,
        victims: list[tuple[SchedJob, str]],
        admission: Admission,
    ) -> None:
        """Record the preemption of ``victims`` and the start of ``job`` (already placed)
        and charge it to its team's quota."""
        book = self.book
        for victim, reason in victims:
            self.preempted.add(victim.id)
            self.decisions.append(Preempt(victim.id, reason))
            if reason == "reclaim" and book is not None:
                # Taken back from a borrower: it borrows nothing more here this round.
                book.no_borrow.add((victim.team, self.pool_of(victim)))
        self.decisions.append(Start(job.id, placement, borrowed=admission is Admission.BORROW))
        self.started.append(job)
        if book is not None and pool:
            book.charge(job, pool)

    def _admission(self, job: SchedJob, pool: str) -> Admission | None:
        """What quotas say about starting ``job`` in ``pool`` now; ``None`` when it cannot
        start in this pass: never, or it would borrow before borrowing opens (it is put
        off to the second pass)."""
        if self.book is None or not pool:
            return Admission.WITHIN
        admission = self.book.admit(job, pool)
        if admission is Admission.NEVER:
            return None
        if admission is Admission.BORROW and not self.borrowing:
            self._deferred.add(job.id)
            return None
        return admission

    # ------------------------------------------------------------- preemption
    def _candidate(self, i: int, team: str | None = None) -> _Candidate | None:
        """The ``i``-th running job (of ``team``, if given) that may be preempted at all
        now, in victim order, with what the search needs of it; computed lazily, once
        per round."""
        stream = self._streams.get(team)
        if stream is None:
            jobs = self.running() if team is None else self._team_jobs().get(team, ())
            stream = self._streams[team] = ([], iter(jobs))
        cands, source = stream
        if i < len(cands):
            return cands[i]
        for victim in source:
            cand = self._make_candidate(victim)
            if cand is not None:
                cands.append(cand)
                if i < len(cands):
                    return cand
        return None

    def _make_candidate(self, victim: SchedJob) -> _Candidate | None:
        held = victim.placement
        if held is None or not victim.priority.preemptible or victim.stopping:
            return None
        policy, now = self.policy, self.now
        started = victim.started_at
        if started is not None and now - started < policy.min_run_s:
            return None  # protected: it (re)started too recently
        nodes = self.cluster.nodes
        slots = held.slots
        widest = (
            len(nodes[slots[0].node].gpus)
            if len(slots) == 1
            else max(len(nodes[slot.node].gpus) for slot in slots)
        )
        level = policy.level(victim, now) if policy.preemptive else 0
        return _Candidate(victim, victim.priority.value, level, widest, self.pool_of(victim))

    def _team_jobs(self) -> dict[str, list[SchedJob]]:
        """The running jobs by team, each in victim order (grouped once per round)."""
        if self._by_team is None:
            self._by_team = {}
            for job in self.running():
                self._by_team.setdefault(job.team, []).append(job)
        return self._by_team

    def _victims(self, job: SchedJob, pool: str, reclaim: bool) -> Iterator[tuple[SchedJob, str]]:
        """The running jobs ``job`` may preempt, in the order to release them, with why.

        First the jobs already stopping (releasing them costs nothing: they are on their
        way out), then, when ``reclaim``, the jobs of cohort teams over their guarantee
        (:meth:`_reclaim_victims`), then the jobs ``job`` outranks (:meth:`_outranked`).
        In a quota-managed pool another team's job is only ever taken by reclaim.
        """
        book = self.book
        teams = book is not None and bool(pool) and book.managed(pool)
        ranked = self._outranked(job, pool, job.team if teams else None)
        if not self._stopping and not (reclaim and teams):
            return ranked
        parts: list[Iterator[tuple[SchedJob, str]]] = []
        if self._stopping:
            parts.append(self._stopping_victims(pool))
        if reclaim and book is not None and teams:
            parts.append((victim, "reclaim") for victim in self._reclaim_victims(job, pool, book))
        return itertools.chain(*parts, ranked)

    def _stopping_victims(self, pool: str) -> Iterator[tuple[SchedJob, str]]:
        """The jobs already told to stop (in ``pool``, if given) not released yet."""
        for victim in self._stopping:
            if victim.id not in self.preempted and (not pool or self.pool_of(victim) == pool):
                yield victim, _STOPPING

    def _outranked(
        self, job: SchedJob, pool: str, team: str | None
    ) -> Iterator[tuple[SchedJob, str]]:
        """The running jobs (of ``team``, if given) ``job`` outranks, in victim order: of
        a lower class (when its class preempts) or, with a preemptive policy, of its class
        at a strictly higher level. Victim order lists lower classes first and, within a
        class, higher levels first, so the search stops at the first victim ``job`` does
        not outrank."""
        policy = self.policy
        mine = job.priority.value
        by_class = policy.class_aware and policy.class_preemption and job.priority.preempts
        preemptive = policy.preemptive
        my_level = policy.level(job, self.now) if preemptive else 0
        width = job.request.gpus
        i = 0
        while (cand := self._candidate(i, team)) is not None:
            i += 1
            if cand.klass < mine:
                if not by_class:
                    continue
            elif cand.klass > mine or not preemptive or not my_level < cand.level:
                return
            if (pool and cand.pool != pool) or cand.widest < width:
                continue
            if cand.job.id not in self.preempted:
                yield cand.job, "priority"

    def _reclaimable(self, team: str) -> list[tuple[Key, _Candidate]]:
        """The running jobs of ``team`` that may be preempted now, in reclaim order:
        jobs started on borrowed quota first, then lower classes, then the youngest
        (sorted once per round and team, when first asked for)."""
        ordered = self._reclaim_by_team.get(team)
        if ordered is None:
            i = 0
            while self._candidate(i, team) is not None:
                i += 1  # the team's every candidate, computed once
            now = self.now
            ordered = []
            for cand in self._streams[team][0]:
                victim = cand.job
                started = victim.started_at if victim.started_at is not None else now
                key = (not victim.borrowed, cand.klass, -started, victim.id)
                ordered.append((key, cand))
            ordered.sort(key=lambda entry: entry[0])
            self._reclaim_by_team[team] = ordered
        return ordered

    def _reclaim_victims(self, job: SchedJob, pool: str, book: QuotaBook) -> Iterator[SchedJob]:
        """The jobs ``job`` may take back: of the other teams of its cohort running over
        their guarantee in ``pool``, in reclaim order (:meth:`_reclaimable`), each only
        while its team is still over its guarantee."""
        teams = sorted(
            team
            for team in book.borrowers(pool)
            if team != job.team and _same_cohort(book, job.team, team, pool)
        )
        width = job.request.gpus
        for _, cand in heapq.merge(*(self._reclaimable(team) for team in teams)):
            victim = cand.job
            if (
                cand.pool == pool
                and cand.widest >= width
                and victim.id not in self.preempted
                and book.over_guarantee(victim.team, pool)
            ):
                yield victim

    def _preempt_for(
        self, job: SchedJob, pool: str, admission: Admission
    ) -> tuple[Placement, list[tuple[SchedJob, str]]] | None:
        """Release victims tentatively until ``job`` fits; ``None`` (nothing changed)
        when it cannot fit even then. On success the placement is taken."""
        policy = self.policy
        book = self.book
        reclaim = self._may_reclaim(job, pool, admission)
        if not (policy.preemptive or (policy.class_aware and policy.class_preemption) or reclaim):
            return None
        failed = self.failed_searches.get(job.team, 0)
        if failed >= policy.max_failed_searches:
            return None  # enough fruitless searches this round; the next round tries again
        quota_bound = book is not None and admission is Admission.WAIT
        released, placement = self._release_until_fits(job, pool, reclaim, quota_bound)
        if placement is None:
            self._restore(victim for victim, _ in reversed(released))
            self.failed_searches[job.team] = failed + 1
            return None
        self.work.take(placement)
        needed = self._keep_spared(job, pool, released, quota_bound)
        if any(reason == _STOPPING for _, reason in needed):
            # It needs the capacity of jobs still stopping: it waits for them to exit
            # rather than preempt anything more (the next round sees them gone).
            self.work.give(placement)
            self._restore(victim for victim, _ in reversed(needed))
            self.failed_searches[job.team] = failed + 1
            return None
        return placement, needed

    def _may_reclaim(self, job: SchedJob, pool: str, admission: Admission) -> bool:
        """Whether ``job``, admitted within its team's guarantee in the quota-managed
        ``pool``, may take capacity back from other teams borrowing there."""
        book = self.book
        return (
            book is not None
            and bool(pool)
            and admission is Admission.WITHIN
            and book.managed(pool)
            and bool(book.borrowers(pool) - {job.team})
        )

    def _release_until_fits(
        self, job: SchedJob, pool: str, reclaim: bool, quota_bound: bool
    ) -> tuple[list[tuple[SchedJob, str]], Placement | None]:
        """Release victims until ``job`` can be placed (and, when ``quota_bound``, its
        team's quota admits it); returns the victims released so far and the placement.

        Whole-GPU requests look at victims in victim order but release only those on
        nodes that would then hold a worker (see :class:`_NodeGains`), so freeing GPUs
        scattered over nodes that cannot host the job costs nothing; other requests
        release victims in victim order and try to place after each.
        """
        if job.request.gpus and not quota_bound:
            return self._release_on_nodes(job, pool, reclaim)
        request = job.request
        nodes = self.cluster.nodes
        released: list[tuple[SchedJob, str]] = []
        room = False
        for victim, reason in self._victims(job, pool, reclaim):
            held = victim.placement
            assert held is not None  # noqa: S101 - _victims yields placed jobs
            slot_nodes = [nodes[slot.node] for slot in held.slots]
            if not any(_node_could_host(node, request) for node in slot_nodes):
                continue  # freeing it would never help
            self._release(victim, reason, released)
            room = room or any(_node_fits_now(node, request) for node in slot_nodes)
            if room and (not quota_bound or self._admissible(job, pool)):
                placement = self.work.place(job)
                if placement is not None:
                    return released, placement
        return released, None

    def _release_on_nodes(
        self, job: SchedJob, pool: str, reclaim: bool
    ) -> tuple[list[tuple[SchedJob, str]], Placement | None]:
        gains = _NodeGains(self.cluster, job.request)
        released: list[tuple[SchedJob, str]] = []
        for victim, reason in self._victims(job, pool, reclaim):
            if not gains.add(victim, reason):
                continue
            for ready_victim, ready_reason in gains.take_ready():
                self._release(ready_victim, ready_reason, released)
            placement = self.work.place(job)
            if placement is not None:
                return released, placement
        return released, None

    def _release(self, victim: SchedJob, reason: str, released: list[tuple[SchedJob, str]]) -> None:
        assert victim.placement is not None  # noqa: S101 - victims are placed
        self.work.give(victim.placement)
        if self.book is not None:
            self.book.refund(victim, self.pool_of(victim))
        released.append((victim, reason))

    def _keep_spared(
        self, job: SchedJob, pool: str, released: list[tuple[SchedJob, str]], quota_bound: bool
    ) -> list[tuple[SchedJob, str]]:
        """Put back every released victim the placement (and the team's quota) can
        spare; the victims that must really be preempted, in release order."""
        work, book = self.work, self.book
        needed: list[tuple[SchedJob, str]] = []
        for victim, reason in reversed(released):
            assert victim.placement is not None  # noqa: S101 - released ones are placed
            if not work.try_take(victim.placement):
                needed.append((victim, reason))
                continue
            if book is not None:
                victim_pool = self.pool_of(victim)
                book.charge(victim, victim_pool)
                if quota_bound and not self._admissible(job, pool):
                    work.give(victim.placement)
                    book.refund(victim, victim_pool)
                    needed.append((victim, reason))
        needed.reverse()
        return needed

    def _admissible(self, job: SchedJob, pool: str) -> bool:
        if self.book is None or not pool:
            return True
        verdict = self.book.admit(job, pool)
        return verdict is Admission.WITHIN or verdict is Admission.BORROW

    def _restore(self, victims: Iterable[SchedJob]) -> None:
        """Put tentatively released victims back (in the order given)."""
        for victim in victims:
            assert victim.placement is not None  # noqa: S101 - running jobs are placed
            self.work.take(victim.placement)
            if self.book is not None:
                self.book.charge(victim, self.pool_of(victim))


@dataclass(slots=True)
class _Candidate:
    """A running job that may be preempted this round, and what the search needs."""

    job: SchedJob
    klass: int
    level: Any
    widest: int
    """GPUs of the largest node it runs on."""
    pool: str


class _NodeGains:
    """What preempting candidate victims would free per node, for a whole-GPU request.

    :meth:`add` counts a victim's GPUs, CPU and memory on each node that could host a
    worker; once the nodes could hold all the request's workers (free capacity plus
    what their candidates hold), :meth:`take_ready` hands over the candidates on those
    nodes to release. Fractional and MIG slots free no whole GPU and count as none.
    """

    def __init__(self, cluster: Cluster, request: Request) -> None:
        self.nodes = cluster.nodes
        self.request = request
        self.gain: dict[str, list[int]] = {}
        self.waiting: dict[str, list[tuple[SchedJob, str]]] = {}
        self.workers: dict[str, int] = {}
        self.total = 0
        self.taken: set[str] = set()

    def _capacity(self, node: Node, gain: list[int]) -> int:
        request = self.request
        whole = free_whole_gpus(node) + gain[0]
        count = whole // request.gpus
        if request.cpu_milli:
            count = min(count, (node.free_cpu_milli + gain[1]) // request.cpu_milli)
        if request.memory_mib:
            count = min(count, (node.free_memory_mib + gain[2]) // request.memory_mib)
        return max(count, 0)

    def add(self, victim: SchedJob, reason: str) -> bool:
        """Count ``victim``; whether the nodes could now hold every worker."""
        assert victim.placement is not None  # noqa: S101 - victims are placed
        useful = False
        for slot in victim.placement.slots:
            node = self.nodes[slot.node]
            if len(node.gpus) < self.request.gpus or not _allowed_models(node, self.request):
                continue
            gain = self.gain.setdefault(node.name, [0, 0, 0])
            whole = slot.gpu_milli == 0 and slot.mig_profile is None
            gain[0] += len(slot.gpus) if whole else 0
            gain[1] += slot.cpu_milli
            gain[2] += slot.memory_mib
            waiting = self.waiting.setdefault(node.name, [])
            if not waiting or waiting[-1][0] is not victim:
                waiting.append((victim, reason))
            capacity = self._capacity(node, gain)
            self.total += capacity - self.workers.get(node.name, 0)
            self.workers[node.name] = capacity
            useful = True
        return useful and self.total >= self.request.workers

    def take_ready(self) -> list[tuple[SchedJob, str]]:
        """The candidates on nodes that can hold a worker, not handed over before."""
        ready: list[tuple[SchedJob, str]] = []
        for name, capacity in self.workers.items():
            if capacity <= 0:
                continue
            self.gain[name] = [0, 0, 0]  # released now: counted in the node's free capacity
            for victim, reason in self.waiting.pop(name, []):
                if victim.id not in self.taken:
                    self.taken.add(victim.id)
                    ready.append((victim, reason))
        return ready


def _allowed_models(node: Node, request: Request) -> bool:
    """Whether some GPU of ``node`` is of a model, and has the memory, the request allows."""
    if not (request.gpu_models or request.gpu_memory_mib):
        return True
    return any(gpu_allowed(g, request) for g in node.gpus)


def _same_cohort(book: QuotaBook, team: str, other: str, pool: str) -> bool:
    mine = book.quotas.get((team, pool))
    theirs = book.quotas.get((other, pool))
    return (mine.cohort if mine else "default") == (theirs.cohort if theirs else "default")
