"""The optimizer: from a source model to measured, fidelity-checked variants.

:func:`optimize_model` always builds the ``fp32`` variant (exported, basic graph
optimizations) and the *candidate* the request asks for (int8 dynamic by default; int8 static,
pruning, fp16 for ``--target gpu``; an OpenVINO build with ``backend="openvino"``), writes each
as a model folder, checks each against the original on held-out inputs and measures each at
several batch sizes and thread counts.

With ``choose=True`` it builds every candidate this CPU can run (ONNX Runtime dynamic and static
int8, OpenVINO f32, int8 and bf16/f16 where the CPU has them natively), measures each here, and
writes the fastest that passes the fidelity gate as a **variant set** (``chosen/``) with a
portable build beside it, recording the CPU and its instruction sets (:mod:`._choose`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from shamal.errors import InvalidParameter
from shamal.modelformat import IR_FILE, CpuInfo, host_cpu
from shamal.optimize._choose import OPENVINO_PROVIDER, assemble_set, contenders
from shamal.optimize._folder import MODEL_FILE
from shamal.optimize._lazy import module
from shamal.optimize._measure import (
    Thresholds,
    Timing,
    compare,
    load_arrays,
    measure_head_to_head,
    measure_latency,
    run_batches,
    session,
    unverified,
)
from shamal.optimize._openvino import openvino_available
from shamal.optimize._plans import OPENVINO, Plan, choice_plans, onnx_plan, openvino_plan
from shamal.optimize._report import OptimizeReport, VariantReport
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
CHOSEN = "chosen"
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
        int8: ``dynamic`` or ``static``; None with no other transformation asked for means
            ``dynamic``.
        calibration: .npz/.npy/.csv inputs for static quantization; None: the source's own
            calibration inputs (generated sentences for encoders) or else the held-out ones.
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
        backend: ``onnxruntime`` (default) or ``openvino`` for the requested candidate.
        choose: build every candidate, measure each here and keep the fastest that passes
            (the other candidate options are then ignored, except ``calibration``).
        merge: a variant set (folder) whose builds for other CPU kinds the chosen set keeps.
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
    backend: str = "onnxruntime"
    choose: bool = False
    merge: Path | None = None
    prune_structured: float | None = None

    def check(self) -> None:
        """Raises InvalidParameter for combinations that make no sense."""
        if self.int8 not in (None, "dynamic", "static"):
            raise InvalidParameter("--int8 takes dynamic or static.")
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
        self._check_backend()

    def _check_backend(self) -> None:
        if self.backend not in ("onnxruntime", "openvino"):
            raise InvalidParameter("--backend takes onnxruntime or openvino.")
        pruned = self.prune is not None or self.prune_structured is not None
        if self.backend == "openvino" and (self.target == "gpu" or pruned):
            raise InvalidParameter("--backend openvino builds CPU variants without --prune.")
        if self.merge is not None and not self.choose:
            raise InvalidParameter("--merge adds to a variant set: it needs --choose.")

    def int8_mode(self) -> str | None:
        if self.target == "gpu":
            return None
        if self.int8 is None and self.prune is None and self.prune_structured is None:
            return "dynamic"
        return self.int8


def _origin(request: OptimizeRequest, name: str) -> dict[str, str] | None:
    return {"model_uri": request.source_uri, "variant": name} if request.source_uri else None


def _candidate_graph(source: SourceModel, request: OptimizeRequest) -> tuple[str, Any, str]:
    """(name, graph, note) of the requested ONNX Runtime variant, built from the exported
    graph (a checked request always asks for at least one of pruning, int8 or fp16)."""
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
        graph = quantize_int8_static(graph, _calibration(source, request), options)
        parts.append(f"int8-static-qdq-{granularity}")
    if request.target == "gpu":
        graph = to_fp16(graph_optimize(graph))
        parts.append("fp16")
    return "+".join(parts), graph, note


def _calibration(source: SourceModel, request: OptimizeRequest) -> dict[str, Any]:
    """Calibration inputs: the file asked for, else the source's own (generated sentences for
    encoders), else the held-out inputs."""
    if request.calibration is not None:
        calibration, _ = load_arrays(request.calibration, list(source.eval_set.feeds))
        return calibration
    return dict(source.calibration or source.eval_set.feeds)


def _openvino_candidate(source: SourceModel, request: OptimizeRequest, cpu: CpuInfo) -> Plan:
    if not openvino_available():
        raise InvalidParameter(
            "--backend openvino needs OpenVINO and NNCF: pip install 'shamal[openvino]'."
        )
    if request.int8 is not None:
        calibration = _calibration(source, request)
        name = "openvino-int8"
        return openvino_plan(name, source, _origin(request, name), calibration=calibration)
    precision = "bf16" if cpu.native_bf16 else "f32"
    name = f"openvino-{precision}"
    return openvino_plan(name, source, _origin(request, name), precision=precision)


def _plans(
    source: SourceModel, request: OptimizeRequest, cpu: CpuInfo
) -> tuple[list[Plan], list[str]]:
    """The variants to build after fp32, and notes on candidates left out."""
    if request.choose:
        return choice_plans(
            source,
            _origin(request, "chosen"),
            _calibration(source, request),
            cpu,
            request.int8_options,
        )
    if request.backend == OPENVINO:
        return [_openvino_candidate(source, request, cpu)], []
    name, graph, note = _candidate_graph(source, request)
    return [onnx_plan(name, graph, source, _origin(request, name), note)], []


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


def _provider(plan: Plan) -> tuple[str, str]:
    """(execution provider to time on, note) for a variant."""
    if plan.runtime == OPENVINO:
        return OPENVINO_PROVIDER, ""
    ort = module("onnxruntime")

    if not plan.name.endswith("fp16"):
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


def _folder_size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())


def _build(
    plan: Plan,
    source: SourceModel,
    request: OptimizeRequest,
    reference: dict[str, Any],
    dest: Path,
    progress: ProgressSink,
) -> VariantReport:
    folder = dest / plan.name
    evals = source.eval_set
    try:
        path = plan.write(folder)
        outputs = run_batches(session(path, max(request.threads)), evals.feeds)
    except InvalidParameter as exc:
        progress.step(f"{plan.name}: fidelity")
        fidelity = unverified(evals.origin, exc.message)
        return VariantReport(plan.name, folder, 0, fidelity, (), "", plan.note)
    except Exception as exc:  # the runtimes and quantizers raise their own types
        logger.info("variant %s does not build or run on CPU: %r", plan.name, exc)
        progress.step(f"{plan.name}: fidelity")
        reason = "does not run on CPU, so fidelity cannot be checked"
        size = _folder_size(folder) if folder.is_dir() else 0
        return VariantReport(plan.name, folder, size, unverified(evals.origin, reason), (), "")
    fidelity = compare(
        source.task,
        reference,
        _with_labels(source.task, outputs),
        evals.labels,
        request.thresholds,
        evals.origin,
    )
    progress.step(f"{plan.name}: fidelity")
    provider, note = _provider(plan)
    timings: tuple[Timing, ...] = ()
    if provider and request.timed:
        timings = tuple(
            measure_latency(
                path,
                evals.feeds,
                request.batches,
                request.threads,
                repeats=request.repeats,
                on_step=lambda: progress.step(f"{plan.name}: latency"),
            )
        )
    notes = "; ".join(n for n in (plan.note, note) if n)
    return VariantReport(
        plan.name, folder, _folder_size(folder), fidelity, timings, provider, notes
    )


def _runoff(
    reports: tuple[VariantReport, ...], source: SourceModel, request: OptimizeRequest
) -> tuple[VariantReport, ...]:
    """The reports with the contenders for the choice (scores too close to call) timed again
    head to head at the most threads; the others as they were."""
    threads = max(request.threads)
    close = contenders(reports, request.batches, threads)
    if len(close) < 2:
        return reports
    files = [v.folder / (IR_FILE if (v.folder / IR_FILE).is_file() else MODEL_FILE) for v in close]
    timed = measure_head_to_head(files, source.eval_set.feeds, request.batches, threads)
    again: dict[str, VariantReport] = {}
    for variant, found in zip(close, timed, strict=True):
        kept = [t for t in variant.timings if t.threads != threads]
        rivals = ", ".join(v.name for v in close if v is not variant)
        note = "; ".join(n for n in (variant.note, f"timed again head to head with {rivals}") if n)
        timings = tuple(sorted([*kept, *found], key=lambda t: (t.threads, t.batch)))
        again[variant.name] = replace(variant, timings=timings, note=note)
    return tuple(again.get(v.name, v) for v in reports)


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
    cpu = host_cpu()
    fp32 = onnx_plan("fp32", graph_optimize(source.graph), source, _origin(request, "fp32"))
    later, skipped = _plans(source, request, cpu)
    plan = [fp32, *later]
    points = len(request.batches) * len(request.threads) if request.timed else 0
    sink.start(len(plan) * (1 + points))
    reports = tuple(_build(p, source, request, reference, dest, sink) for p in plan)
    for note in skipped:
        logger.info("not built: %s", note)
    chosen = None
    if request.choose:
        if request.timed:
            reports = _runoff(reports, source, request)
        chosen = assemble_set(
            dest / CHOSEN, reports, request.batches, max(request.threads), cpu, request.merge
        )
    speed = _speed_note(request, reports[0], reports[-1])
    if speed:
        last = replace(reports[-1], note="; ".join(n for n in (reports[-1].note, speed) if n))
        reports = (*reports[:-1], last)
    return OptimizeReport(str(location), source.kind, source.task, reports, chosen, tuple(skipped))
