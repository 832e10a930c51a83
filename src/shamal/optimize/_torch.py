"""PyTorch model folders to ONNX.

A **torch model folder** is what ``shamal serve`` takes for a PyTorch model: safetensors weights
and a ``shamal-model.json`` with ``"format": "torch"``::

    {"schema": 1, "format": "torch", "path": "model.safetensors", "max_batch_size": 64,
     "task": "classification",
     "inputs":  [{"name": "x", "datatype": "FP32", "shape": [-1, 13]}],
     "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 3]}]}

The module's code is never named by the folder (hostile-inputs.md §4: no imports named by a
manifest): the *operator* names a factory, ``module:function`` importable from the current
environment, that builds the ``nn.Module``; the weights are read with
``safetensors.torch.load_file`` and loaded with ``load_state_dict(strict=True)``. ``torch.load``
is never called, and a folder holding a pickle (or a zip archive, which is how torch pickles its
files) anywhere is refused before any code runs.

The module is called with the inputs as keyword tensors in manifest order and returns a tensor
(one output), a tuple/list (outputs in manifest order) or a mapping by output name, as the
model server's torch backend expects. Every ``-1`` dimension becomes a dynamic ONNX axis.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import tempfile
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shamal.errors import InvalidParameter
from shamal.modelformat import (
    MANIFEST,
    TensorSpec,
    read_manifest,
    read_manifest_json,
    sniff_format,
)
from shamal.optimize._folder import specs_of

__all__ = [
    "TorchManifest",
    "TorchSource",
    "export_torch",
    "is_torch_folder",
    "load_torch_model",
    "read_torch_manifest",
    "refuse_pickles",
    "resolve_factory",
]

logger = logging.getLogger(__name__)

OPSET = 17
_MAX_FILES = 10_000
_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_NUMPY_OF_OIP: dict[str, str] = {
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "UINT8": "uint8",
    "BOOL": "bool",
}
#: Sizes of variable dimensions in the export example; they differ from the evaluation sizes so
#: that a dimension the tracer baked into the graph shows up as a failed fidelity check.
EXPORT_BATCH, EXPORT_DIM = 3, 5
EVAL_DIM = 7
#: Generated integer inputs take values in [0, _INT_HIGH): small and non-negative, so that they
#: are valid indices for any embedding table.
_INT_HIGH = 4

Outputs = dict[str, np.ndarray]


@dataclass(frozen=True)
class TorchManifest:
    """The checked manifest of a torch model folder.

    Attributes:
        weights: the safetensors file, resolved, inside the folder.
        inputs, outputs: the declared tensors (OIP datatypes, -1 = variable).
    """

    weights: Path
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    task: str
    max_batch_size: int


def is_torch_folder(folder: Path) -> bool:
    """Whether ``folder`` has a manifest that says ``"format": "torch"`` (nothing else is
    checked here; :func:`read_torch_manifest` validates it)."""
    if not (folder / MANIFEST).is_file():
        return False
    try:
        raw = read_manifest_json(folder)
    except InvalidParameter:
        return False
    return isinstance(raw, dict) and raw.get("format") == "torch"


def _torch_tensors(specs: tuple[TensorSpec, ...], key: str) -> tuple[TensorSpec, ...]:
    if not specs:
        raise InvalidParameter(f"{MANIFEST}: a torch model must list its {key}.")
    for spec in specs:
        if spec.datatype not in _NUMPY_OF_OIP:
            raise InvalidParameter(
                f"{MANIFEST}: tensor {spec.name!r} is {spec.datatype}; torch models take "
                f"{', '.join(sorted(_NUMPY_OF_OIP))}."
            )
    return specs


def read_torch_manifest(folder: Path) -> TorchManifest:
    """Validate a torch folder's manifest and the weights file it names.

    Raises:
        InvalidParameter: what :func:`~shamal.modelformat.read_manifest` refuses, a format
            other than torch, tensors missing or of a type torch lacks, or weights that are not
            safetensors by their bytes.
    """
    manifest = read_manifest(folder)
    if manifest.format != "torch":
        raise InvalidParameter(f"{MANIFEST}: expected format torch, not {manifest.format}.")
    weights = (folder / manifest.path).resolve()
    kind = sniff_format(weights)
    if kind != "safetensors":
        raise InvalidParameter(
            f"A torch model's weights must be safetensors; {weights.name} looks like {kind} "
            "(pickled torch files are refused)."
        )
    inputs = _torch_tensors(manifest.inputs, "inputs")
    outputs = _torch_tensors(manifest.outputs, "outputs")
    return TorchManifest(weights, inputs, outputs, manifest.task, manifest.max_batch_size)


def refuse_pickles(folder: Path) -> None:
    """Refuse a folder that holds a pickle, a zip archive (torch's pickle container) or a link
    out of the folder, anywhere under it. Formats are told by bytes, never by names.

    Raises:
        InvalidParameter: naming the first such file.
    """
    root = folder.resolve()
    seen = 0
    for base, _dirs, files in os.walk(root):  # symlinked folders are not descended into
        for name in files:
            seen += 1
            if seen > _MAX_FILES:
                raise InvalidParameter(f"The model folder holds over {_MAX_FILES} files.")
            path = Path(base) / name
            shown = path.relative_to(root).as_posix()
            target = path.resolve()
            if not target.is_relative_to(root):
                raise InvalidParameter(f"{shown} links out of the model folder; refused.")
            if not target.is_file():
                continue
            kind = sniff_format(target)
            if kind in ("pickle", "zip"):
                raise InvalidParameter(
                    f"{shown} is a pickle (or an archive of pickles), which can run code when "
                    "loaded; a torch model folder holds safetensors weights only."
                )


def resolve_factory(spec: str) -> Callable[[], Any]:
    """Import the operator's ``module:function`` from the current environment.

    Raises:
        InvalidParameter: malformed, not importable (or failing on import), or not callable.
    """
    if not _FACTORY.match(spec):
        raise InvalidParameter(f"--torch-factory is written module:function, not {spec!r}.")
    module_name, function = spec.split(":")
    try:
        found = importlib.import_module(module_name)
    except Exception as exc:  # an import runs arbitrary module code: any error may come out
        logger.info("torch factory %s did not import: %r", spec, exc)
        raise InvalidParameter(f"Cannot import the torch factory module {module_name!r}.") from None
    target = getattr(found, function, None)
    if target is None:
        raise InvalidParameter(f"Module {module_name!r} has no function {function!r}.")
    if not callable(target):
        raise InvalidParameter(f"The torch factory {spec!r} is not callable.")
    return target  # type: ignore[no-any-return]


def _adapter(model: Any, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]) -> Any:
    """The module behind a positional signature returning a tuple in manifest output order."""
    import torch

    input_names = [s.name for s in inputs]
    output_names = [s.name for s in outputs]

    class Adapter(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
            result = self.model(**dict(zip(input_names, tensors, strict=True)))
            if isinstance(result, torch.Tensor):
                values: list[Any] = [result]
            elif isinstance(result, Mapping):
                missing = [n for n in output_names if n not in result]
                if missing:
                    raise InvalidParameter(f"The module returned no output {missing[0]!r}.")
                values = [result[n] for n in output_names]
            else:
                values = list(result)
            if len(values) != len(output_names) or not all(
                isinstance(v, torch.Tensor) for v in values
            ):
                raise InvalidParameter(
                    f"The module must return {len(output_names)} tensor(s), as the manifest lists."
                )
            return tuple(values)

    return Adapter().eval()


@dataclass(frozen=True)
class TorchSource:
    """A loaded torch model: the module (positional inputs, tuple of outputs) and its specs."""

    module: Any
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    task: str
    max_batch_size: int

    def generated(self, rows: int, dim: int = EVAL_DIM, seed: int = 0) -> dict[str, np.ndarray]:
        """Seeded inputs from the specs: ``rows`` in a variable first dimension, ``dim`` in
        other variable ones; N(0,1) floats, integers in [0, 4), random booleans."""
        return _generate(self.inputs, rows, dim, seed)

    def conform(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Given inputs cast to the declared dtypes, their shapes checked against the specs.

        Raises:
            InvalidParameter: a rank or fixed dimension that differs from the manifest.
        """
        out: dict[str, np.ndarray] = {}
        for spec in self.inputs:
            array = np.asarray(feeds[spec.name])
            fits = array.ndim == len(spec.shape) and all(
                d in (-1, n) for d, n in zip(spec.shape, array.shape, strict=True)
            )
            if not fits or array.shape[:1] == (0,):
                raise InvalidParameter(
                    f"Input {spec.name!r} has shape {list(array.shape)}; the manifest declares "
                    f"{list(spec.shape)}."
                )
            out[spec.name] = np.ascontiguousarray(array.astype(_NUMPY_OF_OIP[spec.datatype]))
        return out

    def reference(self, feeds: Mapping[str, np.ndarray]) -> Outputs:
        """The module's own outputs in PyTorch (the fidelity reference), 256 rows at a time.

        Raises:
            InvalidParameter: the module fails on these inputs (the detail is logged).
        """
        import torch

        rows = len(next(iter(feeds.values())))
        parts: list[list[np.ndarray]] = [[] for _ in self.outputs]
        try:
            with torch.inference_mode():
                for start in range(0, rows, 256):
                    args = [
                        torch.from_numpy(np.array(feeds[s.name][start : start + 256]))
                        for s in self.inputs
                    ]
                    for i, value in enumerate(self.module(*args)):
                        parts[i].append(value.detach().cpu().numpy())
        except InvalidParameter:
            raise
        except Exception as exc:  # user code: any error may come out
            logger.info("torch module failed on the held-out inputs: %r", exc)
            raise InvalidParameter(
                "The torch module failed on the held-out inputs; check the manifest's input "
                "specs, or give --eval DATA with inputs it accepts."
            ) from None
        return {s.name: np.concatenate(p) for s, p in zip(self.outputs, parts, strict=True)}


def _generate(
    specs: tuple[TensorSpec, ...], rows: int, dim: int, seed: int
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        shape = [(rows if i == 0 else dim) if d < 0 else d for i, d in enumerate(spec.shape)]
        dtype = np.dtype(_NUMPY_OF_OIP[spec.datatype])
        if dtype.kind == "f":
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[spec.name] = rng.random(shape) < 0.5
        else:
            feeds[spec.name] = rng.integers(0, _INT_HIGH, size=shape).astype(dtype)
    return feeds


def _build_module(factory: Callable[[], Any], weights: Path) -> Any:
    import torch
    from safetensors.torch import load_file

    try:
        model = factory()
    except Exception as exc:  # user code: any error may come out
        logger.info("torch factory failed: %r", exc)
        raise InvalidParameter("The torch factory raised an error building the module.") from None
    if not isinstance(model, torch.nn.Module):
        raise InvalidParameter(
            f"The torch factory must return a torch.nn.Module, not {type(model).__name__}."
        )
    try:
        state = load_file(str(weights), device="cpu")
        model.load_state_dict(state, strict=True)
    except Exception as exc:  # safetensors and torch raise their own types
        logger.info("torch weights did not load: %r", exc)
        raise InvalidParameter(
            f"The weights in {weights.name} do not fit the factory's module (names or shapes "
            "differ, or the file is not valid safetensors)."
        ) from None
    return model.eval()


def load_torch_model(folder: Path, factory: str) -> TorchSource:
    """Check a torch model folder and build its module with the operator's factory.

    Args:
        folder: the torch model folder.
        factory: ``module:function`` (importable here) returning the ``nn.Module``.

    Raises:
        InvalidParameter: a pickle anywhere in the folder, a bad manifest, a factory that does
            not import, is not callable or returns no ``nn.Module``, or weights that do not
            match the module's state dict.
    """
    folder = Path(folder).resolve()
    refuse_pickles(folder)
    manifest = read_torch_manifest(folder)
    model = _build_module(resolve_factory(factory), manifest.weights)
    return TorchSource(
        module=_adapter(model, manifest.inputs, manifest.outputs),
        inputs=manifest.inputs,
        outputs=manifest.outputs,
        task=manifest.task,
        max_batch_size=manifest.max_batch_size,
    )


def _dynamic_axes(source: TorchSource) -> dict[str, dict[int, str]]:
    axes: dict[str, dict[int, str]] = {}
    for spec in source.inputs + source.outputs:
        dynamic = {
            i: ("batch" if i == 0 else f"{spec.name}_dim{i}")
            for i, d in enumerate(spec.shape)
            if d < 0
        }
        if dynamic:
            axes[spec.name] = dynamic
    return axes


def _fix_outputs(graph: Any, source: TorchSource) -> None:
    """Check the exported graph against the manifest; pin the output dims it declares."""
    inputs, outputs = specs_of(graph)
    missing = [s.name for s in source.inputs if s.name not in {i.name for i in inputs}]
    if missing:
        raise InvalidParameter(
            f"The module does not use input {missing[0]!r}, so the exported graph lacks it."
        )
    if len(outputs) != len(source.outputs):
        raise InvalidParameter(
            f"The exported graph has {len(outputs)} outputs; the manifest lists "
            f"{len(source.outputs)}."
        )
    for declared, found, value in zip(source.outputs, outputs, graph.graph.output, strict=True):
        if declared.datatype != found.datatype or len(declared.shape) != len(found.shape):
            raise InvalidParameter(
                f"Output {declared.name!r} is declared {declared.datatype} "
                f"{list(declared.shape)}; the module returns {found.datatype} of rank "
                f"{len(found.shape)}."
            )
        dims = value.type.tensor_type.shape.dim
        for dim, size in zip(dims, declared.shape, strict=True):
            if size >= 0:
                dim.Clear()
                dim.dim_value = size


def export_torch(source: TorchSource) -> Any:
    """The ONNX graph (opset 17, a dynamic axis for every -1 dimension, the manifest's tensor
    names) of a loaded torch model.

    Raises:
        InvalidParameter: the module fails on the example inputs or cannot be exported, or the
            graph does not match the manifest (unused input, output dtype or rank).
    """
    import onnx
    import torch

    example = _generate(source.inputs, EXPORT_BATCH, EXPORT_DIM, seed=1)
    args = tuple(torch.from_numpy(example[s.name]) for s in source.inputs)
    with tempfile.TemporaryDirectory(prefix="shamal-export-") as tmp, warnings.catch_warnings():
        # The TorchScript exporter warns about tracing details of user code.
        warnings.simplefilter("ignore")
        path = Path(tmp) / "model.onnx"
        try:
            torch.onnx.export(
                source.module,
                args,
                str(path),
                input_names=[s.name for s in source.inputs],
                output_names=[s.name for s in source.outputs],
                dynamic_axes=_dynamic_axes(source),
                opset_version=OPSET,
                dynamo=False,
            )
        except InvalidParameter:
            raise
        except Exception as exc:  # user code and the exporter: any error may come out
            logger.info("torch export failed: %r", exc)
            raise InvalidParameter(
                "The torch module could not be exported to ONNX on inputs generated from the "
                "manifest's specs (see the log for the exporter's message)."
            ) from None
        graph = onnx.load_model(str(path))
    _fix_outputs(graph, source)
    return graph
