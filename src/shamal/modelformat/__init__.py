"""The model folder format: what ``shamal optimize`` writes and ``shamal serve`` reads.

A weights file and ``shamal-model.json``, read as hostile input: see :mod:`._format` for the
format and the checks every reader of model files shares. Standard library only (``onnx`` when a
graph is checked), so the optimizer and the model server share it without loading each other.
"""

from __future__ import annotations

from shamal.modelformat._format import (
    DATATYPES,
    FORMATS,
    MANIFEST,
    MAX_RANK,
    MODEL_FILE,
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

__all__ = [
    "DATATYPES",
    "FORMATS",
    "MANIFEST",
    "MAX_RANK",
    "MODEL_FILE",
    "SCHEMA",
    "TASKS",
    "ModelFolder",
    "TensorSpec",
    "check_onnx_file",
    "checked_labels",
    "contained",
    "external_locations",
    "read_manifest",
    "read_manifest_json",
    "sniff_format",
]
