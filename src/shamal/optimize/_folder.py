"""The model folder as the optimizer writes it (``model.onnx`` + ``shamal-model.json``).

The format, and the checks both the optimizer and the model server apply when reading one, live
in :mod:`shamal.modelformat`; this module adds what only the optimizer needs: the tensors of an
ONNX graph, and writing a folder. What Shamal writes never uses external data (every tensor is
inside ``model.onnx``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shamal.errors import InvalidParameter
from shamal.modelformat import (
    DATATYPES,
    MANIFEST,
    MODEL_FILE,
    SCHEMA,
    TASKS,
    ModelFolder,
    TensorSpec,
    check_onnx_file,
    checked_labels,
    read_manifest,
)

if TYPE_CHECKING:
    import onnx

__all__ = [
    "DATATYPES",
    "MANIFEST",
    "MODEL_FILE",
    "SCHEMA",
    "TASKS",
    "ModelFolder",
    "TensorSpec",
    "checked_labels",
    "read_model_folder",
    "specs_of",
    "write_model_folder",
]

logger = logging.getLogger(__name__)

# ONNX TensorProto element types -> Open Inference Protocol datatypes.
_OIP_OF_ONNX: dict[int, str] = {
    1: "FP32",
    2: "UINT8",
    3: "INT8",
    4: "UINT16",
    5: "INT16",
    6: "INT32",
    7: "INT64",
    8: "BYTES",
    9: "BOOL",
    10: "FP16",
    11: "FP64",
    12: "UINT32",
    13: "UINT64",
}


def _dims(value_info: Any) -> tuple[int, ...]:
    dims = value_info.type.tensor_type.shape.dim
    return tuple(d.dim_value if d.HasField("dim_value") else -1 for d in dims)


def specs_of(model: onnx.ModelProto) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """(inputs, outputs) of a graph; initializers listed as inputs are left out."""
    initializers = {t.name for t in model.graph.initializer}

    def spec(value_info: Any) -> TensorSpec:
        elem = value_info.type.tensor_type.elem_type
        if elem not in _OIP_OF_ONNX:
            raise InvalidParameter(
                f"Tensor {value_info.name!r} has an element type the inference protocol lacks."
            )
        return TensorSpec(value_info.name, _OIP_OF_ONNX[elem], _dims(value_info))

    inputs = tuple(spec(v) for v in model.graph.input if v.name not in initializers)
    return inputs, tuple(spec(v) for v in model.graph.output)


def write_model_folder(
    dest: Path,
    model: onnx.ModelProto,
    *,
    task: str,
    source: dict[str, str] | None = None,
    max_batch_size: int = 0,
    labels: dict[str, list[str]] | None = None,
) -> ModelFolder:
    """Write ``model.onnx`` (no external data) and ``shamal-model.json`` into ``dest``;
    ``labels`` for outputs the graph does not have are left out."""
    import onnx

    if task not in TASKS:
        raise InvalidParameter(f"task must be one of {', '.join(TASKS)}.")
    inputs, outputs = specs_of(model)
    names = {spec.name for spec in outputs}
    kept = {output: classes for output, classes in (labels or {}).items() if output in names}
    manifest = ModelFolder(inputs, outputs, task, max_batch_size, source, labels=kept)
    dest.mkdir(parents=True, exist_ok=True)
    if model.ByteSize() >= 2**31 - 1:
        raise InvalidParameter("The model is over 2 GiB; single-file ONNX cannot hold it.")
    onnx.save_model(model, str(dest / MODEL_FILE), save_as_external_data=False)
    (dest / MANIFEST).write_text(json.dumps(manifest.to_json(), indent=2) + "\n")
    return manifest


def read_model_folder(folder: Path) -> ModelFolder:
    """Read and validate an ONNX model folder's manifest, and check its ONNX file.

    Raises:
        InvalidParameter: a missing or malformed manifest, a format other than onnx, a path
            outside the folder, or an ONNX file that is not ONNX or reads data from outside it.
    """
    manifest = read_manifest(folder)
    if manifest.format != "onnx":
        raise InvalidParameter(f"{MANIFEST}: expected format onnx, not {manifest.format}.")
    check_onnx_file(folder / manifest.path, folder)
    return manifest
