"""The model folder: what the optimizer writes and what serving reads.

A model folder holds ``model.onnx`` and ``shamal-model.json``::

    {"schema": 1, "format": "onnx", "path": "model.onnx", "max_batch_size": 0,
     "task": "classification",
     "inputs":  [{"name": "input", "datatype": "FP32", "shape": [-1, 4]}],
     "outputs": [{"name": "label", "datatype": "INT64", "shape": [-1]}],
     "source": {"model_uri": "models:/wine/1", "variant": "int8-dynamic-per-channel"},
     "labels": {"probabilities": ["class_0", "class_1", "class_2"]}}

Datatypes are Open Inference Protocol names; ``-1`` marks a variable dimension. ``labels``
(optional) names the classes of a classifier's score output, by index, for the classification
extension of ``shamal serve``. The ONNX file
never uses external data (every tensor is inside ``model.onnx``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from shamal.errors import InvalidParameter
from shamal.optimize._safety import check_onnx_file, contained

if TYPE_CHECKING:
    import onnx

__all__ = [
    "MANIFEST",
    "MODEL_FILE",
    "ModelFolder",
    "TensorSpec",
    "read_model_folder",
    "write_model_folder",
]

logger = logging.getLogger(__name__)

MANIFEST = "shamal-model.json"
MODEL_FILE = "model.onnx"
SCHEMA = 1
Task = Literal["classification", "regression", "embedding", "other"]
TASKS: tuple[str, ...] = ("classification", "regression", "embedding", "other")

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
DATATYPES = frozenset(_OIP_OF_ONNX.values())


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input or output: its name, OIP datatype and shape (-1 = variable)."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, raw: Any) -> TensorSpec:
        if not isinstance(raw, dict) or set(raw) != {"name", "datatype", "shape"}:
            raise InvalidParameter("shamal-model.json: a tensor needs name, datatype and shape.")
        name, datatype, shape = raw["name"], raw["datatype"], raw["shape"]
        if not isinstance(name, str) or not name or datatype not in DATATYPES:
            raise InvalidParameter("shamal-model.json: a tensor has a bad name or datatype.")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in shape
        ):
            raise InvalidParameter("shamal-model.json: a tensor shape must be a list of ints.")
        return cls(name, datatype, tuple(shape))


@dataclass(frozen=True, slots=True)
class ModelFolder:
    """The manifest of a model folder.

    Attributes:
        inputs, outputs: the graph's tensors, in graph order.
        path: the ONNX file, relative to the folder (``model.onnx`` in what Shamal writes).
        task: what the outputs mean (classification, regression, embedding, other).
        max_batch_size: 0 when the batch dimension is free, else the largest batch allowed.
        source: ``{"model_uri": ..., "variant": ...}`` of what it was made from, or None.
        labels: output name -> class names by index (classifiers), or empty.
    """

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    task: str = "other"
    max_batch_size: int = 0
    source: dict[str, str] | None = field(default=None)
    path: str = MODEL_FILE
    labels: dict[str, list[str]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "format": "onnx",
            "path": self.path,
            "max_batch_size": self.max_batch_size,
            "task": self.task,
            "inputs": [t.to_json() for t in self.inputs],
            "outputs": [t.to_json() for t in self.outputs],
            "source": dict(self.source) if self.source is not None else None,
            **({"labels": self.labels} if self.labels else {}),
        }


def checked_labels(raw: object) -> dict[str, list[str]]:
    """``labels`` as written in a manifest (or returned by the sandboxed loader): an object of
    output name -> list of class names.

    Raises:
        InvalidParameter: any other shape.
    """
    if raw is None:
        return {}
    if isinstance(raw, dict) and all(
        isinstance(names, list) and all(isinstance(n, str) and len(n) <= 1024 for n in names)
        for names in raw.values()
    ):
        return {str(output): list(names) for output, names in raw.items()}
    raise InvalidParameter(f"{MANIFEST}: labels must map output names to lists of class names.")


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
    """Read and validate a model folder's manifest, and check its ONNX file.

    Raises:
        InvalidParameter: a missing or malformed manifest, a path outside the folder, or an
            ONNX file that is not ONNX or references external data.
    """
    try:
        raw = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        raise InvalidParameter(f"{MANIFEST} is missing or is not JSON.") from None
    if not isinstance(raw, dict) or raw.get("schema") != SCHEMA or raw.get("format") != "onnx":
        raise InvalidParameter(f"{MANIFEST}: expected schema 1, format onnx.")
    if not isinstance(raw.get("path"), str) or raw.get("task") not in TASKS:
        raise InvalidParameter(f"{MANIFEST}: path and task are required.")
    max_batch = raw.get("max_batch_size", 0)
    if not isinstance(max_batch, int) or isinstance(max_batch, bool) or max_batch < 0:
        raise InvalidParameter(f"{MANIFEST}: max_batch_size must be an int >= 0.")
    source = raw.get("source")
    if source is not None and not (
        isinstance(source, dict) and all(isinstance(v, str) for v in source.values())
    ):
        raise InvalidParameter(f"{MANIFEST}: source must be null or an object of strings.")
    check_onnx_file(contained(folder, raw["path"]), folder)
    return ModelFolder(
        inputs=tuple(TensorSpec.from_json(t) for t in raw.get("inputs") or []),
        outputs=tuple(TensorSpec.from_json(t) for t in raw.get("outputs") or []),
        task=raw["task"],
        max_batch_size=max_batch,
        source=source,
        path=raw["path"],
        labels=checked_labels(raw.get("labels")),
    )
