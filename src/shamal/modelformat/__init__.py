"""The model folder format: what ``shamal optimize`` writes and ``shamal serve`` reads.

A weights file and ``shamal-model.json``, read as hostile input: see :mod:`._format` for the
format and the checks every reader of model files shares, :mod:`._ir` for OpenVINO graphs,
:mod:`._variantset` for a set of builds by CPU kind and :mod:`._cpu` for what CPU this is.
Standard library only (``onnx`` when a graph is checked), so the optimizer and the model server
share it without loading each other.
"""

from __future__ import annotations

from shamal.modelformat._cpu import CPU_KINDS, CpuInfo, host_cpu, kind_rank, parse_cpuinfo
from shamal.modelformat._format import (
    DATATYPES,
    FORMATS,
    MANIFEST,
    MAX_RANK,
    MODEL_FILE,
    PRECISIONS,
    SCHEMA,
    TASKS,
    ModelFolder,
    TensorSpec,
    check_onnx_file,
    checked_labels,
    contained,
    external_locations,
    read_manifest,
    read_manifest_json,
    sniff_format,
)
from shamal.modelformat._ir import IR_BINARY, IR_FILE, check_openvino_ir
from shamal.modelformat._variantset import (
    VARIANTS_MANIFEST,
    VariantChoice,
    VariantEntry,
    VariantSet,
    is_variant_set,
    pick_variant,
    read_variant_set,
    write_variant_set,
)

__all__ = [
    "CPU_KINDS",
    "DATATYPES",
    "FORMATS",
    "IR_BINARY",
    "IR_FILE",
    "MANIFEST",
    "MAX_RANK",
    "MODEL_FILE",
    "PRECISIONS",
    "SCHEMA",
    "TASKS",
    "VARIANTS_MANIFEST",
    "CpuInfo",
    "ModelFolder",
    "TensorSpec",
    "VariantChoice",
    "VariantEntry",
    "VariantSet",
    "check_onnx_file",
    "check_openvino_ir",
    "checked_labels",
    "contained",
    "external_locations",
    "host_cpu",
    "is_variant_set",
    "kind_rank",
    "parse_cpuinfo",
    "pick_variant",
    "read_manifest",
    "read_manifest_json",
    "read_variant_set",
    "sniff_format",
    "write_variant_set",
]
