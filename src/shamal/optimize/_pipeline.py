"""The optimizer: from a source model to measured, fidelity-checked variants.

:func:`optimize_model` always builds the ``fp32`` variant (exported, basic graph
optimizations) and the *candidate* the request asks for (int8 dynamic by default; int8 static,
pruning, fp16 for ``--target gpu``), writes each as a model folder, checks each against the
original on held-out inputs and measures each at several batch sizes and thread counts.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from shamal.errors import InvalidParameter
from shamal.optimize._folder import MODEL_FILE, write_model_folder
from shamal.optimize._lazy import module
from shamal.optimize._measure import (
    Fidelity,
    Thresholds,
    Timing,
    compare,
    load_arrays,
    measure_latency,
    run_batches,
    session,
    unverified,
)
from shamal.optimize._sandbox import SandboxLimits
from shamal.optimize._sources import SourceModel, load_source
from shamal.optimize._structured import latency_ratio, prune_onnx_units
from shamal.optimize._variants import (
    ENCODER_INT8,
    Int8Options,
    graph_optimize,
    prune_magnitude,
    quantize_int8_dynamic,
    quantize_int8_static,
    to_fp16,
)

__all__ = ["OptimizeReport", "OptimizeRequest", "VariantReport", "optimize_model"]

logger = logging.getLogger(__name__)

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
LABEL_KEY = "argmax label"


class ProgressSink(Protocol):
    """Where long work reports progress (a Rich progress bar in the CLI)."""

    def start(self, total: int) -> None: ...

    def step(self, label: str) -> None: ...


class _Silent:
    def start(self, total: int) -> None:
        return None

    def step(self, label: str) -> None:
        return None


@dataclass(frozen=True)
class OptimizeRequest:
    """What to build and how to judge it.

    Attributes:
        int8: ``dynamic`` or ``static`` (needs ``calibration``); None with no other
            transformation asked for means ``dynamic``.
        calibration: .npz/.npy/.csv inputs for static quantization.
        prune: magnitude-pruning sparsity (0..1) of MatMul/Gemm/Conv weights (zeros:
            smaller when compressed, no faster on ONNX Runtime's CPU kernels).
        prune_structured: fraction (0..1) of attention heads and FFN neurons (transformers)
            or of hidden units and channels (dense and conv layers) to remove.
        target: ``cpu``, or ``gpu`` for an fp16 variant.
        int8_options: per-channel etc.; None = the default for the model kind.
        timed: measure latency (off for callers that only want the variant built).
        trust_pickle: load a pickled sklearn model (only ever in the sandbox).
        sandbox: the sandbox's limits for a trusted pickle; None = the defaults.
        torch_factory: ``module:function`` building the module of a torch model folder.
    """

    int8: str | None = None
    calibration: Path | None = None
    prune: float | None = None
    target: str = "cpu"
    eval_data: Path | None = None
    thresholds: Thresholds = field(default_factory=Thresholds)
    batches: tuple[int, ...] = (1, 8, 32)
    threads: tuple[int, ...] = (1, 2)
    trust_pickle: bool = False
    int8_options: Int8Options | None = None
    sequence_length: int = 128
    source_uri: str | None = None
    repeats: int = 20
    timed: bool = True
    sandbox: SandboxLimits | None = None
    torch_factory: str | None = None
    prune_structured: float | None = None

    def check(self) -> None:
        """Raises InvalidParameter for combinations that make no sense."""
        if self.int8 not in (None, "dynamic", "static"):
            raise InvalidParameter("--int8 takes dynamic or static.")
        if self.int8 == "static" and self.calibration is None:
            raise InvalidParameter("--int8 static needs --calibration DATA (.npz, .npy or .csv).")
        if self.target not in ("cpu", "gpu"):
            raise InvalidParameter("--target takes cpu or gpu.")
        if self.target == "gpu" and self.int8 is not None:
            raise InvalidParameter("--target gpu builds an fp16 variant; leave out --int8.")
        if self.prune is not None and not 0.0 < self.prune < 1.0:
            raise InvalidParameter("--prune takes a sparsity between 0 and 1 (e.g. 0.3).")
        if self.prune_structured is not None and not 0.0 < self.prune_structured < 1.0:
            raise InvalidParameter("--prune-structured takes a fraction between 0 and 1.")
        if not self.batches or not self.threads or min(*self.batches, *self.threads) < 1:
            raise InvalidParameter("Batch sizes and thread counts must be >= 1.")

    def int8_mode(self) -> str | None:
        if self.target == "gpu":
            return None
        if self.int8 is None and self.prune is None and self.prune_structured is None:
            return "dynamic"
        return self.int8


@dataclass(frozen=True)
class VariantReport:
    """One variant: where it was written, how faithful and how fast it is."""

    name: str
    folder: Path
    size_bytes: int
    fidelity: Fidelity
    timings: tuple[Timing, ...]
    provider: str
    note: str = ""

    @property
    def verdict(self) -> str:
        return "BLOCKED" if self.fidelity.blocked else "OK"

    def timing(self, batch: int, threads: int) -> Timing | None:
        return next((t for t in self.timings if (t.batch, t.threads) == (batch, threads)), None)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (NaN becomes null)."""
        fidelity = {
            k: (None if isinstance(v, float) and math.isnan(v) else v)
            for k, v in asdict(self.fidelity).items()
        }
        return {
            "name": self.name,
            "folder": str(self.folder),
            "size_bytes": self.size_bytes,
            "verdict": self.verdict,
            "fidelity": fidelity,
            "timings": [asdict(t) for t in self.timings],
            "provider": self.provider or None,
            "note": self.note,
        }


@dataclass(frozen=True)
class OptimizeReport:
    """Every variant built, the requested one last (``kind``: sklearn, transformer, torch or
    onnx)."""

    source: str
    kind: str
    task: str
    variants: tuple[VariantReport, ...]

    @property
    def candidate(self) -> VariantReport:
        return self.variants[-1]

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "kind": self.kind,
            "task": self.task,
            "candidate": self.candidate.name,
            "variants": [v.to_json() for v in self.variants],
        }


def _candidate(source: SourceModel, request: OptimizeRequest) -> tuple[str, Any, str]:
    """(name, graph, note) of the requested variant, built from the exported graph (a checked
    request always asks for at least one of pruning, int8 or fp16)."""
    graph, parts, note = source.graph, [], ""
    if request.prune_structured is not None:
        graph, note = _structured(source, request.prune_structured)
        parts.append(f"pruned-structured-{request.prune_structured:.2f}")
    if request.prune is not None:
        graph, achieved = prune_magnitude(graph, request.prune)
        parts.append(f"pruned-{request.prune:.2f}")
        what = f"sparsity {achieved:.2f} of prunable weights"
        if achieved == 0.0:
            what = "no MatMul/Gemm/Conv weights to prune"
        note = "; ".join(n for n in (note, what) if n)
    options = request.int8_options or (
        ENCODER_INT8 if source.kind == "transformer" else Int8Options()
    )
    granularity = "per-channel" if options.per_channel else "per-tensor"
    mode = request.int8_mode()
    if mode == "dynamic":
        graph = quantize_int8_dynamic(graph, options)
        parts.append(f"int8-dynamic-{granularity}")
    elif mode == "static":
        assert request.calibration is not None
        inputs = list(source.eval_set.feeds)
        calibration, _ = load_arrays(request.calibration, inputs)
        graph = quantize_int8_static(graph, calibration, options)
        parts.append(f"int8-static-qdq-{granularity}")
    if request.target == "gpu":
        graph = to_fp16(graph_optimize(graph))
        parts.append("fp16")
    return "+".join(parts), graph, note


def _structured(source: SourceModel, fraction: float) -> tuple[Any, str]:
    """The graph with ``fraction`` of its heads/neurons/channels removed (from the torch module
    when the source has one), basic-optimized as the fp32 variant is, and what was removed."""
    if source.structured is not None:
        graph, summary = source.structured(fraction)
    else:
        graph, summary = prune_onnx_units(source.graph, fraction)
    return graph_optimize(graph), summary.describe()


def _speed_note(request: OptimizeRequest, fp32: VariantReport, candidate: VariantReport) -> str:
    """How a pruned candidate's latency compares with fp32's. Magnitude pruning is always told
    to give no speed-up: ONNX Runtime's CPU kernels do the same work for a zero weight, so a
    lower time measured for it is int8's or the machine's noise."""
    ratio = latency_ratio(fp32.timings, candidate.timings)
    if ratio is None or (request.prune is None and request.prune_structured is None):
        return ""
    note = f"p50 {ratio:.2f}x fp32's"
    if request.prune is None:
        return note
    note += "; sparsity gives no speed-up on this runtime"
    if request.int8_mode() is not None:
        return note + " (the speed-up measured is int8's)"
    if ratio <= 0.95:
        return note + " (its CPU kernels do not skip zero weights: the difference is noise)"
    return note


def _provider(name: str) -> tuple[str, str]:
    """(execution provider to time on, note) for a variant."""
    ort = module("onnxruntime")

    if not name.endswith("fp16"):
        return CPU, ""
    if CUDA in ort.get_available_providers():
        return CUDA, ""
    return "", f"not timed: {CUDA} is not available here (fp16 is a GPU variant)"


def _with_labels(task: str, outputs: dict[str, Any]) -> dict[str, Any]:
    """A classifier whose first output is class scores (float, ``[batch, classes]``, as a
    PyTorch classifier returns) is judged on its labels: their argmax is put first, under
    ``LABEL_KEY``, so the task metric compares labels while the distance covers the scores.
    Other outputs are returned as they are."""
    first = next(iter(outputs.values()), None)
    if task != "classification" or first is None or first.dtype.kind != "f":
        return outputs
    if first.ndim != 2 or first.shape[1] < 2:
        return outputs
    return {LABEL_KEY: first.argmax(axis=1), **outputs}


def _build(
    name: str,
    graph: Any,
    source: SourceModel,
    request: OptimizeRequest,
    reference: dict[str, Any],
    dest: Path,
    progress: ProgressSink,
) -> tuple[Fidelity, tuple[Timing, ...], str, str]:
    origin = {"model_uri": request.source_uri, "variant": name} if request.source_uri else None
    folder = dest / name
    write_model_folder(
        folder,
        graph,
        task=source.task,
        source=origin,
        max_batch_size=source.max_batch_size,
        labels=source.labels,
    )
    path = folder / MODEL_FILE
    evals = source.eval_set
    try:
        outputs = run_batches(session(path, max(request.threads)), evals.feeds)
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
        logger.info("variant %s does not run on CPU: %r", name, exc)
        progress.step(f"{name}: fidelity")
        return (
            unverified(evals.origin, "does not run on CPU, so fidelity cannot be checked"),
            (),
            "",
            "",
        )
    fidelity = compare(
        source.task,
        reference,
        _with_labels(source.task, outputs),
        evals.labels,
        request.thresholds,
        evals.origin,
    )
    progress.step(f"{name}: fidelity")
    provider, note = _provider(name)
    timings: tuple[Timing, ...] = ()
    if provider and request.timed:
        timings = tuple(
            measure_latency(
                path,
                evals.feeds,
                request.batches,
                request.threads,
                repeats=request.repeats,
                on_step=lambda: progress.step(f"{name}: latency"),
            )
        )
    return fidelity, timings, provider, note


def optimize_model(
    location: Path,
    dest: Path,
    request: OptimizeRequest | None = None,
    *,
    progress: ProgressSink | None = None,
) -> OptimizeReport:
    """Build, check and measure the fp32 variant and the requested one.

    Args:
        location: a local model (see :func:`shamal.optimize.load_source`).
        dest: folder that receives one model folder per variant (``dest/<variant>``).
        request: what to build; default int8 dynamic, per-channel.
        progress: receives a total, then one step per fidelity check and latency point.

    Raises:
        InvalidParameter: a bad request, or a source the loaders refuse.
    """
    request = request or OptimizeRequest()
    request.check()
    sink = progress or _Silent()
    source = load_source(
        location,
        eval_data=request.eval_data,
        trust_pickle=request.trust_pickle,
        sequence_length=request.sequence_length,
        sandbox=request.sandbox,
        torch_factory=request.torch_factory,
    )
    reference = _with_labels(source.task, source.reference(source.eval_set.feeds))
    fp32 = graph_optimize(source.graph)
    name, graph, note = _candidate(source, request)
    plan = [("fp32", fp32, ""), (name, graph, note)]
    points = len(request.batches) * len(request.threads) if request.timed else 0
    sink.start(len(plan) * (1 + points))
    reports = []
    for variant, built, why in plan:
        fidelity, timings, provider, timing_note = _build(
            variant, built, source, request, reference, dest, sink
        )
        size = (dest / variant / MODEL_FILE).stat().st_size
        notes = "; ".join(n for n in (why, timing_note) if n)
        reports.append(
            VariantReport(variant, dest / variant, size, fidelity, timings, provider, notes)
        )
    speed = _speed_note(request, reports[0], reports[-1])
    if speed:
        reports[-1] = replace(
            reports[-1], note="; ".join(n for n in (reports[-1].note, speed) if n)
        )
    return OptimizeReport(str(location), source.kind, source.task, tuple(reports))
