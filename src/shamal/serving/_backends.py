"""Model runtimes behind one small interface.

A :class:`Backend` runs a whole batch of inputs and returns every output. The inference core
validates inputs against :attr:`Backend.inputs` before calling it, so a backend sees only tensors
with the declared names, datatypes and ranks. Backends are built once at start-up and then called
from worker threads, one batch at a time per backend instance.

* ``onnx``: ONNX Runtime, CPU by default, CUDA first when the runtime offers it.
* ``openvino``: OpenVINO on the CPU, at the precision the model folder asks for (bf16 runs on
  AVX-512 BF16 and AMX units; elsewhere OpenVINO keeps f32).
* ``torch``: safetensors weights loaded into a module built by a factory the *operator* names on
  the command line (``--torch-factory NAME=module:function``); a model file never names code.
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from shamal.errors import InvalidParameter
from shamal.serving._datatypes import numpy_dtype
from shamal.serving._modelfiles import ModelFiles
from shamal.serving._types import TensorSpec

__all__ = [
    "Backend",
    "BackendOptions",
    "OnnxBackend",
    "OpenVinoBackend",
    "TorchBackend",
    "load_backend",
    "resolve_factory",
]

logger = logging.getLogger(__name__)

_ORT_TYPES = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}
_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class Backend(Protocol):
    """One loaded model version.

    Contract:
        * ``inputs``/``outputs`` describe the tensors (OIP datatypes, -1 = variable dim); they
          never change after construction.
        * ``max_batch_size`` > 0 means the first dim of every input and output is the batch dim
          and requests may be concatenated along it up to that many rows; 0 means no batching.
        * ``run`` takes arrays with exactly the declared input names, numpy dtypes of the declared
          datatypes (BYTES: object arrays of ``bytes``), and returns every declared output.
          It is called from one worker thread at a time and may block.
        * Failures inside the runtime raise any exception; the caller logs it and answers a
          generic 500 (runtime messages never reach a client).
    """

    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class BackendOptions:
    """How to build backends.

    Attributes:
        threads: intra-op threads per model (0 = the runtime's default).
        device: ``auto`` (CUDA when present), ``cpu`` or ``cuda``.
        default_max_batch_size: batch limit for models whose first dim is variable and whose
            files do not say (0 turns batching off).
        torch_factories: served name -> ``module:function`` building the torch module.
        max_batch_sizes: served name -> its own batch limit, in place of the default.
    """

    threads: int = 0
    device: str = "auto"
    default_max_batch_size: int = 32
    torch_factories: Mapping[str, str] | None = None
    max_batch_sizes: Mapping[str, int] | None = None

    def for_model(self, name: str) -> BackendOptions:
        """These options with ``name``'s own batch limit, when it has one."""
        limit = (self.max_batch_sizes or {}).get(name)
        return self if limit is None else replace(self, default_max_batch_size=limit)


def load_backend(name: str, files: ModelFiles, options: BackendOptions) -> Backend:
    """Build the backend for checked model files.

    Raises:
        InvalidParameter: the runtime refuses the model, or a torch model has no factory.
    """
    options = options.for_model(name)
    if files.format == "torch":
        factory = (options.torch_factories or {}).get(name)
        if factory is None:
            raise InvalidParameter(
                f"Model '{name}' is a torch model; name the code that builds it with "
                f"--torch-factory {name}=module:function."
            )
        return TorchBackend(files, resolve_factory(factory), options)
    if files.format == "openvino":
        return OpenVinoBackend(files, options)
    return OnnxBackend(files, options)


def resolve_factory(spec: str) -> Callable[[], Any]:
    """Import ``module:function`` from the server's environment.

    Raises:
        InvalidParameter: malformed, not importable, or not callable.
    """
    if not _FACTORY.match(spec):
        raise InvalidParameter(f"A torch factory is written module:function, not {spec!r}.")
    module_name, function = spec.split(":")
    try:
        target = getattr(importlib.import_module(module_name), function)
    except (ImportError, AttributeError):
        raise InvalidParameter(f"Cannot import the torch factory {spec!r}.") from None
    if not callable(target):
        raise InvalidParameter(f"The torch factory {spec!r} is not callable.")
    return target  # type: ignore[no-any-return]


def _batch_size(specs: Sequence[TensorSpec], declared: int | None, limit: int) -> int:
    """Rows per batch: ``limit`` when every tensor's first dim is variable, capped by what the
    model's files declare (0 or None = not declared); 0 (no batching) otherwise."""
    batchable = all(spec.shape and spec.shape[0] == -1 for spec in specs)
    if not batchable or limit <= 0:
        return 0
    return min(limit, declared) if declared else limit


class OnnxBackend:
    """ONNX Runtime ``InferenceSession`` over a checked ``.onnx`` file."""

    def __init__(self, files: ModelFiles, options: BackendOptions) -> None:
        import onnxruntime as ort  # type: ignore[import-untyped,unused-ignore]

        session_options = ort.SessionOptions()
        if options.threads > 0:
            session_options.intra_op_num_threads = options.threads
            session_options.inter_op_num_threads = 1
        session_options.log_severity_level = 3
        # Spinning intra-op threads would take CPU from the event loop that feeds them.
        session_options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers = ["CPUExecutionProvider"]
        available = ort.get_available_providers()
        if options.device in ("auto", "cuda") and "CUDAExecutionProvider" in available:
            providers.insert(0, "CUDAExecutionProvider")
        elif options.device == "cuda":
            raise InvalidParameter("--device cuda: this ONNX Runtime has no CUDA provider.")
        try:
            self._session = ort.InferenceSession(
                str(files.path), sess_options=session_options, providers=providers
            )
        except Exception:
            logger.exception("ONNX Runtime refused %s", files.path)
            raise InvalidParameter(
                f"ONNX Runtime cannot load {files.path.name}; check that it is a valid graph "
                "with supported operators."
            ) from None
        graph_inputs = tuple(_ort_spec(arg) for arg in self._session.get_inputs())
        graph_outputs = tuple(_ort_spec(arg) for arg in self._session.get_outputs())
        self.inputs = _merge_specs(graph_inputs, files.inputs)
        self.outputs = _merge_specs(graph_outputs, files.outputs)
        self.max_batch_size = _batch_size(
            self.inputs + self.outputs, files.max_batch_size, options.default_max_batch_size
        )
        self.platform = "onnxruntime_onnx"
        self.providers = tuple(self._session.get_providers())
        self._output_names = [spec.name for spec in self.outputs]
        self._strings = {spec.name for spec in self.inputs if spec.datatype == "BYTES"}

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        feed = {
            name: (_as_str(array) if name in self._strings else array)
            for name, array in inputs.items()
        }
        results = self._session.run(self._output_names, feed)
        out: dict[str, np.ndarray] = {}
        for spec, value in zip(self.outputs, results, strict=True):
            array = np.asarray(value)
            if spec.datatype == "BYTES" and array.dtype.kind in "OU":
                array = _as_bytes(array)
            out[spec.name] = array
        return out

    def close(self) -> None:
        del self._session


def _ort_spec(arg: Any) -> TensorSpec:
    datatype = _ORT_TYPES.get(arg.type)
    if datatype is None:
        raise InvalidParameter(f"Tensor {arg.name!r} has type {arg.type}, which OIP cannot carry.")
    shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or ()))
    return TensorSpec(arg.name, datatype, shape)


def _merge_specs(
    graph: tuple[TensorSpec, ...], declared: tuple[TensorSpec, ...] | None
) -> tuple[TensorSpec, ...]:
    """The graph is the truth for names and datatypes; a manifest may only narrow shapes."""
    if declared is None:
        return graph
    by_name = {spec.name: spec for spec in declared}
    merged = []
    for spec in graph:
        mine = by_name.get(spec.name)
        if mine is None or mine.datatype != spec.datatype or len(mine.shape) != len(spec.shape):
            raise InvalidParameter(
                f"The manifest's tensor {spec.name!r} does not match the graph "
                f"({spec.datatype} {list(spec.shape)})."
            )
        merged.append(mine)
    return tuple(merged)


def _as_str(array: np.ndarray) -> np.ndarray:
    """ORT string tensors take ``str`` objects; OIP BYTES arrive as ``bytes``. ORT strings are
    UTF-8, so bytes that are not UTF-8 reach the model with U+FFFD replacements."""
    flat = [b.decode("utf-8", "replace") if isinstance(b, bytes) else str(b) for b in array.flat]
    return np.array(flat, dtype=object).reshape(array.shape)


def _as_bytes(array: np.ndarray) -> np.ndarray:
    flat = [s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in array.flat]
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(array.shape)


_OV_TYPES = {
    "boolean": "BOOL",
    "u8": "UINT8",
    "u16": "UINT16",
    "u32": "UINT32",
    "u64": "UINT64",
    "i8": "INT8",
    "i16": "INT16",
    "i32": "INT32",
    "i64": "INT64",
    "f16": "FP16",
    "f32": "FP32",
    "f64": "FP64",
}
_OV_PRECISION = {"f32": "f32", "bf16": "bf16", "f16": "f16"}


def _ov_spec(port: Any) -> TensorSpec:
    name = port.get_any_name()
    datatype = _OV_TYPES.get(port.get_element_type().get_type_name())
    if datatype is None:
        raise InvalidParameter(
            f"Tensor {name!r} has type {port.get_element_type()}, which this server cannot carry "
            "through OpenVINO."
        )
    shape = tuple(
        -1 if dim.is_dynamic else int(dim.get_length()) for dim in port.get_partial_shape()
    )
    return TensorSpec(name, datatype, shape)


class OpenVinoBackend:
    """An OpenVINO IR compiled for this CPU, one inference request reused batch after batch.

    The folder's ``precision`` becomes OpenVINO's inference precision hint: ``bf16`` uses the
    CPU's bf16 units where it has them (OpenVINO keeps f32 where it has none); int8 models carry
    their quantization in the graph and run at ``f32`` elsewhere.
    """

    def __init__(self, files: ModelFiles, options: BackendOptions) -> None:
        import openvino as ov  # type: ignore[import-untyped,unused-ignore]

        if options.device == "cuda":
            raise InvalidParameter("--device cuda: OpenVINO models run on the CPU here.")
        config: dict[str, Any] = {
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_PRECISION_HINT": _OV_PRECISION.get(files.precision or "f32", "f32"),
        }
        if options.threads > 0:
            config["INFERENCE_NUM_THREADS"] = options.threads
        try:
            core = ov.Core()
            model = core.read_model(str(files.path), str(files.path.with_suffix(".bin")))
            self._compiled = core.compile_model(model, "CPU", config)
        except Exception:
            logger.exception("OpenVINO refused %s", files.path)
            raise InvalidParameter(
                f"OpenVINO cannot load {files.path.name}; check that it is a valid IR with "
                "supported operations."
            ) from None
        self._request = self._compiled.create_infer_request()
        self.inputs = _merge_specs(tuple(_ov_spec(p) for p in self._compiled.inputs), files.inputs)
        self.outputs = _merge_specs(
            tuple(_ov_spec(p) for p in self._compiled.outputs), files.outputs
        )
        self.max_batch_size = _batch_size(
            self.inputs + self.outputs, files.max_batch_size, options.default_max_batch_size
        )
        self.platform = "openvino"
        self.precision = files.precision or "f32"
        self._ports = [self._compiled.output(spec.name) for spec in self.outputs]

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        # Decoded request buffers may be read-only; OpenVINO copies inputs it does not share.
        self._request.infer(dict(inputs), share_inputs=False)
        return {
            spec.name: np.array(self._request.get_tensor(port).data, copy=True)
            for spec, port in zip(self.outputs, self._ports, strict=True)
        }

    def close(self) -> None:
        del self._request
        del self._compiled


class TorchBackend:
    """A ``torch.nn.Module`` from an operator-named factory with safetensors weights.

    The module is called with the inputs as keyword tensors in manifest order and must return a
    tensor (one output), a tuple/list (outputs in order) or a mapping by output name.
    """

    def __init__(self, files: ModelFiles, factory: Callable[[], Any], options: BackendOptions):
        import torch
        from safetensors.torch import load_file

        assert files.inputs is not None  # checked by the reader
        assert files.outputs is not None
        self.inputs = files.inputs
        self.outputs = files.outputs
        for spec in self.inputs + self.outputs:
            if spec.datatype == "BYTES":
                raise InvalidParameter("Torch models cannot take or return BYTES tensors.")
        want_cuda = options.device in ("auto", "cuda") and torch.cuda.is_available()
        if options.device == "cuda" and not want_cuda:
            raise InvalidParameter("--device cuda: torch sees no CUDA device.")
        self._device = torch.device("cuda" if want_cuda else "cpu")
        module = factory()
        if not isinstance(module, torch.nn.Module):
            raise InvalidParameter("The torch factory must return a torch.nn.Module.")
        try:
            state = load_file(str(files.path), device="cpu")
            module.load_state_dict(state, strict=True)
        except Exception:
            logger.exception("torch could not load %s", files.path)
            raise InvalidParameter(
                f"The weights in {files.path.name} do not fit the factory's module "
                "(names or shapes differ, or the file is not valid safetensors)."
            ) from None
        self._module = module.to(self._device).eval()
        self.max_batch_size = _batch_size(
            self.inputs + self.outputs, files.max_batch_size, options.default_max_batch_size
        )
        self.platform = "pytorch_safetensors"
        if options.threads > 0:
            torch.set_num_threads(options.threads)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        with torch.inference_mode():
            feed = {
                # Decoded request buffers are read-only; torch wants memory it may write.
                spec.name: torch.from_numpy(
                    np.require(inputs[spec.name], requirements=("C", "W"))
                ).to(self._device)
                for spec in self.inputs
            }
            result = self._module(**feed)
        if isinstance(result, torch.Tensor):
            result = (result,)
        if isinstance(result, Mapping):
            values = [result[spec.name] for spec in self.outputs]
        else:
            values = list(result)
        out: dict[str, np.ndarray] = {}
        for spec, value in zip(self.outputs, values, strict=True):
            array = value.detach().to("cpu").numpy()
            out[spec.name] = array.astype(numpy_dtype(spec.datatype), copy=False)
        return out

    def close(self) -> None:
        del self._module
