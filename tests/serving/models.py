"""Model builders for the serving tests: small ONNX graphs, a scikit-learn classifier, a gated
torch model, and hostile model files. Everything is generated here; nothing is downloaded.

Builders (each writes into a folder you give and returns the path to pass to ``--model``):

* :func:`identity_model` - ``INPUT0`` -> ``OUTPUT0``, one OIP datatype, ``[-1, 4]``.
* :func:`add_sub_model` - FP32 ``INPUT0``, ``INPUT1`` -> ``OUTPUT0`` (sum), ``OUTPUT1`` (diff).
* :func:`scale_model` - FP32 ``x`` -> ``y = x * factor`` (used as versions 1 and 2).
* :func:`iris_model` - an iris LogisticRegression converted with skl2onnx, plus the fitted
  estimator and its data, to compare answers.
* :func:`gated_model` - a torch model (safetensors + manifest) whose forward waits for a gate
  file; serve it with :data:`GATE_ENV` set to a folder and
  ``--torch-factory NAME=tests.serving.factories:gated``.
* :func:`pickle_bomb` - a pickle whose ``__reduce__`` would ``touch SENTINEL``.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

OPSET = 17
IR_VERSION = 8
GATE_ENV = "SERVE_TEST_GATE"

#: OIP datatype -> ONNX element type, for every datatype the ONNX backend serves.
ONNX_TYPES = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
}


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))
    return path


def identity_model(path: Path, datatype: str, width: int | str = 4) -> Path:
    """An ONNX Identity on ``[-1, width]`` tensors of ``datatype`` at ``path`` (a .onnx file);
    a ``width`` that is a name makes that dimension variable too."""
    kind = ONNX_TYPES[datatype]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        f"identity_{datatype.lower()}",
        [helper.make_tensor_value_info("INPUT0", kind, ["batch", width])],
        [helper.make_tensor_value_info("OUTPUT0", kind, ["batch", width])],
    )
    return _save(graph, path)


def add_sub_model(path: Path) -> Path:
    """FP32 ``[-1, 4]`` inputs ``INPUT0``/``INPUT1`` -> ``OUTPUT0 = a + b``, ``OUTPUT1 = a - b``."""
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        "add_sub",
        [
            helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("INPUT1", TensorProto.FLOAT, ["batch", 4]),
        ],
        [
            helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("OUTPUT1", TensorProto.FLOAT, ["batch", 4]),
        ],
    )
    return _save(graph, path)


def scale_model(path: Path, factor: float) -> Path:
    """FP32 ``x`` ``[-1, 2]`` -> ``y = x * factor``."""
    const = helper.make_tensor("factor", TensorProto.FLOAT, [1], [factor])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "factor"], ["y"])],
        "scale",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        initializer=[const],
    )
    return _save(graph, path)


def iris_model(folder: Path) -> tuple[Path, Any, np.ndarray]:
    """An iris LogisticRegression as ONNX (``float_input`` -> ``label``, ``probabilities``).

    Returns:
        The model folder (with a ``shamal-model.json``), the fitted estimator, and the features.
    """
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    features, target = load_iris(return_X_y=True)
    features = features.astype(np.float32)
    estimator = LogisticRegression(max_iter=500).fit(features, target)
    onx = to_onnx(
        estimator,
        initial_types=[("float_input", FloatTensorType([None, 4]))],
        options={id(estimator): {"zipmap": False}},
        target_opset={"": OPSET, "ai.onnx.ml": 3},
    )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.onnx").write_bytes(onx.SerializeToString())
    write_manifest(
        folder,
        fmt="onnx",
        path="model.onnx",
        inputs=[{"name": "float_input", "datatype": "FP32", "shape": [-1, 4]}],
        outputs=[
            {"name": "label", "datatype": "INT64", "shape": [-1]},
            {"name": "probabilities", "datatype": "FP32", "shape": [-1, 3]},
        ],
        labels={"probabilities": [str(name) for name in load_iris().target_names]},
    )
    return folder, estimator, features


def write_manifest(
    folder: Path,
    *,
    fmt: str,
    path: str,
    inputs: list[dict[str, Any]] | None = None,
    outputs: list[dict[str, Any]] | None = None,
    max_batch_size: int = 0,
    **extra: Any,
) -> Path:
    """Write ``shamal-model.json`` into ``folder``."""
    manifest: dict[str, Any] = {
        "schema": 1,
        "format": fmt,
        "path": path,
        "max_batch_size": max_batch_size,
        "task": None,
        "source": None,
    }
    if inputs is not None:
        manifest["inputs"] = inputs
    if outputs is not None:
        manifest["outputs"] = outputs
    manifest.update(extra)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "shamal-model.json").write_text(json.dumps(manifest))
    return folder


def gated_model(folder: Path, factor: float = 2.0) -> Path:
    """A torch model folder for ``tests.serving.factories:gated``: ``y = x * factor``, FP32
    ``x`` ``[-1, 2]``; each forward call waits for the gate (see the factory)."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({"factor": torch.tensor([factor])}, str(folder / "model.safetensors"))
    return write_manifest(
        folder,
        fmt="torch",
        path="model.safetensors",
        inputs=[{"name": "x", "datatype": "FP32", "shape": [-1, 2]}],
        outputs=[{"name": "y", "datatype": "FP32", "shape": [-1, 2]}],
        max_batch_size=64,
    )


class _Touch:
    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.sentinel}",))


def pickle_bomb(path: Path, sentinel: Path) -> Path:
    """A pickle that runs ``touch SENTINEL`` when loaded, written to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(_Touch(sentinel), protocol=4))
    return path


def external_data_model(folder: Path, location: str) -> Path:
    """An ONNX graph whose initializer claims to live in external file ``location``."""
    tensor = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
    tensor.ClearField("float_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "8")):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["y"])],
        "external",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        initializer=[tensor],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path
