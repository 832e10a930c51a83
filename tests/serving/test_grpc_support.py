"""A small but real InferenceService for the gRPC front-end tests, and a server that runs it.

:class:`ArrayService` implements the :class:`~shamal.serving._types.InferenceService` contract
over numpy models held in memory: it looks models and versions up, validates input names,
datatypes and shapes, honours requested outputs and deadlines, bounds concurrent requests and
raises the ShamalError subclasses the contract names. It keeps every request it accepted in
``received`` so tests can check what the front end decoded, and every request a front end
refused before ``infer`` in ``refused`` (the optional ``count`` hook the real core also has).

:class:`BackgroundServer` runs ``start_grpc_server`` on an event loop in a background thread, so
the blocking stock ``tritonclient.grpc`` client can talk to it from the test thread.

This file holds no tests; pytest collects it only because of its name.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from shamal.errors import InvalidParameter, NotFound, ServiceUnavailable, TooManyRequests
from shamal.executors._procfs import free_port
from shamal.serving._datatypes import DATATYPES
from shamal.serving._grpc import start_grpc_server
from shamal.serving._types import (
    DeadlineExceeded,
    InferRequest,
    InferResponse,
    ModelMetadata,
    OutputTensor,
    ServerMetadata,
    TensorSpec,
)

Compute = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
VERSION = "1"
RETRY_AFTER_S = 2.5


@dataclass(frozen=True)
class ArrayModel:
    """A model: its tensors, what it computes, whether it is loaded, how many calls it takes."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    compute: Compute
    ready: bool = True
    max_in_flight: int = 64


class ArrayService:
    """InferenceService over in-memory numpy models, each served as version ``"1"``."""

    def __init__(self, models: list[ArrayModel]) -> None:
        self._models = {model.name: model for model in models}
        self._in_flight = dict.fromkeys(self._models, 0)
        self.received: list[InferRequest] = []
        self.refused: list[tuple[str, str, str, int]] = []

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return all(model.ready for model in self._models.values())

    def model_ready(self, model: str, version: str | None) -> bool:
        found = self._models.get(model)
        return found is not None and found.ready and version in (None, VERSION)

    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata(name="shamal-test", version="0.0.1", extensions=())

    def model_metadata(self, model: str, version: str | None) -> ModelMetadata:
        found = self._lookup(model, version)
        return ModelMetadata(
            name=found.name,
            versions=(VERSION,),
            platform="numpy_test",
            inputs=found.inputs,
            outputs=found.outputs,
        )

    async def infer(self, request: InferRequest) -> InferResponse:
        if request.deadline is not None and time.monotonic() > request.deadline:
            raise DeadlineExceeded("The request's deadline passed.")
        model = self._lookup(request.model, request.version)
        if not model.ready:
            raise ServiceUnavailable(f"Model '{model.name}' is still loading.")
        if self._in_flight[model.name] >= model.max_in_flight:
            error = TooManyRequests(f"Model '{model.name}' is busy; retry later.")
            error.retry_after_s = RETRY_AFTER_S  # type: ignore[attr-defined]
            raise error
        arrays = _validated_inputs(model, request)
        wanted = [output.name for output in request.outputs] or [s.name for s in model.outputs]
        specs = {spec.name: spec for spec in model.outputs}
        unknown = [name for name in wanted if name not in specs]
        if unknown:
            raise InvalidParameter(f"Model '{model.name}' has no output {unknown[0]!r}.")
        self.received.append(request)
        self._in_flight[model.name] += 1
        try:
            results = model.compute(arrays)
        finally:
            self._in_flight[model.name] -= 1
        outputs = [
            OutputTensor(
                name=name,
                datatype=specs[name].datatype,
                shape=tuple(results[name].shape),
                data=results[name],
            )
            for name in wanted
        ]
        return InferResponse(
            model_name=model.name, model_version=VERSION, id=request.id, outputs=outputs
        )

    def count(self, model: str, version: str, protocol: str, status: int, elapsed: float) -> None:
        """A request a front end refused before ``infer`` (the optional RefusalCounter hook)."""
        self.refused.append((model, version, protocol, status))

    def _lookup(self, model: str, version: str | None) -> ArrayModel:
        found = self._models.get(model)
        if found is None or version not in (None, VERSION):
            raise NotFound(f"Model '{model}' version {version or 'latest'} is not served here.")
        return found


def _validated_inputs(model: ArrayModel, request: InferRequest) -> dict[str, np.ndarray]:
    """The request's arrays by name, after checking them against the model's input specs."""
    given = {tensor.name: tensor for tensor in request.inputs}
    if len(given) != len(request.inputs):
        raise InvalidParameter("Input names must be unique.")
    expected = {spec.name for spec in model.inputs}
    if set(given) != expected:
        raise InvalidParameter(
            f"Model '{model.name}' takes inputs {sorted(expected)}, got {sorted(given)}."
        )
    for spec in model.inputs:
        tensor = given[spec.name]
        if tensor.datatype != spec.datatype:
            raise InvalidParameter(
                f"Input {spec.name!r} must be {spec.datatype}, got {tensor.datatype}."
            )
        fits = len(tensor.shape) == len(spec.shape) and all(
            want in (-1, got) for want, got in zip(spec.shape, tensor.shape, strict=True)
        )
        if not fits or tensor.data.shape != tensor.shape:
            raise InvalidParameter(
                f"Input {spec.name!r} has shape {list(tensor.shape)}; the model takes "
                f"{list(spec.shape)}."
            )
    return {name: tensor.data for name, tensor in given.items()}


def _identity(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"OUTPUT0": arrays["INPUT0"].copy()}


def _add_sub(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {
        "OUTPUT0": arrays["INPUT0"] + arrays["INPUT1"],
        "OUTPUT1": arrays["INPUT0"] - arrays["INPUT1"],
    }


def _repeat4(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"OUTPUT0": np.tile(arrays["INPUT0"], 4)}


def _faulty(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    raise RuntimeError("backend exploded reading /srv/secret/weights.bin")


def _model(name: str, datatype: str, shape: tuple[int, ...], compute: Compute) -> ArrayModel:
    return ArrayModel(
        name=name,
        inputs=(TensorSpec("INPUT0", datatype, shape),),
        outputs=(TensorSpec("OUTPUT0", datatype, shape),),
        compute=compute,
    )


def identity_model_name(datatype: str) -> str:
    return f"identity_{datatype.lower()}"


def standard_models() -> list[ArrayModel]:
    """Identity models for every datatype, add_sub, repeat4, and models that fail on purpose."""
    models = [
        _model(identity_model_name(datatype), datatype, (-1, -1), _identity)
        for datatype in DATATYPES
    ]
    pair = (TensorSpec("INPUT0", "FP32", (-1, 4)), TensorSpec("INPUT1", "FP32", (-1, 4)))
    models.append(
        ArrayModel(
            name="add_sub",
            inputs=pair,
            outputs=(
                TensorSpec("OUTPUT0", "FP32", (-1, 4)),
                TensorSpec("OUTPUT1", "FP32", (-1, 4)),
            ),
            compute=_add_sub,
        )
    )
    models.append(_model("repeat4", "FP32", (-1,), _repeat4))
    models.append(_model("faulty", "FP32", (-1,), _faulty))
    loading = _model("loading", "FP32", (-1,), _identity)
    models.append(ArrayModel(loading.name, loading.inputs, loading.outputs, _identity, ready=False))
    busy = _model("busy", "FP32", (-1,), _identity)
    models.append(ArrayModel(busy.name, busy.inputs, busy.outputs, _identity, max_in_flight=0))
    return models


class BackgroundServer:
    """``start_grpc_server`` on its own event loop in a daemon thread; use as a context manager."""

    def __init__(self, service: Any, *, max_message_bytes: int) -> None:
        self.service = service
        self._max_message_bytes = max_message_bytes
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: Any = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> BackgroundServer:
        self._thread.start()
        for _attempt in range(5):
            self.port = free_port()
            start = start_grpc_server(
                self.service,
                host="127.0.0.1",
                port=self.port,
                max_message_bytes=self._max_message_bytes,
            )
            try:
                self._server = self.run(start)
                return self
            except ServiceUnavailable:  # the port was taken between probe and bind
                continue
        raise RuntimeError("no free port for the gRPC test server")

    def __exit__(self, *exc_info: object) -> None:
        if self._server is not None:
            self.run(self._server.stop(None))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def run(self, coroutine: Any, timeout: float = 30) -> Any:
        """Run a coroutine on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)


def sample_array(datatype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Random test data of an OIP datatype, covering each type's edges (extremes, empty bytes)."""
    rng = np.random.default_rng(seed)
    count = int(np.prod(shape))
    if datatype == "BYTES":
        pool = [b"", b"a", "caf\u00e9".encode(), b"\x00\xff\xfe", b"x" * 300]
        items = np.empty(count, dtype=object)
        for index in range(count):
            items[index] = pool[index % len(pool)] + str(rng.integers(1000)).encode()
        items[0] = b""
        return items.reshape(shape)
    dtype = DATATYPES[datatype]
    if datatype == "BOOL":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        values = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
        values.flat[0], values.flat[-1] = info.min, info.max
        return values
    values = rng.standard_normal(size=shape).astype(dtype)
    values.flat[0] = np.finfo(dtype).max
    return values
