"""OpenVINO variants: a model converted to OpenVINO IR, run at f32, bf16 or f16, or quantized
to int8 after training with NNCF on calibration inputs.

Encoders are converted from their PyTorch module (attention stays one fused operation, see
:func:`encoder_to_openvino`); other models from their ONNX graph. OpenVINO and NNCF are the
``openvino`` extra; without them the optimizer builds ONNX Runtime variants only and says why.
Measured on all-MiniLM-L6-v2 (2 threads, 128 tokens, AMD EPYC with AVX-512 VNNI and BF16; see
``bench/RESULTS.md``): int8 3.4 ms at batch 1 and 80-86 ms at batch 32, against PyTorch's 20 ms
and 520-580 ms. NNCF's transformer scheme with SmoothQuant wrecked that encoder (cosine 0.26)
when it quantized the pooling and normalization head after the last MatMul; with that head
kept in float, int8 keeps cosine mean 0.998 and min 0.995 (SmoothQuant off: 0.993 and 0.987).
The fidelity gate judges every build either way.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import logging
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shamal.errors import InvalidParameter
from shamal.modelformat import IR_FILE, MANIFEST, ModelFolder, TensorSpec, read_manifest
from shamal.optimize._folder import TASKS, specs_of
from shamal.optimize._lazy import module

__all__ = [
    "OpenVinoSession",
    "encoder_to_openvino",
    "openvino_available",
    "quantize_openvino_int8",
    "to_openvino",
    "write_openvino_folder",
]

logger = logging.getLogger(__name__)

_CALIBRATION_ROWS = 300
_WEIGHTED_OPS = frozenset({"MatMul", "Convolution", "GroupConvolution"})


def openvino_available() -> bool:
    """Whether OpenVINO and NNCF are installed (the ``openvino`` extra)."""
    return all(importlib.util.find_spec(name) is not None for name in ("openvino", "nncf"))


def to_openvino(graph: Any) -> Any:
    """An ONNX graph (in memory) as an OpenVINO model, at full precision.

    Raises:
        InvalidParameter: OpenVINO cannot convert the graph (operators it lacks, such as
            the ``ai.onnx.ml`` ones of scikit-learn's linear and tree models).
    """
    onnx = module("onnx")
    ov = module("openvino")
    with tempfile.TemporaryDirectory(prefix="shamal-ov-") as work:
        path = Path(work) / "model.onnx"
        onnx.save_model(graph, str(path), save_as_external_data=False)
        try:
            return ov.convert_model(str(path))
        except Exception as exc:  # OpenVINO raises its own OpConversionFailure and others
            logger.info("OpenVINO cannot convert the graph: %r", exc)
            raise InvalidParameter(
                "OpenVINO cannot convert this graph (it uses operators OpenVINO lacks)."
            ) from None


def encoder_to_openvino(torch_module: Any, input_names: Sequence[str], output_name: str) -> Any:
    """A PyTorch token encoder (int64 inputs of shape [batch, sequence]) as an OpenVINO model,
    converted from the module itself rather than from its ONNX export, with the same input and
    output names as the export.

    For encoders this is the faster build: OpenVINO's PyTorch front end keeps the attention
    as one scaled-dot-product operation, which its CPU plugin runs as a single fused kernel;
    the ONNX graph spells attention out (MatMul, Add, Softmax, MatMul, transposes), a pattern
    the plugin does not fuse. On all-MiniLM-L6-v2 at batch 32 (2 threads, AMD EPYC) the int8
    build from the module takes 80 ms against 89 ms from the ONNX graph, at the same cosine.

    Raises:
        InvalidParameter: OpenVINO cannot convert the module.
    """
    ov = module("openvino")
    torch = module("torch")
    inputs = [(name, ov.PartialShape([-1, -1]), ov.Type.i64) for name in input_names]
    example_input = {name: torch.ones((2, 16), dtype=torch.int64) for name in input_names}
    try:
        # The front end traces the module: tracing warnings about transformers' attention code
        # and anything printed are no concern of the caller.
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            model = ov.convert_model(torch_module, example_input=example_input, input=inputs)
    except Exception as exc:  # OpenVINO raises its own conversion errors and others
        logger.info("OpenVINO cannot convert the module: %r", exc)
        raise InvalidParameter("OpenVINO cannot convert this PyTorch module.") from None
    model.outputs[0].get_tensor().set_names({output_name})
    return model


def _calibration_items(feeds: Mapping[str, np.ndarray], rows: int) -> list[dict[str, np.ndarray]]:
    count = min(rows, len(next(iter(feeds.values()))))
    return [{name: array[i : i + 1] for name, array in feeds.items()} for i in range(count)]


def _after_last_matmul(model: Any) -> list[str]:
    """Names of the operations after the graph's last MatMul or convolution: an encoder's
    pooling and normalization head, which int8 (SmoothQuant's scales above all) would distort."""
    ops = list(model.get_ordered_ops())
    weighted = [i for i, op in enumerate(ops) if op.get_type_name() in _WEIGHTED_OPS]
    if not weighted:
        return []
    return [op.get_friendly_name() for op in ops[weighted[-1] + 1 :]]


def quantize_openvino_int8(
    model: Any,
    calibration: Mapping[str, np.ndarray],
    *,
    transformer: bool,
    smooth_quant: bool = True,
) -> Any:
    """Post-training int8 quantization with NNCF over ``calibration`` rows (one row per
    sample, at most 300).

    Args:
        model: an OpenVINO model (:func:`to_openvino`).
        calibration: named input arrays, rows along the first dimension.
        transformer: use NNCF's transformer scheme (keeps softmax, layer norms and the
            attention mask arithmetic in float) and keep the ops after the last MatMul (an
            encoder's pooling and normalization) in float.
        smooth_quant: NNCF's SmoothQuant step for transformers (see the module docstring).
    """
    nncf = module("nncf")
    nncf.set_log_level(logging.ERROR)  # its advice goes to the debug log of the caller
    items = _calibration_items(calibration, _CALIBRATION_ROWS)
    if not items:
        raise InvalidParameter("int8 quantization needs at least one calibration row.")
    options: dict[str, Any] = {"subset_size": len(items)}
    if transformer:
        options["model_type"] = nncf.ModelType.TRANSFORMER
        head = _after_last_matmul(model)
        if head:
            options["ignored_scope"] = nncf.IgnoredScope(names=head, validate=False)
        if not smooth_quant:
            off = nncf.AdvancedSmoothQuantParameters(convolution=-1, matmul=-1)
            options["advanced_parameters"] = nncf.AdvancedQuantizationParameters(
                smooth_quant_alphas=off
            )
    # NNCF draws its own progress bars on stdout, which would break `--json`: they go nowhere
    # (the optimizer's progress bar counts this variant).
    with contextlib.redirect_stdout(io.StringIO()):
        return nncf.quantize(model, nncf.Dataset(items), **options)


def write_openvino_folder(
    dest: Path,
    model: Any,
    graph: Any,
    *,
    task: str,
    precision: str,
    source: dict[str, str] | None = None,
    max_batch_size: int = 0,
    labels: dict[str, list[str]] | None = None,
) -> ModelFolder:
    """Write ``model.xml`` + ``model.bin`` and a manifest of format ``openvino``.

    The tensors are declared from ``graph`` (the ONNX graph the model came from), so the
    variant answers with the same names and datatypes as every other variant of its source.
    """
    ov = module("openvino")
    if task not in TASKS:
        raise InvalidParameter(f"task must be one of {', '.join(TASKS)}.")
    inputs, outputs = specs_of(graph)
    names = {spec.name for spec in outputs}
    kept = {output: classes for output, classes in (labels or {}).items() if output in names}
    manifest = ModelFolder(
        inputs,
        outputs,
        task,
        max_batch_size,
        source,
        IR_FILE,
        kept,
        format="openvino",
        precision=precision,
    )
    dest.mkdir(parents=True, exist_ok=True)
    # compress_to_fp16 would halve the file and change the weights: the variant is what it says.
    ov.save_model(model, str(dest / IR_FILE), compress_to_fp16=False)
    (dest / MANIFEST).write_text(json.dumps(manifest.to_json(), indent=2) + "\n")
    return manifest


class _Output:
    def __init__(self, name: str) -> None:
        self.name = name


class OpenVinoSession:
    """An OpenVINO model folder behind the two calls the optimizer's measurements make of an
    ONNX Runtime session (``get_outputs`` and ``run``), so both runtimes are timed alike."""

    def __init__(self, xml: Path, threads: int) -> None:
        ov = module("openvino")
        folder = xml.parent
        manifest = read_manifest(folder)
        config = {
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_NUM_THREADS": threads,
            "INFERENCE_PRECISION_HINT": manifest.precision or "f32",
        }
        core = ov.Core()
        self._compiled = core.compile_model(core.read_model(str(xml)), "CPU", config)
        self._request = self._compiled.create_infer_request()
        self._outputs: Sequence[TensorSpec] = manifest.outputs
        self._ports = {spec.name: self._compiled.output(spec.name) for spec in manifest.outputs}

    def get_outputs(self) -> list[_Output]:
        return [_Output(spec.name) for spec in self._outputs]

    def run(self, names: Sequence[str] | None, feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        self._request.infer(dict(feed), share_inputs=False)
        wanted = names or [spec.name for spec in self._outputs]
        return [np.array(self._request.get_tensor(self._ports[n]).data, copy=True) for n in wanted]
