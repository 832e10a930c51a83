"""The GPU-sharing packing experiment of FGD (ATC'23) on the Alibaba ``openb`` traces.

Method (``../shared/traces/README.md``, "Fractional GPUs"; the FGD artifact's
``TunePodsByNodeTotalResource`` and ``--shuffle-pod``):

* The cluster is a node list (``openb_node_list_gpu_node.csv``: 1,213 GPU nodes with
  6,212 GPUs, the list the FGD artifact copies next to every pod list; the
  ``all_node`` list adds 310 CPU-only nodes and the same GPUs).
* Per seed, the workload is every pod of the pod list plus pods drawn from it at
  random (with replacement) until the GPUs asked for reach ``demand`` x the cluster's
  GPUs (or, for a list that asks for more, the list less pods removed at random), in
  a random order. Pods arrive one by one and never leave; a pod that fits
  nowhere is dropped.
* A pod asks ``num_gpu`` x ``gpu_milli`` milli-GPUs: a fraction of one GPU when
  ``num_gpu`` is 1 and ``gpu_milli`` < 1000, else whole GPUs. Pods asking 0 GPUs
  still take CPU and memory (they compete with GPU pods for the nodes' CPUs) but add
  nothing to the demand, which counts GPUs only.
* The allocation ratio at demand ``d`` is the share of the cluster's GPU capacity
  that placed pods hold once every pod arriving while the GPUs asked for so far are
  at most ``d`` x the cluster's GPUs has been tried: a ratio between 0 and 1, mean
  over the seeds (tables show it in percent).

Fragmentation-aware strategies measure against the pod list's own mix of requests.
"""

from __future__ import annotations

import csv
import logging
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from shamal.scheduler.core._placement import allocate, place
from shamal.scheduler.core._resources import (
    GPU_MILLI,
    Cluster,
    Gpu,
    Node,
    Pool,
    Request,
    RequestMix,
)
from shamal.scheduler.core._strategies import DEFAULT_STRATEGY, strategy_named
from shamal.scheduler.core.sim._trace import TraceError

__all__ = [
    "TraceError",
    "load_nodes",
    "load_pods",
    "run_pack_experiment",
]

logger = logging.getLogger(__name__)

POOL = "openb"

Progress = Callable[[float, int], None]
"""Called as ``progress(seeds_done, seeds)``; ``seeds_done`` may be fractional."""


def _rows(path: Path, columns: Sequence[str]) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in columns if c not in (reader.fieldnames or ())]
            if missing:
                raise TraceError(f"{path}: missing column(s) {', '.join(missing)}")
            return list(reader)
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except (UnicodeDecodeError, csv.Error) as exc:
        raise TraceError(f"{path}: not a CSV file ({exc})") from exc


def _int(path: Path, line: int, row: dict[str, str], column: str) -> int:
    try:
        value = int(float(row[column] or 0))
    except ValueError:
        raise TraceError(f"{path}:{line}: {column} is not a number: {row[column]!r}") from None
    if value < 0:
        raise TraceError(f"{path}:{line}: {column} is negative")
    return value


def load_nodes(path: Path) -> list[Node]:
    """The nodes of an ``openb`` node list (``sn, cpu_milli, memory_mib, gpu, model``).

    Raises:
        TraceError: unreadable file, missing column or bad value.
    """
    nodes: list[Node] = []
    for line, row in enumerate(_rows(path, ("cpu_milli", "memory_mib", "gpu", "model")), 2):
        count = _int(path, line, row, "gpu")
        model = (row.get("model") or "").strip()
        nodes.append(
            Node(
                name=(row.get("sn") or f"node-{line}").strip(),
                pool=POOL,
                cpu_milli=_int(path, line, row, "cpu_milli"),
                memory_mib=_int(path, line, row, "memory_mib"),
                gpus=[Gpu(i, model, 0) for i in range(count)],
            )
        )
    if not nodes:
        raise TraceError(f"{path}: no nodes")
    return nodes


def load_pods(path: Path) -> list[Request]:
    """The pods of an ``openb`` pod list as requests, in file order.

    Raises:
        TraceError: unreadable file, missing column or bad value.
    """
    columns = ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec")
    pods: list[Request] = []
    for line, row in enumerate(_rows(path, columns), 2):
        num = _int(path, line, row, "num_gpu")
        milli = _int(path, line, row, "gpu_milli")
        models = frozenset(m.strip() for m in (row.get("gpu_spec") or "").split("|") if m.strip())
        if milli > GPU_MILLI or (num > 1 and milli < GPU_MILLI) or (num and not milli):
            raise TraceError(f"{path}:{line}: {num} GPU(s) of {milli} milli-GPU each")
        fraction = num == 1 and milli < GPU_MILLI
        pods.append(
            Request(
                cpu_milli=_int(path, line, row, "cpu_milli"),
                memory_mib=_int(path, line, row, "memory_mib"),
                gpus=0 if fraction else num,
                gpu_milli=milli if fraction else 0,
                gpu_models=models,
            )
        )
    if not pods:
        raise TraceError(f"{path}: no pods")
    return pods


def _asked(request: Request) -> int:
    return request.gpu_milli_per_worker * request.workers


@dataclass(frozen=True, slots=True)
class _SeedResult:
    ratios: dict[str, float]
    placed: int
    failed: int
    seconds: float


def _workload(pods: Sequence[Request], target: float, rng: random.Random) -> list[Request]:
    """The pods asking at most ``target`` milli-GPUs in all, in a random order.

    Like FGD's workload tuning: every pod of the list, then pods drawn from it at
    random until one more would pass ``target``; or, when the list alone asks for more,
    the list less pods removed at random until it no longer does.
    """
    if not any(_asked(p) for p in pods):
        raise TraceError("the pod list asks for no GPUs")
    workload = list(pods)
    asked = sum(_asked(p) for p in workload)
    while asked > target:
        asked -= _asked(workload.pop(rng.randrange(len(workload))))
    while True:
        extra = pods[rng.randrange(len(pods))]
        if asked + _asked(extra) > target:
            break
        workload.append(extra)
        asked += _asked(extra)
    rng.shuffle(workload)
    return workload


def _run_seed(
    nodes: Sequence[Node],
    pods: Sequence[Request],
    mix: RequestMix,
    strategy: str,
    seed: int,
    checkpoints: Sequence[float],
    tick: Callable[[float], None],
) -> _SeedResult:
    started = time.perf_counter()
    cluster = Cluster.of([Pool(POOL)], [_fresh(n) for n in nodes])
    cluster.typical = mix
    capacity = cluster.capacity().gpu_milli
    rng = random.Random(seed)  # noqa: S311 - simulation, not security
    chooser = strategy_named(strategy, seed=seed)
    limits = sorted(checkpoints)
    workload = _workload(pods, max(limits) * capacity, rng)
    ratios: dict[str, float] = {}
    asked = held = placed = failed = 0
    for i, pod in enumerate(workload):
        need = _asked(pod)
        while limits and asked + need > limits[0] * capacity:
            ratios[_label(limits.pop(0))] = held / capacity
        asked += need
        placement = place(cluster, pod, strategy=chooser)
        if placement is None:
            failed += 1
        else:
            allocate(cluster, placement)
            held += need
            placed += 1
        if i % 500 == 499:
            tick((i + 1) / len(workload))
    for limit in limits:
        ratios[_label(limit)] = held / capacity
    return _SeedResult(ratios, placed, failed, time.perf_counter() - started)


def _fresh(node: Node) -> Node:
    return Node(
        node.name,
        node.pool,
        node.cpu_milli,
        node.memory_mib,
        [Gpu(g.index, g.model, g.memory_mib) for g in node.gpus],
        node.labels,
    )


def _label(checkpoint: float) -> str:
    return f"{checkpoint:g}" if checkpoint != int(checkpoint) else f"{checkpoint:.1f}"


def run_pack_experiment(
    nodes_csv: Path,
    pods_csv: Path,
    *,
    demand: float = 1.3,
    seeds: int = 10,
    strategy: str = DEFAULT_STRATEGY,
    checkpoints: Sequence[float] = (0.9, 1.0, 1.3),
    progress: Progress | None = None,
) -> dict[str, object]:
    """Run the packing experiment; a JSON-able summary.

    Returns a dict with ``alloc_ratio`` (checkpoint label such as ``"1.3"`` -> mean
    allocation ratio: the share of the cluster's GPU capacity held, 0 to 1),
    ``alloc_ratio_per_seed`` (label -> list), ``unit`` ("ratio"), ``strategy``,
    ``seeds``, ``demand``, the
    cluster's ``total_gpus`` and ``nodes``, ``pods`` (in the list), ``placed_mean`` and
    ``failed_mean`` (pods per seed), ``seconds`` (wall time) and ``seconds_per_seed``.
    Checkpoints above ``demand`` are dropped; ``demand`` is always one.

    Raises:
        TraceError: unreadable node or pod list.
        ValueError: unknown strategy, or ``seeds`` < 1, or ``demand`` <= 0.
    """
    if seeds < 1 or demand <= 0:
        raise ValueError("seeds must be >= 1 and demand > 0")
    strategy_named(strategy)  # unknown names fail before any work
    started = time.perf_counter()
    nodes = load_nodes(nodes_csv)
    pods = load_pods(pods_csv)
    mix = RequestMix.from_requests(pods)
    points = sorted({c for c in checkpoints if 0 < c <= demand} | {demand})
    results: list[_SeedResult] = []
    for seed in range(seeds):

        def tick(share: float, done: int = seed) -> None:
            if progress is not None:
                progress(done + share, seeds)

        results.append(_run_seed(nodes, pods, mix, strategy, seed, points, tick))
        tick(1.0)
        logger.info("pack seed %d: %s in %.1fs", seed, results[-1].ratios, results[-1].seconds)
    labels = [_label(p) for p in points]
    return {
        "alloc_ratio": {k: statistics.fmean(r.ratios[k] for r in results) for k in labels},
        "alloc_ratio_per_seed": {k: [r.ratios[k] for r in results] for k in labels},
        "unit": "ratio",
        "strategy": strategy,
        "seeds": seeds,
        "demand": demand,
        "nodes": len(nodes),
        "total_gpus": sum(len(n.gpus) for n in nodes),
        "pods": len(pods),
        "placed_mean": statistics.fmean(r.placed for r in results),
        "failed_mean": statistics.fmean(r.failed for r in results),
        "seconds": time.perf_counter() - started,
        "seconds_per_seed": [r.seconds for r in results],
    }
