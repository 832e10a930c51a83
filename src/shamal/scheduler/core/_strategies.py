"""Placement strategies: which node and GPU, among those that fit, a worker gets.

A strategy scores the ways one worker fits on a node (lower is better) and the
placement code takes the best. Strategies, by name:

``fgd-pack`` (default)
    FGD (below) measuring fragmentation half by the paper's rule and half by what a
    typical request could not fill even packed as many times as the node's GPUs and
    CPU allow (see :class:`~shamal.scheduler.core._fragmentation.FragModel`).
``fgd``
    Fragmentation Gradient Descent (Weng et al., "Beware of Fragmentation: Scheduling
    GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC'23): the
    *fragmentation* of a node is the GPU capacity it has free that a typical request
    could not use, in expectation over the workload's mix of requests
    (:attr:`Cluster.typical`, or :data:`DEFAULT_MIX`); pick the node and GPU whose
    fragmentation grows least. Ties go to the best fit.
``best-fit``
    The node left with the least free GPU and CPU capacity (normalised, summed); whole
    GPUs go to the node left with the fewest free whole GPUs; fractions go to the
    fullest GPU that fits.
``gpu-packing``
    A fraction goes to a GPU already shared if one fits, else to a free GPU on a node
    already in use, else to an idle node; whole GPUs to nodes already in use first.
``dot-product``
    Tetris' alignment: the node whose free (CPU, memory, GPU), normalised by its
    capacity, has the largest dot product with the request.
``random``
    Any node and GPU that fits, uniformly (seeded).

Nodes in the same state are interchangeable (:class:`FreeIndex` groups them), so a
strategy scores each group once and memoises the score per (state, request).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from typing import NamedTuple

from shamal.scheduler.core import _mig
from shamal.scheduler.core._fragmentation import DEFAULT_MIX, FragModel, frag_model
from shamal.scheduler.core._resources import GPU_MILLI, Cluster, FreeIndex, Gpu, Node, Request

__all__ = [
    "DEFAULT_MIX",
    "DEFAULT_STRATEGY",
    "STRATEGIES",
    "Option",
    "Strategy",
    "node_options",
    "strategy_named",
]

logger = logging.getLogger(__name__)

DEFAULT_STRATEGY = "fgd-pack"
"""The strategy the live scheduler and the simulator use unless told otherwise."""

_CACHE_LIMIT = 500_000
"""Most memoised scores per (strategy, request) before they are dropped."""
_CACHE_REQUESTS = 20_000
"""Most distinct (strategy, request) memos per index before all are dropped."""

Score = tuple[float, ...]


class Option(NamedTuple):
    """One way a worker fits on a node: GPU positions in ``node.gpus`` (and MIG start)."""

    gpus: tuple[int, ...]
    mig_start: int = 0


# ------------------------------------------------------------------ fit tests


def gpu_allowed(gpu: Gpu, request: Request) -> bool:
    """Whether ``request.gpu_models`` allows this GPU's model and a worker's share of it
    has the ``request.gpu_memory_mib`` it needs."""
    if request.gpu_models and gpu.model not in request.gpu_models:
        return False
    return not request.gpu_memory_mib or (
        _mig.device_memory_mib(gpu, request) >= request.gpu_memory_mib
    )


def host_fits(node: Node, request: Request, count: int = 1) -> bool:
    """Whether ``count`` workers' CPU and memory fit on ``node``."""
    return (
        node.free_cpu_milli >= request.cpu_milli * count
        and node.free_memory_mib >= request.memory_mib * count
    )


def whole_free(gpus: list[Gpu], request: Request) -> list[int]:
    """Positions of the GPUs free as a whole that the request may use, in order."""
    return [
        i
        for i, g in enumerate(gpus)
        if g.free_milli == GPU_MILLI and not g.mig_slices and gpu_allowed(g, request)
    ]


def node_options(node: Node, request: Request) -> Iterator[Option]:
    """The distinct ways one worker of ``request`` fits on ``node`` now.

    Fractions yield one option per distinct free capacity (GPUs with the same free
    capacity are interchangeable); whole GPUs yield the lowest free positions; MIG
    yields the slot :func:`mig_choice` picks; CPU-only requests yield ``Option(())``.
    """
    if not host_fits(node, request):
        return
    if request.gpus:
        free = whole_free(node.gpus, request)
        if len(free) >= request.gpus:
            yield Option(tuple(free[: request.gpus]))
    elif request.gpu_milli:
        seen: set[tuple[str, int]] = set()
        for i, g in enumerate(node.gpus):
            if (
                not g.mig_slices
                and g.free_milli >= request.gpu_milli
                and (g.model, g.free_milli) not in seen
                and gpu_allowed(g, request)
            ):
                seen.add((g.model, g.free_milli))
                yield Option((i,))
    elif request.mig_profile is not None:
        best = mig_choice(node.gpus, request)
        if best is not None:
            yield best
    else:
        yield Option(())


def _mig_room(table: _mig.MigTable, used: int) -> int:
    return sum(
        1 for p in table.profiles.values() for s in p.starts if not used & _mig.profile_mask(p, s)
    )


def mig_choice(gpus: list[Gpu], request: Request) -> Option | None:
    """Where a MIG slice goes: the fullest partitioned GPU that has room for it, at the
    start that leaves the most placements open for the GPU's profiles."""
    profile_name = request.mig_profile
    best: tuple[int, int, int, int] | None = None  # (free positions, -room, position, start)
    for i, gpu in enumerate(gpus):
        table = _mig.table_for(gpu)
        if table is None or profile_name not in table.profiles or not gpu_allowed(gpu, request):
            continue
        profile = table.profiles[profile_name]
        free_positions = table.positions - bin(gpu.mig_used).count("1")
        for start in _mig.free_starts(gpu, profile_name):
            room = _mig_room(table, gpu.mig_used | _mig.profile_mask(profile, start))
            key = (free_positions, -room, i, start)
            if best is None or key < best:
                best = key
    return None if best is None else Option((best[2],), best[3])


# ------------------------------------------------------------------ strategies


def _plain_gpus(node: Node) -> list[Gpu]:
    return [g for g in node.gpus if not g.mig_slices]


def _left_norm(node: Node, request: Request, gpu_taken: int) -> float:
    """Free GPU plus free CPU capacity after placing, each as a share of the node's."""
    plain = _plain_gpus(node)
    cpu = (node.free_cpu_milli - request.cpu_milli) / node.cpu_milli if node.cpu_milli else 0.0
    if not plain:
        return cpu
    gpu_left = sum(g.free_milli for g in plain) - gpu_taken
    return cpu + gpu_left / (GPU_MILLI * len(plain))


def _taken(request: Request) -> int:
    if request.gpus:
        return request.gpus * GPU_MILLI
    return request.gpu_milli


class Strategy:
    """Base of the strategies: score every group of interchangeable nodes, take the best.

    Subclasses define :meth:`score` (lower is better) for one option on one node.
    """

    name = "base"

    def tag(self, cluster: Cluster) -> object:
        """What the memoised scores depend on besides node state and request."""
        return self.name

    def score(self, cluster: Cluster, node: Node, request: Request, option: Option) -> Score:
        raise NotImplementedError

    def stop_early(self, request: Request) -> bool:
        """True when a fit in a lower bucket (fewer free whole GPUs) always wins."""
        return False

    def best_option(
        self, cluster: Cluster, node: Node, request: Request
    ) -> tuple[Score, Option] | None:
        best: tuple[Score, Option] | None = None
        for option in node_options(node, request):
            score = self.score(cluster, node, request, option)
            if best is None or score < best[0]:
                best = (score, option)
        return best

    def choose(
        self, cluster: Cluster, index: FreeIndex, request: Request, pool: str | None
    ) -> tuple[Node, Option] | None:
        """The node and option for one worker of ``request`` in ``pool``, or ``None``."""
        best_group = self._best_group(cluster, index, request, pool)
        if best_group is None:
            return None
        node = next(iter(best_group.values()))
        if not request.gpu_milli:  # one option per node: nothing to choose between
            return node, next(node_options(node, request))
        found = self.best_option(cluster, node, request)
        assert found is not None  # noqa: S101 - the memo said it fits
        return node, found[1]

    def _scores(self, cluster: Cluster, index: FreeIndex, request: Request) -> dict[int, object]:
        """The memo of ``request``'s best score by node state id (None: it does not fit),
        kept in the index's cache; started afresh when it or the cache grew too large."""
        memo_key = (self.tag(cluster), request)
        memo = index.cache.get(memo_key)
        if memo is None or len(memo) > _CACHE_LIMIT:
            if len(index.cache) > _CACHE_REQUESTS:
                index.cache.clear()
            memo = index.cache[memo_key] = {}
        return memo

    def _best_group(
        self, cluster: Cluster, index: FreeIndex, request: Request, pool: str | None
    ) -> dict[str, Node] | None:
        """The group of interchangeable nodes of ``pool`` with the lowest score (the first
        of equal ones, in bucket order), or ``None`` when none fits; with
        :meth:`stop_early`, from the first bucket that has a fit."""
        memo = self._scores(cluster, index, request)
        best_score: Score | None = None
        best_group: dict[str, Node] | None = None
        for bucket in index.groups(pool, request.gpus):
            for sid, group in bucket.items():
                score = memo.get(sid, _MISSING)
                if score is _MISSING:
                    found = self.best_option(cluster, next(iter(group.values())), request)
                    score = memo[sid] = None if found is None else found[0]
                if score is not None and (best_score is None or score < best_score):  # type: ignore[operator]
                    best_score, best_group = score, group  # type: ignore[assignment]
            if best_group is not None and self.stop_early(request):
                break
        return best_group


_MISSING = object()


class BestFit(Strategy):
    name = "best-fit"

    def stop_early(self, request: Request) -> bool:
        return request.gpus > 0

    def score(self, cluster: Cluster, node: Node, request: Request, option: Option) -> Score:
        chosen = node.gpus[option.gpus[0]].free_milli if option.gpus else 0
        whole = sum(1 for g in node.gpus if g.free_milli == GPU_MILLI and not g.mig_slices)
        return (whole - request.gpus, _left_norm(node, request, _taken(request)), chosen)


class GpuPacking(Strategy):
    name = "gpu-packing"

    def score(self, cluster: Cluster, node: Node, request: Request, option: Option) -> Score:
        in_use = any(g.free_milli < GPU_MILLI for g in _plain_gpus(node))
        chosen = node.gpus[option.gpus[0]].free_milli if option.gpus else GPU_MILLI
        if request.gpu_milli and chosen < GPU_MILLI:
            tier = 0
        elif in_use:
            tier = 1
        else:
            tier = 2
        return (tier, chosen, _left_norm(node, request, _taken(request)))


class DotProduct(Strategy):
    name = "dot-product"

    def score(self, cluster: Cluster, node: Node, request: Request, option: Option) -> Score:
        plain = _plain_gpus(node)
        dot = 0.0
        if node.cpu_milli:
            dot += (request.cpu_milli / node.cpu_milli) * (node.free_cpu_milli / node.cpu_milli)
        if node.memory_mib:
            dot += (request.memory_mib / node.memory_mib) * (node.free_memory_mib / node.memory_mib)
        if plain:
            cap = GPU_MILLI * len(plain)
            dot += (_taken(request) / cap) * (sum(g.free_milli for g in plain) / cap)
        chosen = node.gpus[option.gpus[0]].free_milli if option.gpus else 0
        return (-dot, chosen)


class Fgd(Strategy):
    name = "fgd"
    packing = 0.0

    def tag(self, cluster: Cluster) -> object:
        return (self.name, self.model(cluster).serial)

    def model(self, cluster: Cluster) -> FragModel:
        return frag_model(cluster.typical or DEFAULT_MIX, packing=self.packing)

    def score(self, cluster: Cluster, node: Node, request: Request, option: Option) -> Score:
        model = self.model(cluster)
        delta = model.delta(node, request, option.gpus)
        chosen = node.gpus[option.gpus[0]].free_milli if option.gpus else 0
        return (delta, _left_norm(node, request, _taken(request)), chosen)


class FgdPack(Fgd):
    """FGD with the packing-aware fragment measure (see :class:`FragModel`)."""

    name = "fgd-pack"
    packing = 0.5


class RandomFit(Strategy):
    """Uniform over the nodes that fit, then over their options; seeded."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)  # noqa: S311 - simulation, not security

    def choose(
        self, cluster: Cluster, index: FreeIndex, request: Request, pool: str | None
    ) -> tuple[Node, Option] | None:
        memo = index.cache.get((self.name, request))
        if memo is None or len(memo) > _CACHE_LIMIT:
            memo = index.cache[(self.name, request)] = {}
        fitting: list[dict[str, Node]] = []
        weights: list[int] = []
        for bucket in index.groups(pool, request.gpus):
            for sid, group in bucket.items():
                fits = memo.get(sid)
                if fits is None:
                    rep = next(iter(group.values()))
                    fits = memo[sid] = any(True for _ in node_options(rep, request))
                if fits:
                    fitting.append(group)
                    weights.append(len(group))
        if not fitting:
            return None
        group = self.rng.choices(fitting, weights)[0]
        node = list(group.values())[self.rng.randrange(len(group))]
        return node, self.rng.choice(list(node_options(node, request)))


_FACTORIES: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (FgdPack, Fgd, BestFit, GpuPacking, DotProduct, RandomFit)
}
STRATEGIES: tuple[str, ...] = tuple(_FACTORIES)
"""The strategy names :func:`strategy_named` knows."""

_SHARED: dict[str, Strategy] = {}


def strategy_named(name: str, *, seed: int | None = None) -> Strategy:
    """The strategy called ``name`` (shared instances; ``seed`` gives a fresh one).

    Raises:
        ValueError: unknown name.
    """
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ValueError(f"unknown placement strategy {name!r} (one of {', '.join(STRATEGIES)})")
    if seed is not None:
        return RandomFit(seed) if factory is RandomFit else factory()
    if name not in _SHARED:
        _SHARED[name] = factory()
    return _SHARED[name]
