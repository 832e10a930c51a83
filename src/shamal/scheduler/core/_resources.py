"""The resource model: pools of nodes with CPUs, memory and GPUs (whole, fractional, MIG).

Pure data and bookkeeping, no I/O: the live scheduler builds a :class:`Cluster` from
configuration (and GPU detection) plus the placements of running jobs; the trace
simulator builds one from a machine list. Both then ask the same placement code
(:mod:`shamal.scheduler.core._placement`) where a request fits.

Units are integers so that bookkeeping never drifts: CPU in milli-cores, memory in MiB,
GPU capacity in milli-GPUs (1000 = one whole GPU).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "GPU_MILLI",
    "Cluster",
    "FreeIndex",
    "Gpu",
    "Node",
    "Placement",
    "Pool",
    "Request",
    "RequestMix",
    "Resources",
    "Slot",
    "free_whole_gpus",
    "mig_share_milli",
]

GPU_MILLI = 1000
"""Capacity of one whole GPU in milli-GPUs."""


@dataclass(frozen=True, slots=True)
class Resources:
    """An amount of resources: the unit of quotas, usage and requests' totals."""

    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_milli: int = 0

    def __add__(self, other: Resources) -> Resources:
        return Resources(
            self.cpu_milli + other.cpu_milli,
            self.memory_mib + other.memory_mib,
            self.gpu_milli + other.gpu_milli,
        )

    def __sub__(self, other: Resources) -> Resources:
        return Resources(
            self.cpu_milli - other.cpu_milli,
            self.memory_mib - other.memory_mib,
            self.gpu_milli - other.gpu_milli,
        )

    def fits_in(self, other: Resources) -> bool:
        """True when every component of ``self`` is at most that of ``other``."""
        return (
            self.cpu_milli <= other.cpu_milli
            and self.memory_mib <= other.memory_mib
            and self.gpu_milli <= other.gpu_milli
        )

    def scaled(self, factor: int) -> Resources:
        return Resources(self.cpu_milli * factor, self.memory_mib * factor, self.gpu_milli * factor)


@dataclass(frozen=True, slots=True)
class Request:
    """What one job asks for, per worker; ``workers`` > 1 is a gang (all or nothing).

    Exactly one GPU form is used: ``gpus`` whole GPUs, or ``gpu_milli`` (1..999) of a
    single GPU, or one MIG slice of profile ``mig_profile`` (e.g. ``"1g.10gb"``).
    ``gpu_models`` restricts the GPU models allowed (empty: any); ``gpu_memory_mib``
    the memory each worker's device must have (0: any), counted as the device the worker
    gets: a whole GPU's memory, a fraction's share of it, a MIG slice's memory slices
    (:func:`shamal.scheduler.core._mig.device_memory_mib`). A gang's stages then go only
    where devices with that much memory are free.
    """

    cpu_milli: int = 1000
    memory_mib: int = 1024
    gpus: int = 0
    gpu_milli: int = 0
    mig_profile: str | None = None
    gpu_models: frozenset[str] = frozenset()
    workers: int = 1
    gpu_memory_mib: int = 0

    def __post_init__(self) -> None:
        forms = (self.gpus > 0) + (self.gpu_milli > 0) + (self.mig_profile is not None)
        if forms > 1:
            raise ValueError("ask for whole GPUs, a GPU fraction or a MIG profile, not several")
        if self.gpus < 0 or not 0 <= self.gpu_milli < GPU_MILLI:
            raise ValueError("gpus must be >= 0 and a GPU fraction between 0 and 1")
        if self.workers < 1 or self.cpu_milli < 0 or self.memory_mib < 0:
            raise ValueError("workers must be >= 1, CPU and memory >= 0")
        if self.gpu_memory_mib < 0 or (self.gpu_memory_mib and not forms):
            raise ValueError("device memory must be >= 0, and asked for with a GPU request")

    @property
    def gpu_milli_per_worker(self) -> int:
        """GPU capacity one worker holds, in milli-GPUs (a MIG slice counts by its share)."""
        if self.gpus:
            return self.gpus * GPU_MILLI
        if self.mig_profile is not None:
            return mig_share_milli(self.mig_profile)
        return self.gpu_milli

    @property
    def total(self) -> Resources:
        """The whole gang's resources: what quotas and cost accounting count."""
        return Resources(self.cpu_milli, self.memory_mib, self.gpu_milli_per_worker).scaled(
            self.workers
        )


def mig_share_milli(profile: str) -> int:
    """The share of a whole GPU a MIG profile stands for: ``"3g.40gb"`` -> 3/7 of 1000."""
    try:
        slices = int(profile.split("g.", 1)[0])
    except ValueError:
        raise ValueError(f"not a MIG profile: {profile!r} (expected e.g. '1g.10gb')") from None
    if not 1 <= slices <= 7:
        raise ValueError(f"not a MIG profile: {profile!r}")
    return slices * GPU_MILLI // 7


@dataclass(slots=True)
class Gpu:
    """One physical GPU of a node and what is still free on it.

    ``mig_slices`` > 0 means the GPU is partitioned with MIG into that many compute
    slices; ``mig_used`` is then a bit mask of the slices held by placed jobs.
    """

    index: int
    model: str
    memory_mib: int
    uuid: str = ""
    free_milli: int = GPU_MILLI
    mig_slices: int = 0
    mig_used: int = 0


@dataclass(slots=True)
class Node:
    """A machine of a pool and its free capacity."""

    name: str
    pool: str
    cpu_milli: int
    memory_mib: int
    gpus: list[Gpu] = field(default_factory=list)
    labels: Mapping[str, str] = field(default_factory=dict)
    free_cpu_milli: int = -1
    free_memory_mib: int = -1

    def __post_init__(self) -> None:
        if self.free_cpu_milli < 0:
            self.free_cpu_milli = self.cpu_milli
        if self.free_memory_mib < 0:
            self.free_memory_mib = self.memory_mib

    @property
    def capacity(self) -> Resources:
        return Resources(self.cpu_milli, self.memory_mib, GPU_MILLI * len(self.gpus))


@dataclass(frozen=True, slots=True)
class Pool:
    """A named group of nodes; labels carry region and prices.

    Price labels (all optional, in the pool's currency): ``cost_per_gpu_hour``,
    ``cost_per_cpu_hour``, ``cost_per_gib_hour``.
    """

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)

    def price(self, label: str) -> float:
        """A price label as a number (0 when the pool does not set it)."""
        try:
            return float(self.labels.get(label, 0) or 0)
        except ValueError:
            return 0.0


@dataclass(frozen=True, slots=True)
class Slot:
    """Where one worker of a job runs and what it holds there.

    ``gpus`` lists GPU indices on ``node``: whole GPUs, or the one GPU that holds a
    fraction (``gpu_milli`` > 0) or a MIG slice (``mig_profile`` with ``mig_start``,
    the first compute slice it occupies).
    """

    node: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[int, ...] = ()
    gpu_milli: int = 0
    mig_profile: str | None = None
    mig_start: int = 0


@dataclass(frozen=True, slots=True)
class Placement:
    """A whole job's placement: one slot per worker (rank order)."""

    slots: tuple[Slot, ...]

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(slot.node for slot in self.slots))


@dataclass(frozen=True, slots=True)
class RequestMix:
    """A distribution of typical per-worker requests: what fragmentation is measured against.

    ``entries`` pairs requests with weights that sum to 1. Fragmentation-aware
    placement (FGD) counts the GPU capacity that these requests could not use; a
    cluster carries the mix of its workload in :attr:`Cluster.typical` (``None``: the
    placement code's built-in default).
    """

    entries: tuple[tuple[Request, float], ...]

    @classmethod
    def of(cls, weighted: Iterable[tuple[Request, float]]) -> RequestMix:
        """Normalise weights (any positive numbers) into a mix; zero weights are dropped."""
        pairs = [(r, float(w)) for r, w in weighted if w > 0]
        total = sum(w for _, w in pairs)
        if not pairs or total <= 0:
            raise ValueError("a request mix needs at least one request with a positive weight")
        return cls(tuple((r, w / total) for r, w in pairs))

    @classmethod
    def from_requests(cls, requests: Iterable[Request]) -> RequestMix:
        """The empirical mix of a workload: each distinct request weighted by its count."""
        counts: dict[Request, int] = {}
        for request in requests:
            counts[request] = counts.get(request, 0) + 1
        return cls.of(counts.items())


def free_whole_gpus(node: Node) -> int:
    """GPUs of ``node`` free as a whole: no fraction or MIG slice in use, not MIG-partitioned."""
    return sum(1 for g in node.gpus if g.free_milli == GPU_MILLI and not g.mig_slices)


NodeKey = tuple[object, ...]
"""What makes two nodes interchangeable for placement: pool, capacity, free CPU and
memory, and each GPU's model, memory, free capacity and MIG layout (sorted)."""


def node_key(node: Node) -> NodeKey:
    """The :data:`NodeKey` of a node's current state."""
    gpus = sorted(
        (g.model, g.memory_mib, g.free_milli, g.mig_slices, g.mig_used) for g in node.gpus
    )
    return (
        node.pool,
        node.cpu_milli,
        node.memory_mib,
        node.free_cpu_milli,
        node.free_memory_mib,
        tuple(gpus),
    )


def _uniform_shape(node: Node) -> tuple[object, ...] | None:
    """What identifies a node with plain GPUs of one model (``None`` otherwise)."""
    kinds = {(g.model, g.memory_mib, g.mig_slices) for g in node.gpus}
    if len(kinds) > 1 or any(g.mig_slices for g in node.gpus):
        return None
    kind = next(iter(kinds), ("", 0, 0))
    return (node.pool, node.cpu_milli, node.memory_mib, len(node.gpus), *kind)


class FreeIndex:
    """Free-capacity bookkeeping kept by allocate/release, for fast placement.

    Nodes in the same state (same :func:`node_key`) are interchangeable, so the index
    keeps them in *groups*, each named by a small integer (the state's id, stable for
    the index's life); per pool (and for the whole cluster, key ``None``) the groups
    sit in buckets by their number of free whole GPUs. Running totals of free whole
    GPUs per pool let placement fail fast.

    ``buckets[pool][w]`` maps a state id to its group (node name -> node), for the
    groups with ``w`` free whole GPUs. ``cache`` is scratch space for strategies
    (memoised scores by state id), dropped with the index.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.nodes_id = id(cluster.nodes)
        self.node_count = len(cluster.nodes)
        self.max_gpus = max((len(n.gpus) for n in cluster.nodes.values()), default=0)
        self.whole: dict[str, int] = {}
        self.state: dict[str, int] = {}
        self.state_ids: dict[NodeKey, int] = {}
        self.buckets: dict[str | None, list[dict[int, dict[str, Node]]]] = {}
        self.free_whole: dict[str | None, int] = {}
        self.cache: dict[object, dict[int, object]] = {}
        self._uniform: dict[str, tuple[object, ...] | None] = {}
        for node in cluster.nodes.values():
            self._uniform[node.name] = _uniform_shape(node)
            sid, whole = self._state_id(node)
            self._add(node, sid, whole)

    def _state_id(self, node: Node) -> tuple[int, int]:
        """The node's state id and free whole GPUs (fast path: one GPU model, no MIG)."""
        shape = self._uniform[node.name]
        if shape is None:
            key = node_key(node)
            whole = free_whole_gpus(node)
        else:
            frees = sorted(g.free_milli for g in node.gpus)
            key = (shape, node.free_cpu_milli, node.free_memory_mib, tuple(frees))
            whole = frees.count(GPU_MILLI)
        sid = self.state_ids.get(key)
        if sid is None:
            sid = self.state_ids[key] = len(self.state_ids)
        return sid, whole

    def _add(self, node: Node, sid: int, whole: int) -> None:
        self.whole[node.name] = whole
        self.state[node.name] = sid
        for pool in (None, node.pool):
            buckets = self.buckets.get(pool)
            if buckets is None:
                buckets = self.buckets[pool] = [{} for _ in range(self.max_gpus + 1)]
            buckets[whole].setdefault(sid, {})[node.name] = node
            self.free_whole[pool] = self.free_whole.get(pool, 0) + whole

    def _remove(self, node: Node) -> None:
        whole = self.whole.pop(node.name)
        sid = self.state.pop(node.name)
        for pool in (None, node.pool):
            bucket = self.buckets[pool][whole]
            group = bucket[sid]
            del group[node.name]
            if not group:
                del bucket[sid]
            self.free_whole[pool] -= whole

    def is_current(self, cluster: Cluster) -> bool:
        """False when nodes were added or removed since the index was built."""
        return (
            id(cluster.nodes) == self.nodes_id
            and len(cluster.nodes) == self.node_count
            and len(self.state_ids) < _MAX_STATES
        )

    def touched(self, node: Node) -> None:
        """Record that ``node``'s free capacity changed (called by allocate/release)."""
        sid, whole = self._state_id(node)
        if sid == self.state[node.name]:
            return
        self._remove(node)
        self._add(node, sid, whole)

    def groups(self, pool: str | None, min_whole: int = 0) -> list[dict[int, dict[str, Node]]]:
        """The buckets of ``pool`` with at least ``min_whole`` free whole GPUs, ascending."""
        buckets = self.buckets.get(pool)
        return [] if buckets is None else buckets[min_whole:]


_MAX_STATES = 2_000_000
"""Past this many distinct node states seen, the index is rebuilt (bounds its memory)."""


@dataclass(slots=True)
class Cluster:
    """Pools and nodes with their free capacity; mutated only by allocate/release.

    ``typical`` is the workload's mix of requests that fragmentation-aware placement
    measures against (``None``: a built-in default). The free-capacity index is built
    on first use and kept current by allocate/release; code that changes nodes'
    free capacity any other way must call :meth:`reindex` afterwards.
    """

    pools: dict[str, Pool]
    nodes: dict[str, Node]
    typical: RequestMix | None = None
    _index: FreeIndex | None = field(default=None, repr=False, compare=False)

    def free_index(self) -> FreeIndex:
        """The current free-capacity index (rebuilt when the node set changed)."""
        index = self._index
        if index is None or not index.is_current(self):
            index = self._index = FreeIndex(self)
        return index

    def reindex(self) -> None:
        """Forget the free-capacity index; the next placement rebuilds it."""
        self._index = None

    @classmethod
    def of(cls, pools: Iterable[Pool], nodes: Iterable[Node]) -> Cluster:
        return cls({p.name: p for p in pools}, {n.name: n for n in nodes})

    def pool_nodes(self, pool: str | None) -> list[Node]:
        """The nodes of one pool (``None``: every node)."""
        return [n for n in self.nodes.values() if pool is None or n.pool == pool]

    def capacity(self, pool: str | None = None) -> Resources:
        total = Resources()
        for node in self.pool_nodes(pool):
            total = total + node.capacity
        return total
