"""Model optimizer: export to ONNX, graph optimization, int8 quantization, pruning, OpenVINO
builds, and a fidelity + latency report for each variant (``shamal optimize``); with
``--choose``, the fastest variant that passes on this CPU, kept as a variant set by CPU kind.
Structured pruning (heads, neurons, channels) is in :mod:`shamal.optimize._structured`;
distillation of an encoder into a student of fewer layers, trained with :mod:`shamal.train`
and judged by the same gate (``shamal distill``), in :mod:`shamal.optimize._distill`.

Importing this package does not import torch, transformers or skl2onnx; each loader imports
what it needs when called.

The **model folder** it writes (and serving reads) holds ``model.onnx`` and
``shamal-model.json``; see :mod:`shamal.optimize._folder` for the format. It also reads a
**torch model folder** (safetensors + a manifest of format torch) whose module is built by a
factory the operator names; see :mod:`shamal.optimize._torch`.
"""

from __future__ import annotations

from shamal.optimize._distill import DistillLog, DistillReport, DistillRequest, distill_encoder
from shamal.optimize._distill_job import (
    DISTILL_EXPERIMENT,
    DistillOutcome,
    distill_model,
    distill_tags,
    teacher_folder,
)
from shamal.optimize._folder import (
    MANIFEST,
    MODEL_FILE,
    ModelFolder,
    TensorSpec,
    read_model_folder,
    write_model_folder,
)
from shamal.optimize._measure import Fidelity, Thresholds, Timing
from shamal.optimize._openvino import openvino_available
from shamal.optimize._pipeline import (
    OptimizeReport,
    OptimizeRequest,
    ProgressSink,
    VariantReport,
    optimize_model,
)
from shamal.optimize._recipes import build_minilm_int8, choose_minilm, export_sklearn
from shamal.optimize._register import fetch_source, register_variant, variant_tags
from shamal.optimize._report import ChosenSet
from shamal.optimize._safety import check_onnx_file, contained, load_onnx, sniff_format
from shamal.optimize._sandbox import SandboxedModel, SandboxLimits
from shamal.optimize._sklearn import (
    convert_trusted_pickle,
    export_mlflow_sklearn,
    load_sklearn_model,
)
from shamal.optimize._sources import EvalSet, SourceModel, load_source
from shamal.optimize._structured import PruneSummary, prune_onnx_units, prune_transformer
from shamal.optimize._student import (
    build_student,
    choose_layers,
    generated_sentences,
    read_sentences,
    student_weights,
)
from shamal.optimize._torch import (
    TorchSource,
    export_torch,
    is_torch_folder,
    load_torch_model,
    read_torch_manifest,
)
from shamal.optimize._transformer import tokenize
from shamal.optimize._variants import ENCODER_INT8, Int8Options

__all__ = [
    "DISTILL_EXPERIMENT",
    "ENCODER_INT8",
    "ChosenSet",
    "MANIFEST",
    "MODEL_FILE",
    "DistillLog",
    "DistillOutcome",
    "DistillReport",
    "DistillRequest",
    "EvalSet",
    "Fidelity",
    "Int8Options",
    "ModelFolder",
    "OptimizeReport",
    "OptimizeRequest",
    "ProgressSink",
    "PruneSummary",
    "SandboxLimits",
    "SandboxedModel",
    "SourceModel",
    "TensorSpec",
    "TorchSource",
    "Thresholds",
    "Timing",
    "VariantReport",
    "build_minilm_int8",
    "choose_minilm",
    "build_student",
    "check_onnx_file",
    "choose_layers",
    "contained",
    "convert_trusted_pickle",
    "distill_encoder",
    "distill_model",
    "distill_tags",
    "export_mlflow_sklearn",
    "export_sklearn",
    "export_torch",
    "fetch_source",
    "generated_sentences",
    "is_torch_folder",
    "load_onnx",
    "load_sklearn_model",
    "openvino_available",
    "load_torch_model",
    "load_source",
    "optimize_model",
    "prune_onnx_units",
    "prune_transformer",
    "read_model_folder",
    "read_sentences",
    "read_torch_manifest",
    "register_variant",
    "sniff_format",
    "student_weights",
    "teacher_folder",
    "tokenize",
    "variant_tags",
    "write_model_folder",
]
