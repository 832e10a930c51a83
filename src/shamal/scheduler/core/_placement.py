"""GPU placement: where a request fits, and the bookkeeping of holding it.

``place`` answers where a request (one worker, or a gang of workers) would run without
changing the cluster; ``allocate`` makes a placement hold its resources and ``release``
gives them back. Both keep the cluster's free-capacity index current, so ``place``
for whole GPUs only looks at nodes with enough free whole GPUs and gives up at once
when the pool's running total of free GPUs is too small.

How a node and a GPU are chosen among those that fit is a *strategy*, chosen by name
(see :mod:`shamal.scheduler.core._strategies`); the default, ``fgd-pack``, is
fragmentation-aware (FGD). Nodes in the same state are scored once per request
(the index groups them), so placement costs per distinct node state, not per node.

Not thread-safe: one cluster is placed on and mutated by one thread at a time.
"""

from __future__ import annotations

import logging

from shamal.scheduler.core import _mig
from shamal.scheduler.core._resources import (
    GPU_MILLI,
    Cluster,
    FreeIndex,
    Gpu,
    Node,
    Placement,
    Request,
    Slot,
    mig_share_milli,
)
from shamal.scheduler.core._strategies import (
    DEFAULT_STRATEGY,
    STRATEGIES,
    Option,
    Strategy,
    gpu_allowed,
    mig_choice,
    node_options,
    strategy_named,
    whole_free,
)

__all__ = [
    "DEFAULT_STRATEGY",
    "STRATEGIES",
    "allocate",
    "make_slot",
    "node_options",
    "place",
    "release",
]

logger = logging.getLogger(__name__)


def _capacity(node: Node, request: Request, limit: int) -> int:
    """How many workers of ``request`` fit on ``node`` together (at most ``limit``)."""
    count = limit
    if request.cpu_milli:
        count = min(count, node.free_cpu_milli // request.cpu_milli)
    if request.memory_mib:
        count = min(count, node.free_memory_mib // request.memory_mib)
    if count <= 0:
        return 0
    if request.gpus:
        return min(count, len(whole_free(node.gpus, request)) // request.gpus)
    if request.gpu_milli or request.mig_profile is not None:
        return len(_node_slots(node, request, count, partial=True))
    return count


def _node_slots(node: Node, request: Request, count: int, *, partial: bool = False) -> list[Slot]:
    """Slots for ``count`` workers of ``request`` on ``node`` (fewer only if ``partial``).

    Works on a copy of the GPUs' free capacity; the node is not changed.
    """
    gpus = [
        Gpu(g.index, g.model, g.memory_mib, g.uuid, g.free_milli, g.mig_slices, g.mig_used)
        for g in node.gpus
    ]
    slots: list[Slot] = []
    whole = whole_free(node.gpus, request) if request.gpus else []
    for _ in range(count):
        option: Option | None
        if request.gpus:
            option = Option(tuple(whole[: request.gpus])) if len(whole) >= request.gpus else None
            whole = whole[request.gpus :]
        else:
            option = _shared_option(gpus, request)
        if option is None:
            break
        slot = make_slot(node, request, option)
        _apply_gpus(node.name, gpus, slot, take=True)
        slots.append(slot)
    if len(slots) < count and not partial:
        return []
    return slots


def _shared_option(gpus: list[Gpu], request: Request) -> Option | None:
    """The option for one worker of ``request`` that asks for no whole GPU, on ``gpus``
    as they are: a fraction of the unpartitioned GPU with the least free capacity that
    holds it (then the first), a MIG slice, or no GPU at all; ``None`` when none fits."""
    if request.gpu_milli:
        fitting = [
            (g.free_milli, i)
            for i, g in enumerate(gpus)
            if not g.mig_slices and g.free_milli >= request.gpu_milli and gpu_allowed(g, request)
        ]
        return Option((min(fitting)[1],)) if fitting else None
    if request.mig_profile is not None:
        return mig_choice(gpus, request)
    return Option(())


def make_slot(node: Node, request: Request, option: Option) -> Slot:
    """The slot one worker of ``request`` holds on ``node`` for a chosen option."""
    indices = tuple(node.gpus[p].index for p in option.gpus)
    return Slot(
        node=node.name,
        cpu_milli=request.cpu_milli,
        memory_mib=request.memory_mib,
        gpus=indices,
        gpu_milli=request.gpu_milli,
        mig_profile=request.mig_profile,
        mig_start=option.mig_start,
    )


# ------------------------------------------------------------------ place


def _may_fit(index: FreeIndex, request: Request, pool: str | None) -> bool:
    """Cheap necessary conditions: fail fast when the pool cannot hold the request."""
    if request.gpus:
        if request.gpus > index.max_gpus and request.workers == 1:
            return False
        return index.free_whole.get(pool, 0) >= request.gpus * request.workers
    return True


def place(
    cluster: Cluster,
    request: Request,
    *,
    pool: str | None = None,
    strategy: str | Strategy = DEFAULT_STRATEGY,
) -> Placement | None:
    """Where ``request`` fits now, or ``None``; the cluster is not changed.

    Each worker gets the per-worker request on one node: ``gpus`` free whole GPUs, or
    ``gpu_milli`` of one GPU's remaining capacity, or one MIG slice of ``mig_profile``,
    plus CPU and memory on that node; ``request.gpu_models`` restricts GPU models,
    ``request.gpu_memory_mib`` the GPUs by the memory a worker gets there, and ``pool``
    the nodes. A gang (``workers`` > 1) is placed whole or not at all, on as
    few nodes as possible.

    Raises:
        ValueError: unknown strategy name.
    """
    chooser = strategy_named(strategy) if isinstance(strategy, str) else strategy
    index = cluster.free_index()
    if not _may_fit(index, request, pool):
        return None
    if request.workers == 1:
        return _place_one(cluster, index, request, pool, chooser)
    return _place_gang(cluster, index, request, pool, chooser)


def _place_one(
    cluster: Cluster, index: FreeIndex, request: Request, pool: str | None, chooser: Strategy
) -> Placement | None:
    chosen = chooser.choose(cluster, index, request, pool)
    if chosen is None:
        return None
    node, option = chosen
    return Placement((make_slot(node, request, option),))


def _place_gang(
    cluster: Cluster, index: FreeIndex, request: Request, pool: str | None, chooser: Strategy
) -> Placement | None:
    """A gang on as few nodes as possible, all workers or none.

    When one node can hold the whole gang the strategy picks it (for whole GPUs and
    CPU-only gangs, by scoring the gang as one request). Otherwise nodes are taken
    in order of how many workers they hold, most first, and the last workers go to
    the node that holds them with the least room to spare.
    """
    whole_gang = _whole_gang(cluster, index, request, pool, chooser)
    if whole_gang is not None:
        return whole_gang
    workers = request.workers
    entries: list[tuple[int, list[Node]]] = []
    total = 0
    for bucket in index.groups(pool, request.gpus):
        for group in bucket.values():
            cap = _capacity(next(iter(group.values())), request, workers)
            if cap:
                entries.append((cap, list(group.values())))
                total += cap * len(group)
    if total < workers:
        return None
    entries.sort(key=lambda entry: (-entry[0], entry[1][0].name))
    chosen: list[tuple[Node, int]] = []
    remaining = workers
    while remaining:
        live = [entry for entry in entries if entry[1]]
        holding = [entry for entry in live if entry[0] >= remaining]
        cap, nodes = min(holding, key=lambda e: e[0]) if holding else live[0]
        take = min(cap, remaining)
        chosen.append((nodes.pop(0), take))
        remaining -= take
    slots: list[Slot] = []
    for node, count in chosen:
        slots.extend(_node_slots(node, request, count))
    return Placement(tuple(slots))


def _whole_gang(
    cluster: Cluster, index: FreeIndex, request: Request, pool: str | None, chooser: Strategy
) -> Placement | None:
    """The gang on one node chosen by the strategy, for whole-GPU or CPU-only gangs."""
    if request.gpu_milli or request.mig_profile is not None:
        return None
    if request.gpus * request.workers > index.max_gpus:
        return None
    combined = Request(
        cpu_milli=request.cpu_milli * request.workers,
        memory_mib=request.memory_mib * request.workers,
        gpus=request.gpus * request.workers,
        gpu_models=request.gpu_models,
        gpu_memory_mib=request.gpu_memory_mib,
    )
    found = chooser.choose(cluster, index, combined, pool)
    if found is None:
        return None
    node, option = found
    per = request.gpus
    return Placement(
        tuple(
            make_slot(node, request, Option(option.gpus[w * per : (w + 1) * per]))
            for w in range(request.workers)
        )
    )


# ------------------------------------------------------------------ allocate / release


def _position(node_name: str, gpus: list[Gpu], index: int) -> int:
    if 0 <= index < len(gpus) and gpus[index].index == index:
        return index
    for position, gpu in enumerate(gpus):
        if gpu.index == index:
            return position
    raise ValueError(f"node {node_name} has no GPU {index}")


def _apply_gpus(node_name: str, gpus: list[Gpu], slot: Slot, *, take: bool) -> None:
    """Take (or give back) a slot's GPU share on ``gpus``; all-or-nothing per slot."""
    positions = [_position(node_name, gpus, i) for i in slot.gpus]
    if slot.mig_profile is not None:
        _apply_mig(node_name, gpus, slot, positions, take=take)
        return
    share = slot.gpu_milli if slot.gpu_milli else GPU_MILLI
    for p in positions:
        gpu = gpus[p]
        if gpu.mig_slices:
            raise ValueError(f"GPU {gpu.index} of {node_name} is MIG-partitioned")
        if take and gpu.free_milli < share:
            raise ValueError(f"GPU {gpu.index} of {node_name} has only {gpu.free_milli} free")
        if not take and gpu.free_milli + share > GPU_MILLI:
            raise ValueError(f"GPU {gpu.index} of {node_name} does not hold {share}")
    if len(set(positions)) != len(positions):
        raise ValueError(f"slot names a GPU of {node_name} twice")
    for p in positions:
        gpus[p].free_milli += -share if take else share


def _apply_mig(
    node_name: str, gpus: list[Gpu], slot: Slot, positions: list[int], *, take: bool
) -> None:
    assert slot.mig_profile is not None  # noqa: S101 - caller checks
    if len(positions) != 1:
        raise ValueError("a MIG slot names exactly one GPU")
    gpu = gpus[positions[0]]
    profile = _mig.profiles_for(gpu).get(slot.mig_profile)
    if profile is None:
        raise ValueError(f"GPU {gpu.index} of {node_name} offers no MIG {slot.mig_profile}")
    mask = _mig.profile_mask(profile, slot.mig_start)
    share = mig_share_milli(slot.mig_profile)
    if take:
        if gpu.mig_used & mask:
            raise ValueError(f"MIG slots {slot.mig_start}+ of GPU {gpu.index} are in use")
        gpu.mig_used |= mask
        gpu.free_milli -= share
    else:
        if gpu.mig_used & mask != mask:
            raise ValueError(f"MIG slots {slot.mig_start}+ of GPU {gpu.index} are not held")
        gpu.mig_used &= ~mask
        gpu.free_milli += share


def _apply_slot(cluster: Cluster, slot: Slot, *, take: bool) -> Node:
    node = cluster.nodes.get(slot.node)
    if node is None:
        raise ValueError(f"no node {slot.node!r}")
    sign = -1 if take else 1
    cpu = node.free_cpu_milli + sign * slot.cpu_milli
    memory = node.free_memory_mib + sign * slot.memory_mib
    if cpu < 0 or memory < 0:
        raise ValueError(f"node {node.name} lacks CPU or memory for the slot")
    if cpu > node.cpu_milli or memory > node.memory_mib:
        raise ValueError(f"node {node.name} does not hold the slot's CPU or memory")
    _apply_gpus(node.name, node.gpus, slot, take=take)
    node.free_cpu_milli = cpu
    node.free_memory_mib = memory
    return node


def _apply(cluster: Cluster, placement: Placement, *, take: bool) -> None:
    index = cluster.free_index()
    done: list[Slot] = []
    try:
        for slot in placement.slots:
            _apply_slot(cluster, slot, take=take)
            done.append(slot)
    except ValueError:
        for slot in reversed(done):
            _apply_slot(cluster, slot, take=not take)
        raise
    if len(placement.slots) == 1:
        index.touched(cluster.nodes[placement.slots[0].node])
        return
    for name in dict.fromkeys(slot.node for slot in placement.slots):
        index.touched(cluster.nodes[name])


def allocate(cluster: Cluster, placement: Placement) -> None:
    """Make ``placement`` hold its resources; all slots or none.

    Raises:
        ValueError: a slot does not fit (unknown node or GPU, not enough free CPU,
            memory or GPU capacity, MIG slots taken or not allowed); nothing changed.
    """
    _apply(cluster, placement, take=True)


def release(cluster: Cluster, placement: Placement) -> None:
    """Give back what ``placement`` holds; all slots or none.

    Raises:
        ValueError: the placement does not hold what it names (e.g. released twice);
            nothing changed.
    """
    _apply(cluster, placement, take=False)
