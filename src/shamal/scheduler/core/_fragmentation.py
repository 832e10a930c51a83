"""GPU fragmentation of a node, measured against a workload's mix of requests (FGD).

After Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent" (USENIX ATC'23). For one typical request ``m``, the
fragment of a node is the free GPU capacity ``m`` cannot use there:

* all of the node's free GPU capacity, when ``m`` does not fit on the node at all
  (too few free GPUs of an allowed model, or too little free CPU);
* otherwise the free capacity of the GPUs that cannot serve ``m``: for a fraction
  ``x`` of one GPU, the GPUs with less than ``x`` free; for whole GPUs, the GPUs that
  are partly used (and, in both cases, GPUs of a model ``m`` may not use).

The node's fragmentation is the expectation over the mix. CPU-only requests make all
free GPU capacity a fragment whatever the placement, a constant shift that changes
no decision, so they are left out. MIG-partitioned GPUs are not counted (their slices
are placed by their own rules). Like the paper, fit is judged on CPU and GPUs;
memory still decides whether a request fits when it is placed.
"""

from __future__ import annotations

import bisect
import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from shamal.scheduler.core._resources import GPU_MILLI, Node, Request, RequestMix

__all__ = ["DEFAULT_MIX", "FragModel", "frag_model"]

logger = logging.getLogger(__name__)


def _typical(
    cpu_cores: float, weight: float, *, gpus: int = 0, milli: int = 0
) -> tuple[Request, float]:
    return Request(int(cpu_cores * 1000), int(cpu_cores * 4096), gpus=gpus, gpu_milli=milli), weight


DEFAULT_MIX = RequestMix.of(
    [
        _typical(8, 0.35, gpus=1),
        _typical(16, 0.06, gpus=2),
        _typical(32, 0.04, gpus=4),
        _typical(64, 0.05, gpus=8),
        _typical(2, 0.10, milli=250),
        _typical(4, 0.20, milli=500),
        _typical(6, 0.10, milli=750),
        _typical(8, 0.10),
    ]
)
"""The mix FGD measures against when a cluster declares none: mostly single-GPU work,
some multi-GPU training and a good share of quarter, half and three-quarter GPU
sharing (the shape of the Alibaba GPU-sharing trace, ATC'23), ~8 cores per GPU."""


@dataclass(frozen=True, slots=True)
class _Class:
    """Typical requests that differ only in CPU: ``num`` GPUs of ``thr`` milli-GPU each."""

    num: int
    thr: int
    models: frozenset[str]
    weight: float
    cpus: tuple[int, ...]
    """CPU requests, ascending."""
    weights: tuple[float, ...]
    """The weight of each entry of ``cpus``."""
    cum: tuple[float, ...]
    """``cum[i]`` is the weight of the first ``i`` entries of ``cpus``."""


_SERIALS = itertools.count()

GpuState = tuple[tuple[str, int], ...]
"""A node's plain (not MIG) GPUs as sorted (model, free milli-GPU) pairs."""


class FragModel:
    """Fragmentation of node states against one request mix; memoised by state.

    ``packing`` blends in a refinement of the paper's measure: with weight
    ``packing`` (0 to 1), the fragment for a typical request is the free GPU capacity
    that request could not fill *even packed as many times as the node's GPUs and
    free CPU allow*. The paper counts a GPU with 700 milli free as wholly usable by a
    470 milli request; the packed measure counts the 230 left after one, and the
    GPUs beyond what the node's free CPU lets the request use. Alone it protects
    small requests at the cost of large ones (8-GPU requests start failing at 80%
    demand on the Alibaba trace); half and half packs the trace tighter than either
    (see :mod:`shamal.scheduler.core.sim`).
    """

    def __init__(self, mix: RequestMix, *, packing: float = 0.0) -> None:
        if not 0.0 <= packing <= 1.0:
            raise ValueError("packing is a weight between 0 and 1")
        self.mix = mix
        self.packing = packing
        self.serial = next(_SERIALS)
        """Unique for the process's life: what memoised scores are keyed by."""
        grouped: dict[tuple[int, int, frozenset[str]], list[tuple[int, float]]] = {}
        for request, weight in mix.entries:
            if request.gpus:
                shape = (request.gpus, GPU_MILLI, request.gpu_models)
            elif request.gpu_milli:
                shape = (1, request.gpu_milli, request.gpu_models)
            else:
                continue  # CPU-only or MIG: see the module docstring
            grouped.setdefault(shape, []).append((request.cpu_milli, weight))
        self.classes: list[_Class] = []
        for (num, thr, models), entries in grouped.items():
            merged: dict[int, float] = {}
            for cpu, weight in entries:
                merged[cpu] = merged.get(cpu, 0.0) + weight
            cpus = sorted(merged)
            cum = [0.0]
            for cpu in cpus:
                cum.append(cum[-1] + merged[cpu])
            self.classes.append(
                _Class(
                    num,
                    thr,
                    models,
                    cum[-1],
                    tuple(cpus),
                    tuple(merged[c] for c in cpus),
                    tuple(cum),
                )
            )
        self._memo: dict[tuple[int, GpuState], float] = {}

    def frag(self, free_cpu: int, gpus: GpuState) -> float:
        """Expected fragmented GPU capacity (milli-GPUs) of a node in this state."""
        memo_key = (free_cpu, gpus)
        cached = self._memo.get(memo_key)
        if cached is not None:
            return cached
        if len(self._memo) > _MEMO_LIMIT:
            self._memo.clear()
        total = sum(f for _, f in gpus)
        result = 0.0
        if total:
            beta = self.packing
            for c in self.classes:
                if beta < 1.0:
                    result += (1.0 - beta) * self._paper(c, free_cpu, gpus, total)
                if beta > 0.0:
                    result += beta * self._packed(c, free_cpu, gpus, total)
        self._memo[memo_key] = result
        return result

    @staticmethod
    def _paper(c: _Class, free_cpu: int, gpus: GpuState, total: int) -> float:
        usable = [f for model, f in gpus if not c.models or model in c.models]
        fits = (
            any(f >= c.thr for f in usable)
            if c.thr < GPU_MILLI
            else sum(1 for f in usable if f >= GPU_MILLI) >= c.num
        )
        if not fits:
            return c.weight * total
        fit_weight = c.cum[bisect.bisect_right(c.cpus, free_cpu)]
        unusable = total - sum(f for f in usable if f >= c.thr)
        return fit_weight * unusable + (c.weight - fit_weight) * total

    @staticmethod
    def _packed(c: _Class, free_cpu: int, gpus: GpuState, total: int) -> float:
        if c.thr < GPU_MILLI:
            slots = sum(f // c.thr for model, f in gpus if not c.models or model in c.models)
        else:
            full = sum(
                1 for model, f in gpus if f >= GPU_MILLI and (not c.models or model in c.models)
            )
            slots = full // c.num
        unit = c.thr * c.num
        filled = 0.0
        for cpu, weight in zip(c.cpus, c.weights, strict=True):
            fits = slots if cpu == 0 else min(slots, free_cpu // cpu)
            filled += weight * fits * unit
        return c.weight * total - filled

    def node_frag(self, node: Node) -> float:
        """The fragmentation of ``node`` as it is now."""
        return self.frag(node.free_cpu_milli, _state(node, (), 0))

    def delta(self, node: Node, request: Request, positions: Sequence[int]) -> float:
        """How much one worker of ``request`` on ``positions`` of ``node`` adds."""
        take = request.gpu_milli if request.gpu_milli else GPU_MILLI
        if request.mig_profile is not None:
            positions, take = (), 0
        before = self.frag(node.free_cpu_milli, _state(node, (), 0))
        after = self.frag(node.free_cpu_milli - request.cpu_milli, _state(node, positions, take))
        return after - before


def _state(node: Node, positions: Sequence[int], take: int) -> GpuState:
    return tuple(
        sorted(
            (g.model, g.free_milli - take if i in positions else g.free_milli)
            for i, g in enumerate(node.gpus)
            if not g.mig_slices
        )
    )


_MEMO_LIMIT = 1_000_000
_MODELS: dict[tuple[int, float], tuple[RequestMix, FragModel]] = {}


def frag_model(mix: RequestMix, *, packing: float = 0.0) -> FragModel:
    """The (shared, memoising) fragmentation model of ``mix``."""
    entry = _MODELS.get((id(mix), packing))
    if entry is None or entry[0] is not mix:
        if len(_MODELS) > 64:
            _MODELS.clear()
        entry = _MODELS[(id(mix), packing)] = (mix, FragModel(mix, packing=packing))
    return entry[1]
