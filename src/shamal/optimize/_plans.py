"""Variant plans: a name, and how to write the variant's model folder when its turn comes.

Writing is deferred so a variant that cannot be built (a graph OpenVINO cannot convert, a
quantizer that refuses an operator) is reported as such while the others go on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shamal.modelformat import IR_FILE, CpuInfo
from shamal.optimize._folder import MODEL_FILE, write_model_folder
from shamal.optimize._openvino import (
    openvino_available,
    quantize_openvino_int8,
    to_openvino,
    write_openvino_folder,
)
from shamal.optimize._sources import SourceModel
from shamal.optimize._variants import (
    ENCODER_INT8,
    Int8Options,
    quantize_int8_dynamic,
    quantize_int8_static,
)

__all__ = ["OPENVINO", "Plan", "choice_plans", "onnx_plan", "openvino_plan"]

OPENVINO = "openvino"


@dataclass(frozen=True)
class Plan:
    """One variant to build: ``write(folder)`` writes it and returns its model file."""

    name: str
    write: Callable[[Path], Path]
    note: str = ""
    runtime: str = "onnxruntime"


def _folder_args(source: SourceModel, origin: dict[str, str] | None) -> dict[str, Any]:
    return {
        "task": source.task,
        "source": origin,
        "max_batch_size": source.max_batch_size,
        "labels": source.labels,
    }


def onnx_plan(
    name: str, graph: Any, source: SourceModel, origin: dict[str, str] | None, note: str = ""
) -> Plan:
    """An ONNX Runtime variant whose graph is already built."""

    def write(folder: Path) -> Path:
        write_model_folder(folder, graph, **_folder_args(source, origin))
        return folder / MODEL_FILE

    return Plan(name, write, note)


def openvino_plan(
    name: str,
    source: SourceModel,
    origin: dict[str, str] | None,
    *,
    precision: str = "f32",
    calibration: Mapping[str, np.ndarray] | None = None,
    note: str = "",
) -> Plan:
    """An OpenVINO variant of the source's graph: converted, int8-quantized when
    ``calibration`` is given, run at ``precision``."""

    def write(folder: Path) -> Path:
        model = source.openvino() if source.openvino is not None else to_openvino(source.graph)
        if calibration is not None:
            model = quantize_openvino_int8(
                model, calibration, transformer=source.kind == "transformer"
            )
        write_openvino_folder(
            folder, model, source.graph, precision=precision, **_folder_args(source, origin)
        )
        return folder / IR_FILE

    return Plan(name, write, note, OPENVINO)


def _int8_options(source: SourceModel, options: Int8Options | None) -> Int8Options:
    return options or (ENCODER_INT8 if source.kind == "transformer" else Int8Options())


def choice_plans(
    source: SourceModel,
    origin: dict[str, str] | None,
    calibration: Mapping[str, np.ndarray],
    cpu: CpuInfo,
    options: Int8Options | None = None,
) -> tuple[list[Plan], list[str]]:
    """Every candidate this CPU can run, and a note for each left out and why.

    ONNX Runtime dynamic and static int8 always; OpenVINO f32 and int8 when installed, bf16
    (and int8 with bf16 for the operations kept in float) where the CPU computes bf16 natively,
    and f16 where it computes fp16 natively (elsewhere those precisions are emulated or
    ignored, never faster).
    """
    chosen = _int8_options(source, options)
    granularity = "per-channel" if chosen.per_channel else "per-tensor"

    def dynamic(folder: Path) -> Path:
        graph = quantize_int8_dynamic(source.graph, chosen)
        write_model_folder(folder, graph, **_folder_args(source, origin))
        return folder / MODEL_FILE

    def static(folder: Path) -> Path:
        graph = quantize_int8_static(source.graph, dict(calibration), chosen)
        write_model_folder(folder, graph, **_folder_args(source, origin))
        return folder / MODEL_FILE

    plans = [
        Plan(f"int8-dynamic-{granularity}", dynamic),
        Plan(f"int8-static-qdq-{granularity}", static),
    ]
    skipped: list[str] = []
    if not openvino_available():
        skipped.append(
            "OpenVINO builds: OpenVINO is not installed (pip install 'shamal[openvino]')"
        )
        return plans, skipped
    plans.append(openvino_plan("openvino-f32", source, origin))
    plans.append(openvino_plan("openvino-int8", source, origin, calibration=calibration))
    if cpu.native_bf16:
        plans.append(openvino_plan("openvino-bf16", source, origin, precision="bf16"))
        # int8 where quantized, bf16 for the operations kept in float (softmax, norms, head).
        plans.append(
            openvino_plan(
                "openvino-int8-bf16", source, origin, precision="bf16", calibration=calibration
            )
        )
    else:
        skipped.append("openvino-bf16: this CPU has no native bf16 (AVX-512 BF16 or AMX)")
    if cpu.native_fp16:
        plans.append(openvino_plan("openvino-f16", source, origin, precision="f16"))
    else:
        skipped.append("fp16: this CPU has no native fp16 arithmetic (AVX-512 FP16 or AMX-FP16)")
    return plans, skipped
