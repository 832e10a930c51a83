"""The transformations that make a variant from an exported fp32 ONNX graph.

Each takes an ONNX model (in memory) and returns a new one; none writes external data.

Default for transformer encoders (measured on all-MiniLM-L6-v2, 600 sentences, 2 threads, see
``bench/RESULTS.md``): dynamic int8 with **per-channel** QInt8 weights and only ``MatMul``
quantized. Per-tensor weights lost too much (cosine min 0.94); per-channel kept the minimum
cosine at 0.986 and ran batch 1 4.5x faster than PyTorch. ONNX Runtime's BERT fusion
(``onnxruntime.transformers.optimizer``) was tried first and not kept: on this encoder it was
not faster on CPU (9.7 vs 8.6 ms at batch 1) and the quantizer cannot type its fused ops.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shamal.errors import InvalidParameter
from shamal.optimize._lazy import module

__all__ = [
    "Int8Options",
    "graph_optimize",
    "prune_magnitude",
    "quantize_int8_dynamic",
    "quantize_int8_static",
    "to_fp16",
]

logger = logging.getLogger(__name__)

_PRUNABLE = {"MatMul": 1, "Gemm": 1, "Conv": 1}  # op type -> index of its weight input


@dataclass(frozen=True, slots=True)
class Int8Options:
    """How int8 quantization is done.

    Attributes:
        per_channel: one scale per output channel of each weight (default; per-tensor loses
            too much on transformer encoders).
        reduce_range: 7-bit weights, for older CPUs without VNNI.
        op_types: op types to quantize; None = ONNX Runtime's default set.
        nodes_to_exclude: node names kept in fp32.
    """

    per_channel: bool = True
    reduce_range: bool = False
    op_types: tuple[str, ...] | None = None
    nodes_to_exclude: tuple[str, ...] = ()


#: The default for transformer encoders (see the module docstring for the measurements).
ENCODER_INT8 = Int8Options(per_channel=True, op_types=("MatMul",))


class _QuantizerAdvice(logging.Filter):
    """Moves the quantizer's advice (logged on the root logger) to this module's debug log."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "onnxruntime" in record.pathname and "quantization" in record.pathname:
            logger.debug("onnxruntime quantizer: %s", record.getMessage())
            return False
        return True


@contextmanager
def _quiet_quantizer() -> Iterator[None]:
    root, advice = logging.getLogger(), _QuantizerAdvice()
    root.addFilter(advice)
    try:
        yield
    finally:
        root.removeFilter(advice)


#: The ai.onnx opset declared for graphs that use only other domains before quantizing.
_DEFAULT_OPSET = 17


def _with_default_opset(model: Any) -> Any:
    """``model`` with exactly one ai.onnx opset declared, as ONNX Runtime's quantizer demands.

    skl2onnx graphs of plain linear models use ai.onnx.ml operators and may declare the ai.onnx
    domain twice or not at all; the quantizer refuses both (it adds its quantize/dequantize
    nodes in that domain)."""
    import onnx

    default = [e.version for e in model.opset_import if e.domain in ("", "ai.onnx")]
    if len(default) == 1:
        return model
    declared = onnx.ModelProto()
    declared.CopyFrom(model)
    others = [e for e in model.opset_import if e.domain not in ("", "ai.onnx")]
    del declared.opset_import[:]
    declared.opset_import.extend(others)
    declared.opset_import.append(onnx.helper.make_opsetid("", max(default, default=_DEFAULT_OPSET)))
    return declared


def _save_tmp(model: Any, folder: Path, name: str) -> Path:
    import onnx

    path = folder / name
    onnx.save_model(model, str(path), save_as_external_data=False)
    return path


def graph_optimize(model: Any) -> Any:
    """ONNX Runtime's basic graph optimizations (constant folding, redundant node removal),
    applied offline. Basic level only: the result stays portable across execution providers."""
    import onnx

    ort = module("onnxruntime")

    with tempfile.TemporaryDirectory(prefix="shamal-opt-") as tmp:
        src = _save_tmp(model, Path(tmp), "in.onnx")
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(Path(tmp) / "out.onnx")
        ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])
        return onnx.load_model(str(Path(tmp) / "out.onnx"))


def quantize_int8_dynamic(model: Any, options: Int8Options) -> Any:
    """Dynamic int8 (weights QInt8 offline, activations quantized at run time)."""
    import onnx

    quantization = module("onnxruntime.quantization")

    with tempfile.TemporaryDirectory(prefix="shamal-q-") as tmp:
        src = _save_tmp(_with_default_opset(model), Path(tmp), "in.onnx")
        dst = Path(tmp) / "out.onnx"
        with _quiet_quantizer():
            quantization.quantize_dynamic(
                src,
                dst,
                per_channel=options.per_channel,
                reduce_range=options.reduce_range,
                weight_type=quantization.QuantType.QInt8,
                op_types_to_quantize=list(options.op_types) if options.op_types else None,
                nodes_to_exclude=list(options.nodes_to_exclude),
                # skl2onnx's linear classifiers feed a MatMul into ai.onnx.ml operators, where
                # shape inference finds no type; such tensors are float.
                extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
            )
        return onnx.load_model(str(dst))


class _Batches:
    """A CalibrationDataReader over named arrays, ``size`` rows at a time."""

    def __init__(self, arrays: Mapping[str, np.ndarray], size: int = 16) -> None:
        rows = {len(a) for a in arrays.values()}
        if len(rows) != 1:
            raise InvalidParameter("Calibration arrays must all have the same number of rows.")
        self._iter = self._batches(arrays, size, rows.pop())

    @staticmethod
    def _batches(
        arrays: Mapping[str, np.ndarray], size: int, count: int
    ) -> Iterator[dict[str, np.ndarray]]:
        for start in range(0, count, size):
            yield {k: v[start : start + size] for k, v in arrays.items()}

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._iter, None)


def quantize_int8_static(
    model: Any, calibration: Mapping[str, np.ndarray], options: Int8Options
) -> Any:
    """Static int8 in QDQ format: activation ranges calibrated on ``calibration`` (named input
    arrays), weights QInt8 (per channel by default)."""
    import onnx

    quantization = module("onnxruntime.quantization")
    reader = type("Reader", (_Batches, quantization.CalibrationDataReader), {})

    with tempfile.TemporaryDirectory(prefix="shamal-q-") as tmp:
        src = _save_tmp(_with_default_opset(model), Path(tmp), "in.onnx")
        dst = Path(tmp) / "out.onnx"
        with _quiet_quantizer():
            quantization.quantize_static(
                src,
                dst,
                reader(calibration),
                quant_format=quantization.QuantFormat.QDQ,
                per_channel=options.per_channel,
                reduce_range=options.reduce_range,
                activation_type=quantization.QuantType.QInt8,
                weight_type=quantization.QuantType.QInt8,
                op_types_to_quantize=list(options.op_types) if options.op_types else None,
                nodes_to_exclude=list(options.nodes_to_exclude),
            )
        return onnx.load_model(str(dst))


def prune_magnitude(model: Any, sparsity: float) -> tuple[Any, float]:
    """Zero the smallest-magnitude fraction ``sparsity`` of each float weight initializer of
    MatMul, Gemm and Conv nodes.

    Returns:
        (the pruned model, the fraction of those weights that are now zero). 0.0 means the
        graph had no prunable weights (e.g. tree ensembles, linear models as ML-domain ops).
    """
    import onnx
    from onnx import numpy_helper

    if not 0.0 < sparsity < 1.0:
        raise InvalidParameter("--prune takes a sparsity between 0 and 1 (e.g. 0.3).")
    pruned = onnx.ModelProto()
    pruned.CopyFrom(model)
    by_name = {t.name: t for t in pruned.graph.initializer}
    names = {
        node.input[_PRUNABLE[node.op_type]]
        for node in pruned.graph.node
        if node.op_type in _PRUNABLE and len(node.input) > _PRUNABLE[node.op_type]
    }
    zeros = total = 0
    for name in sorted(names & set(by_name)):
        weights = numpy_helper.to_array(by_name[name])
        if weights.dtype.kind != "f" or weights.size < 2:
            continue
        cut = np.quantile(np.abs(weights), sparsity)
        kept = np.where(np.abs(weights) <= cut, 0, weights).astype(weights.dtype)
        by_name[name].CopyFrom(numpy_helper.from_array(kept, name))
        zeros += int((kept == 0).sum())
        total += kept.size
    return pruned, (zeros / total if total else 0.0)


def to_fp16(model: Any) -> Any:
    """Float weights and activations in fp16, inputs and outputs kept in their types."""
    float16 = module("onnxruntime.transformers.float16")
    return float16.convert_float_to_float16(model, keep_io_types=True)
