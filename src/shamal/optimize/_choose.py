"""Choosing per machine: the fastest variant that passed, kept as a variant set.

Each variant is scored by the geometric mean of its median latencies over the measured batch
sizes at the most threads measured (a variant fast at batch 1 and slow at batch 32 does not
win on one number). Variants whose scores come within ``RUNOFF_MARGIN`` of the best are
contenders: the optimizer times them again head to head, in alternating rounds, before
choosing, so that noise between their separate timings does not decide. The set holds the
winner for this CPU's kind, a portable build (the fastest ONNX Runtime variant that passed: it
runs on every CPU), and, with ``merge``, the builds another machine chose for other kinds of
CPU.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Sequence
from pathlib import Path

from shamal.errors import InvalidParameter
from shamal.modelformat import (
    CpuInfo,
    VariantEntry,
    VariantSet,
    read_variant_set,
    write_variant_set,
)
from shamal.optimize._report import ChosenSet, VariantReport

__all__ = ["OPENVINO_PROVIDER", "assemble_set", "choose_fastest", "contenders", "score"]

OPENVINO_PROVIDER = "OpenVINO CPU"
PORTABLE = "portable"
#: Scores within this ratio of the best are too close to call from separate timings.
RUNOFF_MARGIN = 1.15


def score(variant: VariantReport, batches: Sequence[int], threads: int) -> float | None:
    """Geometric mean of the p50 latencies (ms) over ``batches`` at ``threads``; None for a
    blocked or untimed variant."""
    if variant.fidelity.blocked:
        return None
    times = [variant.timing(batch, threads) for batch in batches]
    if not times or any(t is None or not t.p50_ms > 0 for t in times):
        return None
    return math.exp(sum(math.log(t.p50_ms) for t in times if t is not None) / len(times))


def contenders(
    variants: Sequence[VariantReport], batches: Sequence[int], threads: int
) -> list[VariantReport]:
    """The passing variants whose scores are within :data:`RUNOFF_MARGIN` of the best, best
    first; fewer than two means the choice is clear."""
    scored = sorted(
        ((s, v) for v in variants if (s := score(v, batches, threads)) is not None),
        key=lambda pair: pair[0],
    )
    if not scored:
        return []
    best = scored[0][0]
    return [v for s, v in scored if s <= best * RUNOFF_MARGIN]


def choose_fastest(
    variants: Sequence[VariantReport], batches: Sequence[int], threads: int
) -> tuple[VariantReport, str]:
    """The fastest variant that passed, and one line on why.

    Raises:
        InvalidParameter: none passed the fidelity gate with timings.
    """
    scored = sorted(
        ((s, v) for v in variants if (s := score(v, batches, threads)) is not None),
        key=lambda pair: pair[0],
    )
    if not scored:
        raise InvalidParameter(
            "No variant passed the fidelity gate, so none can be chosen; see the table."
        )
    best_score, best = scored[0]
    sizes = ", ".join(f"b{b}" for b in batches)
    why = (
        f"{best.name}: {best_score:.2f} ms (geometric mean of p50 over {sizes}, {threads} threads)"
    )
    if len(scored) > 1:
        runner_score, runner = scored[1]
        why += f"; next {runner.name} {runner_score:.2f} ms ({runner_score / best_score:.2f}x)"
    return best, why


def _portable(
    variants: Sequence[VariantReport], batches: Sequence[int], threads: int
) -> VariantReport:
    runnable = [v for v in variants if v.provider != OPENVINO_PROVIDER and not v.fidelity.blocked]
    timed = [(score(v, batches, threads), v) for v in runnable]
    ranked = sorted(((s, v) for s, v in timed if s is not None), key=lambda pair: pair[0])
    if ranked:
        return ranked[0][1]
    if runnable:
        return runnable[0]
    raise InvalidParameter(
        "No ONNX Runtime variant passed, so the set would have no portable build."
    )


def _copy(source: Path, dest: Path) -> None:
    shutil.copytree(source, dest, symlinks=False)


def _kept(merge: Path, into: Path, kind: str) -> list[VariantEntry]:
    """The merged set's builds for other kinds of CPU, copied into ``into``."""
    earlier = read_variant_set(merge)
    kept = []
    for entry in earlier.variants:
        if entry.cpu.kind == kind or entry.path == earlier.portable:
            continue
        name = entry.cpu.kind
        if (into / name).exists():
            continue  # two builds for one kind in the merged set: the first is kept
        _copy(merge / entry.path, into / name)
        kept.append(VariantEntry(name, entry.variant, entry.cpu, entry.figures))
    return kept


def _figures(variant: VariantReport) -> dict[str, float]:
    figures = {f"p50_ms_b{t.batch}_t{t.threads}": t.p50_ms for t in variant.timings}
    fidelity = variant.fidelity
    if fidelity.cosine_min is not None and fidelity.cosine_mean is not None:
        figures |= {"cosine_mean": fidelity.cosine_mean, "cosine_min": fidelity.cosine_min}
    elif not math.isnan(fidelity.variant):
        figures["fidelity"] = fidelity.variant
    return figures


def assemble_set(
    dest: Path,
    variants: Sequence[VariantReport],
    batches: Sequence[int],
    threads: int,
    cpu: CpuInfo,
    merge: Path | None = None,
) -> ChosenSet:
    """Choose, and write the variant set at ``dest`` (which must not exist yet).

    Raises:
        InvalidParameter: nothing passed; ``merge`` is not a variant set.
    """
    winner, why = choose_fastest(variants, batches, threads)
    portable = _portable(variants, batches, threads)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    _copy(portable.folder, dest / PORTABLE)
    kind = cpu.kind
    path = PORTABLE if winner is portable else kind
    if winner is not portable:
        _copy(winner.folder, dest / kind)
    entries = [VariantEntry(path, winner.name, cpu, _figures(winner))]
    kept = _kept(merge, dest, kind) if merge is not None else []
    write_variant_set(dest, VariantSet(PORTABLE, tuple(entries + kept)))
    return ChosenSet(winner, dest, cpu, portable.name, tuple(e.cpu.kind for e in kept), why)
