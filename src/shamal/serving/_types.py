"""What the protocol front ends (REST, gRPC) and the inference core say to each other.

The front ends decode a wire request into an :class:`InferRequest`, call an
:class:`InferenceService`, and encode its :class:`InferResponse`; they hold no model logic. The
service raises :class:`shamal.errors.ShamalError` subclasses, which each front end maps to its
own status codes (HTTP status, gRPC status code).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from shamal.errors import ShamalError
from shamal.modelformat import TensorSpec as TensorSpec  # one description, shared with manifests


class DeadlineExceeded(ShamalError):
    """The request's deadline passed before it was answered (it was dropped, not run)."""

    status = 504
    code = "DEADLINE_EXCEEDED"


@dataclass(frozen=True)
class ServerMetadata:
    name: str
    version: str
    extensions: tuple[str, ...]


@dataclass(frozen=True)
class ModelMetadata:
    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


@dataclass
class InferInput:
    """One decoded input tensor; ``data`` already has ``shape`` and the datatype's dtype."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class RequestedOutput:
    """An output the caller asked for; ``binary`` asks for raw bytes (REST binary extension)."""

    name: str
    binary: bool = False
    parameters: dict[str, Any] = field(default_factory=dict)
    #: The classification extension: return the top ``class_count`` classes, not the values.
    class_count: int = 0


@dataclass
class InferRequest:
    """One inference request, protocol-independent.

    Attributes:
        model: model name from the path.
        version: version from the path, or None to let the router choose.
        id: the caller's request id, echoed back.
        inputs: decoded input tensors.
        outputs: requested outputs; empty means every output.
        parameters: request-level parameters (unknown ones are ignored).
        headers: HTTP headers or gRPC metadata, names lower-cased.
        deadline: ``time.monotonic()`` value after which the request is dropped, or None.
    """

    model: str
    version: str | None
    id: str | None
    inputs: list[InferInput]
    outputs: list[RequestedOutput] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    deadline: float | None = None


@dataclass
class OutputTensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray


@dataclass
class InferResponse:
    model_name: str
    model_version: str
    id: str | None
    outputs: list[OutputTensor]
    parameters: dict[str, Any] = field(default_factory=dict)


class InferenceService(Protocol):
    """The inference core behind every protocol front end.

    ``infer`` is a coroutine run on the server's event loop; the model call itself happens off
    the loop (a batcher hands batches to worker threads). Everything else answers from memory.

    ``infer`` raises: NotFound (no such model or version), InvalidParameter (inputs that do not
    match the model: names, datatypes, shapes, values), TooManyRequests (the model's queue is
    full; ``retry_after_s`` on the error says when to retry), ServiceUnavailable (draining or
    not ready), DeadlineExceeded.
    """

    def live(self) -> bool: ...

    def ready(self) -> bool: ...

    def model_ready(self, model: str, version: str | None) -> bool: ...

    def server_metadata(self) -> ServerMetadata: ...

    def model_metadata(self, model: str, version: str | None) -> ModelMetadata: ...

    async def infer(self, request: InferRequest) -> InferResponse: ...
