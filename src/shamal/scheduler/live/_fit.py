"""Whether a job could ever run, and what a queued job waits for.

A job that no node of its pool could hold with the whole cluster idle (for a gang: no
set of nodes), or that needs more than its team's quota plus borrow limit, would stay
queued forever; submission refuses it and says why. The verdict comes from the
placement and admission code the scheduler itself runs (:func:`place`,
:class:`QuotaBook`), asked about an idle copy of the configured cluster, so the two
never disagree. The explanation (which resource, what the largest node offers) is
worked out afterwards, for the message only.

For queued jobs the same code tells, given the jobs holding resources now, whether a
job waits for quota, for resources, for capacity its team is guaranteed to be taken
back from teams borrowing it (reclaim), or only for the scheduler's next pass. The
scheduler's policy may still order it behind other jobs: that part is decided in the
scheduler loop, which records no reason for leaving a job queued.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

from shamal.config import SchedulerSettings
from shamal.jobs import Job, duration_text, placement_from_json, request_of
from shamal.scheduler.core import (
    DEFAULT_POLICY,
    GPU_MILLI,
    Admission,
    Cluster,
    Gpu,
    Node,
    Placement,
    Pool,
    PriorityClass,
    QuotaBook,
    Request,
    Resources,
    SchedJob,
    Slot,
    TeamQuota,
    allocate,
    device_memory_mib,
    get_policy,
    mig_share_milli,
    place,
    pools_in_regions,
    profiles_for,
)

__all__ = [
    "DEVICE_MEMORY_ENV",
    "ClusterCapacity",
    "cluster_capacity",
    "device_memory_env",
    "fits_beside",
    "held_by",
    "quotas_of",
]

DEVICE_MEMORY_ENV = "SHAMAL_DEVICE_MEMORY_MIB"
"""The variable a job's workers get: memory per device of their placement (``shamal.train``
reads it to choose between DDP, FSDP and pipeline stages)."""

logger = logging.getLogger(__name__)


def quotas_of(settings: SchedulerSettings) -> dict[tuple[str, str], TeamQuota]:
    """Configured quotas as the scheduler core's values (as the scheduler loop reads them)."""
    return {
        (q.team, q.pool): TeamQuota(
            team=q.team,
            pool=q.pool,
            guaranteed=Resources(round(q.cpus * 1000), q.memory_mib, round(q.gpus * 1000)),
            borrow_limit=Resources(
                round(q.borrow_cpus * 1000), q.borrow_memory_mib, round(q.borrow_gpus * 1000)
            ),
            cohort=q.cohort,
            weight=q.weight,
        )
        for q in settings.quotas
    }


def _idle(node: Node) -> Node:
    """A copy of ``node`` with nothing allocated."""
    gpus = [Gpu(g.index, g.model, g.memory_mib, g.uuid, mig_slices=g.mig_slices) for g in node.gpus]
    return Node(node.name, node.pool, node.cpu_milli, node.memory_mib, gpus, dict(node.labels))


def _gib(memory_mib: int) -> str:
    return f"{memory_mib / 1024:.1f}".removesuffix(".0") + " GiB"


def _cpus(cpu_milli: int) -> str:
    cpus = cpu_milli / 1000
    return f"{cpus:g} CPU" + ("" if cpus == 1 else "s")


def _offer(node: Node) -> str:
    """What one node offers, the way a refusal names it: '8 CPUs, 32 GiB, 2 GPUs (A100)'."""
    parts = [_cpus(node.cpu_milli), _gib(node.memory_mib)]
    plain = sorted({g.model for g in node.gpus if not g.mig_slices})
    whole = sum(1 for g in node.gpus if not g.mig_slices)
    if whole:
        parts.append(f"{whole} GPU{'s' if whole > 1 else ''} ({', '.join(plain)})")
    partitioned = [g for g in node.gpus if g.mig_slices]
    if partitioned:
        parts.append(f"{len(partitioned)} MIG-partitioned GPU{'s' if len(partitioned) > 1 else ''}")
    return ", ".join(parts)


def _needs(request: Request) -> str:
    """What one worker asks for: '4 CPUs, 16 GiB and 1 GPU'."""
    parts = [_cpus(request.cpu_milli), _gib(request.memory_mib)]
    if request.gpus:
        parts.append(f"{request.gpus} GPU{'s' if request.gpus > 1 else ''}")
    elif request.gpu_milli:
        parts.append(f"{request.gpu_milli / GPU_MILLI:g} of a GPU")
    elif request.mig_profile is not None:
        parts.append(f"a {request.mig_profile} MIG slice")
    if request.gpu_memory_mib:
        parts[-1] += f" with {_gib(request.gpu_memory_mib)} of memory"
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def _amount(resources: Resources, mask: Resources) -> str:
    """The limited components of ``resources`` (those ``mask`` sets)."""
    parts = []
    if mask.cpu_milli:
        parts.append(_cpus(resources.cpu_milli))
    if mask.memory_mib:
        parts.append(_gib(resources.memory_mib))
    if mask.gpu_milli:
        parts.append(f"{resources.gpu_milli / GPU_MILLI:g} GPUs")
    return ", ".join(parts)


def _allowed(gpu: Gpu, request: Request) -> bool:
    return not request.gpu_models or gpu.model in request.gpu_models


def _gpu_problem(request: Request, pool: str, nodes: Sequence[Node]) -> str | None:
    """Why no GPU of ``pool`` could ever serve the request's GPU form (None: some could)."""
    if not (request.gpus or request.gpu_milli or request.mig_profile is not None):
        return None
    gpus = [g for node in nodes for g in node.gpus]
    allowed = [g for g in gpus if _allowed(g, request)]
    if not allowed:
        return _model_problem(request, pool, gpus)
    problem = _gpu_form_problem(request, pool, nodes, allowed)
    if problem is None and request.gpu_memory_mib:
        problem = _memory_problem(request, pool, allowed)
    return problem


def _memory_problem(request: Request, pool: str, allowed: Sequence[Gpu]) -> str | None:
    """Why no GPU of ``pool`` gives a worker the device memory it asks for (None: some does)."""
    most = max(device_memory_mib(g, request) for g in allowed)
    if most >= request.gpu_memory_mib:
        return None
    return (
        f"no GPU of pool {pool!r} gives a worker {_gib(request.gpu_memory_mib)} of device "
        f"memory (at most {_gib(most)} for this request): lower --gpu-memory, ask for a "
        "larger share of a GPU, or split the model into more pipeline stages"
    )


def _model_problem(request: Request, pool: str, gpus: Sequence[Gpu]) -> str:
    """Why none of ``gpus``, the GPUs of ``pool``, is of a model the request allows."""
    if not gpus:
        return f"pool {pool!r} has no GPUs"
    wanted = ", ".join(sorted(request.gpu_models))
    models = ", ".join(sorted({g.model for g in gpus}))
    return f"pool {pool!r} has no {wanted} GPU (it has {models})"


def _gpu_form_problem(
    request: Request, pool: str, nodes: Sequence[Node], allowed: Sequence[Gpu]
) -> str | None:
    """Why the GPUs of ``pool`` of an allowed model (``allowed``) could never serve the
    request's form: a MIG slice, whole GPUs or a fraction (None: they could)."""
    offered = sorted({name for g in allowed for name in profiles_for(g)}, key=_profile_order)
    if request.mig_profile is not None:
        return _mig_problem(request.mig_profile, pool, offered)
    if all(g.mig_slices for g in allowed):
        slices = f" ({', '.join(offered)})" if offered else ""
        return f"the GPUs of pool {pool!r} are MIG-partitioned: ask for a slice with --mig{slices}"
    return _whole_gpu_problem(request, pool, nodes)


def _mig_problem(profile: str, pool: str, offered: Sequence[str]) -> str | None:
    """Why no GPU of ``pool`` offers a MIG slice ``profile`` (None: one does)."""
    if profile in offered:
        return None
    if not offered:
        return f"pool {pool!r} has no MIG-partitioned GPU: ask for --gpus or --gpu-fraction"
    return f"no GPU of pool {pool!r} offers MIG slice {profile} ({', '.join(offered)})"


def _whole_gpu_problem(request: Request, pool: str, nodes: Sequence[Node]) -> str | None:
    """Why no node of ``pool`` holds the whole GPUs a worker asks for (None: one does)."""
    most = max(
        sum(1 for g in node.gpus if _allowed(g, request) and not g.mig_slices) for node in nodes
    )
    if request.gpus > most:
        return f"{request.gpus} GPUs per worker is more than any node of pool {pool!r} has ({most})"
    return None


def _profile_order(name: str) -> tuple[int, str]:
    try:
        return mig_share_milli(name.split("+", 1)[0]), name
    except ValueError:
        return GPU_MILLI, name


class ClusterCapacity:
    """The configured cluster, idle: what jobs could ever get (see the module docstring).

    Thread-safe: the idle cluster is only read, under a lock (placement caches its index
    on the cluster).
    """

    def __init__(
        self,
        pools: Iterable[Pool],
        nodes: Iterable[Node],
        quotas: Mapping[tuple[str, str], TeamQuota],
        *,
        protected_s: float = 0.0,
    ) -> None:
        """``protected_s``: how long the policy protects a started job from preemption
        (its ``min_run_s``), which a job reclaiming its team's quota waits out."""
        self._pools = list(pools)
        self._protected_s = protected_s
        self._nodes = [_idle(node) for node in nodes]
        self._quotas = dict(quotas)
        self._idle = Cluster.of(self._pools, [_idle(node) for node in self._nodes])
        self._lock = threading.Lock()

    def _quota_pool(self, pool: str | None) -> str:
        """The pool quotas are checked in before a job is placed (the scheduler's rule):
        the one it names, else the cluster's only pool; '' when that is not known yet."""
        if pool is not None:
            return pool
        return self._pools[0].name if len(self._pools) == 1 else ""

    def refusal(self, request: Request, pool: str | None, team: str) -> str | None:
        """Why a job of ``team`` asking ``request`` in ``pool`` (None: any pool) could
        never start, or None when it could (on an idle cluster)."""
        with self._lock:
            return self._refusal(request, pool, team)

    def pools_for(self, request: Request, team: str) -> list[str]:
        """The pools a job of ``team`` asking ``request`` and naming no pool could ever
        start in: one of its nodes holds it, and the team's quota there admits it."""
        with self._lock:
            return [
                p.name
                for p in self._pools
                if place(self._idle, request, pool=p.name) is not None
                and QuotaBook(self._quotas, {}).admit(_sched(request, team, p.name), p.name)
                is not Admission.NEVER
            ]

    def _refusal(self, request: Request, pool: str | None, team: str) -> str | None:
        if place(self._idle, request, pool=pool) is None:
            return self._why_not_placed(request, pool)
        quota_pool = self._quota_pool(pool)
        if not quota_pool:
            return None
        verdict = QuotaBook(self._quotas, {}).admit(_sched(request, team, pool), quota_pool)
        if verdict is not Admission.NEVER:
            return None
        quota = self._quotas[(team, quota_pool)]
        limit = quota.guaranteed + quota.borrow_limit
        return (
            f"team {team!r} may hold at most {_amount(limit, limit)} in pool {quota_pool!r} "
            f"(its quota plus what it may borrow) and the job needs "
            f"{_amount(request.total, limit)}: ask for less, or for a larger quota"
        )

    def _why_not_placed(self, request: Request, pool: str | None) -> str:
        names = [pool] if pool is not None else [p.name for p in self._pools]
        reasons = [self._why_not_in(request, name) for name in names]
        if len(reasons) == 1:
            problem, offer = reasons[0]
            reason = f"{problem}; the largest node offers {offer}" if offer else problem
        else:
            reason = "no pool could ever hold it: " + "; ".join(
                f"{problem} (largest node: {offer})" if offer else problem
                for problem, offer in reasons
            )
        others = [
            p.name
            for p in self._pools
            if pool is not None and p.name != pool and place(self._idle, request, pool=p.name)
        ]
        if others:
            reason += f" (it would fit in pool {others[0]!r}: --pool {others[0]})"
        return reason

    def _why_not_in(self, request: Request, pool: str) -> tuple[str, str]:
        """Which resource ``pool`` lacks for ``request``, and what its largest node offers."""
        nodes = self._idle.pool_nodes(pool)
        if not nodes:
            return f"pool {pool!r} has no nodes", ""
        largest = max(nodes, key=lambda n: (len(n.gpus), n.cpu_milli, n.memory_mib, n.name))
        offer = _offer(largest)
        problem = _gpu_problem(request, pool, nodes)
        if problem is not None:
            return problem, offer
        beyond = f"per worker is more than any node of pool {pool!r} has"
        if request.cpu_milli > max(n.cpu_milli for n in nodes):
            return f"{_cpus(request.cpu_milli)} {beyond}", offer
        if request.memory_mib > max(n.memory_mib for n in nodes):
            return f"{_gib(request.memory_mib)} {beyond}", offer
        one = dataclasses.replace(request, workers=1)
        if place(self._idle, one, pool=pool) is None:
            return f"no node of pool {pool!r} has {_needs(request)} together", offer
        low, high = 1, request.workers - 1  # the most workers it holds at once: bisect
        while low < high:
            middle = (low + high + 1) // 2
            if place(self._idle, dataclasses.replace(request, workers=middle), pool=pool):
                low = middle
            else:
                high = middle - 1
        gang = (
            f"pool {pool!r} holds at most {low} of the gang's {request.workers} workers "
            f"at once (each: {_needs(request)})"
        )
        return gang, offer

    def waiting(self, queued: Sequence[Job], active: Sequence[Job]) -> dict[str, str]:
        """What each queued job waits for, given the jobs holding resources now."""
        with self._lock:
            now = Cluster.of(self._pools, [_idle(node) for node in self._nodes])
            held: dict[tuple[str, str], Resources] = {}
            for job in active:
                if not job.placement:
                    continue
                placement = placement_from_json(job.placement)
                try:
                    allocate(now, placement)
                except (ValueError, KeyError):  # placed on a node no longer configured
                    continue
                key = (job.team, now.nodes[placement.slots[0].node].pool)
                held[key] = held.get(key, Resources()) + request_of(job).total
            book = QuotaBook(self._quotas, held)
            seen: dict[tuple[object, ...], str] = {}
            reasons: dict[str, str] = {}
            for job in queued:
                request = request_of(job)
                shape = (request, job.pool, job.team, job.regions)
                if shape not in seen:
                    if job.regions is not None and job.pool is None:
                        seen[shape] = self._waiting_in(now, book, request, job.team, job.regions)
                    else:
                        seen[shape] = self._waiting(now, book, request, job.pool, job.team)
                reasons[job.id] = seen[shape]
            return reasons

    def _waiting_in(
        self, now: Cluster, book: QuotaBook, request: Request, team: str, regions: Iterable[str]
    ) -> str:
        """What a job held to ``regions`` (by the residency of the data it reads) waits for:
        the first of their pools that would take it now, else the first one's reason."""
        pools = pools_in_regions(now.pools, set(regions))
        reasons = [self._waiting(now, book, request, pool, team) for pool in pools]
        ready = [reason for reason in reasons if reason.startswith("waiting for the scheduler")]
        said = (ready or reasons or ["can never start: no pool is in its regions"])[0]
        return f"{said} (the data it reads holds it to pool(s) {', '.join(pools) or 'none'})"

    def _waiting(
        self, now: Cluster, book: QuotaBook, request: Request, pool: str | None, team: str
    ) -> str:
        never = self._refusal(request, pool, team)
        if never is not None:
            return f"can never start: {never}"
        quota_pool = self._quota_pool(pool)
        if quota_pool and book.admit(_sched(request, team, pool), quota_pool) is Admission.WAIT:
            return (
                f"waiting for quota: team {team!r} holds its share of pool {quota_pool!r}; "
                "the job starts when the team's jobs there end or idle quota can be borrowed"
            )
        if place(now, request, pool=pool) is None:
            reclaim = self._reclaim(book, request, quota_pool, team)
            if reclaim is not None:
                return reclaim
            where = f"pool {pool!r}" if pool is not None else "the cluster"
            return (
                f"waiting for resources: no node of {where} has {_needs(request)} free now; "
                "it starts when running jobs end (or are preempted for it)"
            )
        return (
            "waiting for the scheduler: resources and quota allow it now; it starts on the "
            "next pass unless jobs ahead of it take them"
        )

    def _reclaim(self, book: QuotaBook, request: Request, pool: str, team: str) -> str | None:
        """Why a job within its team's guarantee waits while other teams of its cohort
        borrow that pool (the scheduler takes the capacity back by preemption), or None."""
        quota = self._quotas.get((team, pool))
        if quota is None or book.admit(_sched(request, team, pool), pool) is not Admission.WITHIN:
            return None
        borrowers = sorted(
            other
            for other in book.borrowers(pool) - {team}
            if (self._quotas.get((other, pool)) or _NO_QUOTA).cohort == quota.cohort
        )
        if not borrowers:
            return None
        names = ", ".join(repr(other) for other in borrowers)
        teams = f"team {names} borrows" if len(borrowers) == 1 else f"teams {names} borrow"
        when = (
            f"once they have run {duration_text(self._protected_s)} (a started job is protected "
            "that long)"
            if self._protected_s
            else "on its next passes"
        )
        return (
            f"waiting for reclaim: team {team!r} is within its guaranteed quota of pool "
            f"{pool!r}, which {teams} now; the scheduler preempts their jobs there for it "
            f"{when}"
        )


_NO_QUOTA = TeamQuota(team="", pool="", guaranteed=Resources(), borrow_limit=Resources())
"""A team without a quota in a pool: the scheduler counts it in the default cohort."""


def _sched(request: Request, team: str, pool: str | None) -> SchedJob:
    """The scheduler core's view of a job: enough for the quota book."""
    return SchedJob(
        id="",
        team=team,
        request=request,
        submitted_at=0.0,
        priority=PriorityClass("", 0),
        pool=pool,
    )


def _protection_of(settings: SchedulerSettings) -> float:
    """How long the configured policy protects a started job from preemption."""
    try:
        return get_policy(settings.policy or DEFAULT_POLICY, **settings.policy_options).min_run_s
    except ValueError:  # the scheduler refuses these settings when it starts, saying why
        return 0.0


def cluster_capacity(settings: SchedulerSettings, cluster: Cluster) -> ClusterCapacity | None:
    """What jobs people submit could ever get on ``cluster`` under ``settings`` (quotas, the
    policy's protection of started jobs); None for a cluster without nodes, where nothing is
    checked."""
    if not cluster.nodes:
        return None
    return ClusterCapacity(
        cluster.pools.values(),
        cluster.nodes.values(),
        quotas_of(settings),
        protected_s=_protection_of(settings),
    )


def held_by(template: Cluster, active: Sequence[Job]) -> Cluster:
    """A copy of ``template`` with every active job's placement taken (a placement this
    cluster cannot hold is logged and left out)."""
    cluster = copy.deepcopy(template)
    for job in active:
        if not job.placement:
            continue
        try:
            allocate(cluster, placement_from_json(job.placement))
        except (ValueError, KeyError):
            logger.warning("job %s holds a placement this cluster cannot hold", job.id)
    return cluster


def fits_beside(template: Cluster, placement: Placement) -> Callable[[Sequence[Job]], bool]:
    """Whether ``placement`` still fits on ``template`` beside the jobs holding resources:
    what :meth:`JobLifecycle.admit` asks under the scheduling lock, where another scheduler
    may have claimed capacity since this one decided."""

    def fits(active: Sequence[Job]) -> bool:
        try:
            allocate(held_by(template, active), placement)
        except (ValueError, KeyError):
            return False
        return True

    return fits


def _slot_device_mib(node: Node, slot: Slot, request: Request) -> int:
    """Memory of the device one slot gives its worker: the smallest of its GPUs' shares,
    or the slot's host memory when it has no GPU."""
    gpus = [g for g in node.gpus if g.index in slot.gpus]
    if not gpus:
        return slot.memory_mib
    return min(device_memory_mib(g, request) for g in gpus)


def device_memory_env(template: Cluster, placement: Placement, request: Request) -> dict[str, str]:
    """``{DEVICE_MEMORY_ENV: MiB}``: the smallest device of ``placement`` (every stage of a
    pipeline must fit the smallest one); empty when a slot's node is unknown."""
    sizes = []
    for slot in placement.slots:
        node = template.nodes.get(slot.node)
        if node is None:
            return {}
        sizes.append(_slot_device_mib(node, slot, request))
    return {DEVICE_MEMORY_ENV: str(min(sizes))} if sizes else {}
