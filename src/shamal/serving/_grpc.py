"""The gRPC front end of the Open Inference Protocol server (``inference.GRPCInferenceService``).

It decodes ``ModelInferRequest`` messages into :class:`~shamal.serving._types.InferRequest`,
awaits the :class:`~shamal.serving._types.InferenceService` on the server's own event loop and
encodes the answer as a ``ModelInferResponse``. It holds no model logic.

Wire rules (see the OIP reference):

- Inputs arrive either all in ``raw_input_contents`` (one blob per input, in order; what
  ``tritonclient.grpc`` sends) or each in its typed ``contents`` field (what KServe and MLServer
  clients may send); a request that mixes the two is refused. FP16 has no typed field and only
  travels raw. Every shape is checked against the supplied bytes or values before anything is
  allocated.
- Outputs always go out in ``raw_output_contents``, one blob per output in ``outputs`` order: the
  only form ``tritonclient``'s ``InferResult.as_numpy`` decodes for every datatype.
- The client's gRPC deadline becomes ``InferRequest.deadline`` (``time.monotonic()`` based); the
  call metadata becomes ``InferRequest.headers`` (names lower-cased, ``-bin`` entries dropped).
- Messages larger than ``max_message_bytes`` are refused both ways with RESOURCE_EXHAUSTED.
- Errors: :class:`shamal.errors.ShamalError` subclasses map to gRPC status codes with their
  caller-safe message; anything else is logged here and answered INTERNAL with a generic message.
  RPCs that are not implemented (Triton's ModelConfig, statistics, repository, shared memory, ...)
  are answered UNIMPLEMENTED by grpcio itself.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any, NoReturn, Protocol, runtime_checkable

import grpc  # type: ignore[import-untyped]
import numpy as np

from shamal.errors import (
    AlreadyExists,
    InternalError,
    InvalidParameter,
    NotImplementedFeature,
    PayloadTooLarge,
    ServiceUnavailable,
    ShamalError,
)
from shamal.serving._access import Access, OpenAccess, bearer_token
from shamal.serving._classification import class_count
from shamal.serving._datatypes import MAX_RANK, element_count, from_raw, numpy_dtype, to_raw
from shamal.serving._proto import grpc_predict_v2_pb2 as pb
from shamal.serving._proto import grpc_predict_v2_pb2_grpc as pb_grpc
from shamal.serving._types import (
    DeadlineExceeded,
    InferenceService,
    InferInput,
    InferRequest,
    InferResponse,
    RequestedOutput,
    TensorSpec,
)

__all__ = [
    "RefusalCounter",
    "decode_infer_request",
    "encode_infer_response",
    "start_grpc_server",
    "status_for",
]

logger = logging.getLogger(__name__)

#: HTTP status of a ShamalError -> the gRPC status code it is answered with.
_CODE_BY_HTTP_STATUS: dict[int, Any] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    # A full queue is transient overload: UNAVAILABLE is what gRPC retry policies retry.
    429: grpc.StatusCode.UNAVAILABLE,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
_GENERIC_INTERNAL = "Internal server error; the server log has the details."

#: Datatype -> the typed ``InferTensorContents`` field that carries it, and that field's dtype.
_TYPED_FIELD: dict[str, tuple[str, str]] = {
    "BOOL": ("bool_contents", "?"),
    "UINT8": ("uint_contents", "<u4"),
    "UINT16": ("uint_contents", "<u4"),
    "UINT32": ("uint_contents", "<u4"),
    "UINT64": ("uint64_contents", "<u8"),
    "INT8": ("int_contents", "<i4"),
    "INT16": ("int_contents", "<i4"),
    "INT32": ("int_contents", "<i4"),
    "INT64": ("int64_contents", "<i8"),
    "FP32": ("fp32_contents", "<f4"),
    "FP64": ("fp64_contents", "<f8"),
    "BYTES": ("bytes_contents", "O"),
}
_CONTENT_FIELDS = tuple(field.name for field in pb.InferTensorContents.DESCRIPTOR.fields)
#: Triton's shared-memory extension: tensors that name a region instead of carrying data.
_SHARED_MEMORY_PARAMETER = "shared_memory_region"
_INT64_MAX = (1 << 63) - 1


async def start_grpc_server(
    service: InferenceService,
    *,
    host: str,
    port: int,
    max_message_bytes: int,
    access: Access | None = None,
) -> grpc.aio.Server:
    """Start a ``grpc.aio`` server for ``service`` on ``host:port`` and return it, started.

    The server runs on the calling event loop; stop it with ``await server.stop(grace)``.
    ``port`` must be free: the listener is bound without ``SO_REUSEPORT``, so a second server on
    a taken port fails here instead of silently sharing it.

    Args:
        service: the inference core that answers every RPC.
        host: interface to listen on (an IPv6 literal may be given with or without brackets).
        port: TCP port; 0 asks the OS for a free one (the caller then cannot learn it, so the
            CLI always passes an explicit port).
        max_message_bytes: the largest request and response message, in bytes.
        access: who may call the RPCs other than ServerLive and ServerReady (the metadata
            ``authorization: Bearer <token>``); None: anyone.

    Returns:
        The started ``grpc.aio.Server``.

    Raises:
        ServiceUnavailable: the address cannot be bound.
    """
    options = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),
    ]
    server = grpc.aio.server(options=options)
    servicer = _InferenceServicer(service, max_message_bytes, access or OpenAccess())
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    address = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError:
        bound = 0
    if not bound:
        raise ServiceUnavailable(f"The gRPC server cannot listen on {address}; is it in use?")
    await server.start()
    logger.info("OIP gRPC server listening on %s", address.rsplit(":", 1)[0] + f":{bound}")
    return server


class _InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """The RPC handlers: each decodes, asks the service, encodes, and maps errors."""

    def __init__(self, service: InferenceService, max_message_bytes: int, access: Access) -> None:
        self._service = service
        self._max_message_bytes = max_message_bytes
        self._access = access

    async def _check(self, context: Any, model: str | None) -> None:
        token = None
        for key, value in context.invocation_metadata() or ():
            if key == "authorization" and isinstance(value, str):
                token = bearer_token(value)
        await self._access.check(token, model)

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> Any:
        try:
            return pb.ServerLiveResponse(live=self._service.live())
        except Exception as exc:
            await _abort(context, exc)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> Any:
        try:
            return pb.ServerReadyResponse(ready=self._service.ready())
        except Exception as exc:
            await _abort(context, exc)

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> Any:
        try:
            await self._check(context, request.name)
            ready = self._service.model_ready(_model_name(request.name), request.version or None)
            return pb.ModelReadyResponse(ready=ready)
        except Exception as exc:
            await _abort(context, exc)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> Any:
        try:
            await self._check(context, None)
            meta = self._service.server_metadata()
            return pb.ServerMetadataResponse(
                name=meta.name, version=meta.version, extensions=list(meta.extensions)
            )
        except Exception as exc:
            await _abort(context, exc)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> Any:
        try:
            await self._check(context, request.name)
            meta = self._service.model_metadata(_model_name(request.name), request.version or None)
            return pb.ModelMetadataResponse(
                name=meta.name,
                versions=list(meta.versions),
                platform=meta.platform,
                inputs=_tensor_metadata(meta.inputs),
                outputs=_tensor_metadata(meta.outputs),
            )
        except Exception as exc:
            await _abort(context, exc)

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> Any:
        try:
            await self._check(context, request.model_name)
            remaining = context.time_remaining()
            deadline = None if remaining is None else time.monotonic() + remaining
            decoded = self._decode(request, context, deadline)
            response = await self._service.infer(decoded)
            return encode_infer_response(
                response, max_message_bytes=self._max_message_bytes, request_id=decoded.id
            )
        except Exception as exc:
            await _abort(context, exc)

    def _decode(self, request: Any, context: Any, deadline: float | None) -> InferRequest:
        """Decode a ModelInferRequest; a refusal is counted in the service's metrics if it
        keeps them (the service counts every request that reaches ``infer`` itself)."""
        try:
            if deadline is not None and deadline <= time.monotonic():
                raise DeadlineExceeded("The request's deadline passed before it was read.")
            return decode_infer_request(
                request, headers=_headers(context.invocation_metadata()), deadline=deadline
            )
        except ShamalError as exc:
            if isinstance(self._service, RefusalCounter):
                self._service.count(
                    request.model_name, request.model_version, "grpc", exc.status, 0.0
                )
            raise


@runtime_checkable
class RefusalCounter(Protocol):
    """Optional on an InferenceService: record a request a front end refused before ``infer``."""

    def count(self, model: str, version: str, protocol: str, status: int, elapsed: float) -> None:
        """One finished call: model and version as requested, protocol, HTTP status, seconds."""


def decode_infer_request(
    message: pb.ModelInferRequest,
    *,
    headers: Mapping[str, str] | None = None,
    deadline: float | None = None,
) -> InferRequest:
    """Turn a ``ModelInferRequest`` into an :class:`InferRequest`, checking every size first.

    Raises:
        InvalidParameter: a malformed request: no model name, duplicate or unnamed inputs, an
            unknown datatype, a bad shape, raw and typed contents mixed, a raw blob count that
            differs from the input count, or data that does not fill the declared shape exactly.
        NotImplementedFeature: a tensor that refers to Triton shared memory.
    """
    raw = message.raw_input_contents
    if raw and len(raw) != len(message.inputs):
        raise InvalidParameter(
            f"raw_input_contents holds {len(raw)} blobs for {len(message.inputs)} inputs; "
            "send exactly one blob per input, in input order."
        )
    inputs: list[InferInput] = []
    seen: set[str] = set()
    for index, tensor in enumerate(message.inputs):
        if not tensor.name or tensor.name in seen:
            raise InvalidParameter(
                f"Input {index} has an empty or duplicate name {tensor.name[:64]!r}."
            )
        seen.add(tensor.name)
        inputs.append(_decode_input(tensor, raw[index] if raw else None))
    return InferRequest(
        model=_model_name(message.model_name),
        version=message.model_version or None,
        id=message.id or None,
        inputs=inputs,
        outputs=_decode_outputs(message.outputs),
        parameters=_parameters(message.parameters),
        headers=dict(headers or {}),
        deadline=deadline,
    )


def encode_infer_response(
    response: InferResponse, *, max_message_bytes: int, request_id: str | None = None
) -> Any:
    """Turn an :class:`InferResponse` into a ``ModelInferResponse`` with raw output contents.

    The response's ``id`` is echoed; when the service left it unset, ``request_id`` (the id the
    caller sent) is, as the protocol requires.

    Raises:
        PayloadTooLarge: the response would exceed ``max_message_bytes``.
        InternalError: an output's data does not hold the number of elements its shape says
            (a bug behind the front end; the details go to the log).
    """
    tensors = []
    blobs: list[bytes] = []
    total = 0
    for output in response.outputs:
        if math.prod(output.shape) != output.data.size:
            logger.error(
                "Output %r of model %r has shape %s but %d elements",
                output.name,
                response.model_name,
                output.shape,
                output.data.size,
            )
            raise InternalError(_GENERIC_INTERNAL)
        blob = to_raw(output.data, output.datatype)
        total += len(blob)
        _check_response_size(total, max_message_bytes)
        blobs.append(blob)
        tensors.append(
            pb.ModelInferResponse.InferOutputTensor(
                name=output.name, datatype=output.datatype, shape=output.shape
            )
        )
    message = pb.ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version,
        id=response.id or request_id or "",
        outputs=tensors,
        raw_output_contents=blobs,
    )
    _set_parameters(message.parameters, response.parameters)
    _check_response_size(message.ByteSize(), max_message_bytes)
    return message


def status_for(exc: BaseException) -> tuple[Any, str, tuple[tuple[str, str], ...]]:
    """The gRPC status code, caller-safe message and trailing metadata for an exception.

    ShamalError subclasses keep their message (written for callers); any other exception is
    answered INTERNAL with a generic message. A ``retry_after_s`` attribute (set by the core on
    TooManyRequests / ServiceUnavailable) becomes the ``retry-after`` trailer, whole seconds.
    """
    if not isinstance(exc, ShamalError):
        return grpc.StatusCode.INTERNAL, _GENERIC_INTERNAL, ()
    code = _CODE_BY_HTTP_STATUS.get(exc.status, grpc.StatusCode.INTERNAL)
    if isinstance(exc, AlreadyExists):
        code = grpc.StatusCode.ALREADY_EXISTS
    trailers: tuple[tuple[str, str], ...] = ()
    retry_after = getattr(exc, "retry_after_s", None)
    if isinstance(retry_after, int | float) and math.isfinite(retry_after) and retry_after >= 0:
        trailers = (("retry-after", str(max(1, math.ceil(retry_after)))),)
    return code, exc.message, trailers


async def _abort(context: Any, exc: Exception) -> NoReturn:
    """End the RPC with the status that ``exc`` maps to (``context.abort`` always raises)."""
    code, message, trailers = status_for(exc)
    if code == grpc.StatusCode.INTERNAL:
        logger.error("gRPC request failed", exc_info=exc)
    else:
        logger.debug("gRPC request refused with %s: %s", code, message)
    await context.abort(code, message, trailing_metadata=trailers)
    raise AssertionError("grpc.aio context.abort() returned")  # pragma: no cover


def _decode_input(tensor: Any, blob: bytes | None) -> InferInput:
    """One input tensor, from its raw blob (when the request is raw) or its typed contents."""
    name = tensor.name
    parameters = _parameters(tensor.parameters)
    if _SHARED_MEMORY_PARAMETER in parameters:
        raise NotImplementedFeature(
            "Shared-memory tensors are not supported; send the data in the request."
        )
    datatype = tensor.datatype
    numpy_dtype(datatype)
    if len(tensor.shape) > MAX_RANK:
        raise InvalidParameter(f"Input {name!r} has more than {MAX_RANK} dimensions.")
    shape = tuple(int(dim) for dim in tensor.shape)
    try:
        count = element_count(shape)
    except InvalidParameter as exc:
        raise InvalidParameter(f"Input {name!r}: {exc.message}") from None
    if blob is None:
        data = _typed_contents(tensor, count).reshape(shape)
    else:
        if _holds_values(tensor):
            raise InvalidParameter(
                f"Input {name!r} has typed contents in a request that uses raw_input_contents; "
                "send every input one way."
            )
        if datatype == "BYTES" and count * 4 > len(blob):
            # Each element needs its 4-byte length: refuse before allocating `count` slots.
            raise InvalidParameter(
                f"Raw data of input {name!r} holds {len(blob)} bytes, too few for "
                f"{count} BYTES elements."
            )
        data = _from_raw(name, blob, datatype, shape)
    return InferInput(name=name, datatype=datatype, shape=shape, data=data, parameters=parameters)


def _from_raw(name: str, blob: bytes, datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    try:
        return from_raw(blob, datatype, shape)
    except InvalidParameter as exc:
        raise InvalidParameter(f"Input {name!r}: {exc.message}") from None


def _typed_contents(tensor: Any, count: int) -> np.ndarray:
    """The flat values of an input sent in ``contents``, checked against count, field and range."""
    name, datatype = tensor.name, tensor.datatype
    try:
        field, wide = _TYPED_FIELD[datatype]
    except KeyError:
        raise InvalidParameter(
            f"Input {name!r} is {datatype}, which has no typed contents field; "
            "send it in raw_input_contents."
        ) from None
    contents = tensor.contents
    for other in _CONTENT_FIELDS:
        if other != field and len(getattr(contents, other)):
            raise InvalidParameter(
                f"Input {name!r} is {datatype} but has values in {other}; use {field}."
            )
    values = getattr(contents, field)
    if len(values) != count:
        raise InvalidParameter(
            f"Input {name!r} holds {len(values)} values; shape {list(tensor.shape)} needs {count}."
        )
    if datatype == "BYTES":
        items = np.empty(count, dtype=object)
        for index, value in enumerate(values):
            items[index] = bytes(value)
        return items
    array = np.array(values, dtype=wide)
    dtype = numpy_dtype(datatype)
    if dtype.kind in "iu" and dtype.itemsize < array.dtype.itemsize and array.size:
        limits = np.iinfo(dtype.name)
        if array.min() < limits.min or array.max() > limits.max:
            raise InvalidParameter(
                f"Input {name!r} has values outside the range of {datatype} "
                f"[{limits.min}, {limits.max}]."
            )
    return array.astype(dtype, copy=False)


def _holds_values(tensor: Any) -> bool:
    """Whether an input carries any typed values (an empty ``contents`` message counts as none)."""
    if not tensor.HasField("contents"):
        return False
    return any(len(getattr(tensor.contents, field)) for field in _CONTENT_FIELDS)


def _decode_outputs(requested: Sequence[Any]) -> list[RequestedOutput]:
    outputs: list[RequestedOutput] = []
    seen: set[str] = set()
    for tensor in requested:
        if not tensor.name or tensor.name in seen:
            raise InvalidParameter(
                f"Requested output {tensor.name[:64]!r} is unnamed or requested twice."
            )
        seen.add(tensor.name)
        parameters = _parameters(tensor.parameters)
        if _SHARED_MEMORY_PARAMETER in parameters:
            raise NotImplementedFeature(
                "Shared-memory outputs are not supported; outputs come back in the response."
            )
        # gRPC answers every output raw (raw_output_contents), the analogue of REST binary.
        count = class_count(parameters, tensor.name)
        outputs.append(RequestedOutput(tensor.name, True, parameters, count))
    return outputs


def _tensor_metadata(specs: Sequence[TensorSpec]) -> list[Any]:
    tensor = pb.ModelMetadataResponse.TensorMetadata
    return [tensor(name=spec.name, datatype=spec.datatype, shape=spec.shape) for spec in specs]


def _model_name(name: str) -> str:
    if not name:
        raise InvalidParameter("A model name is required.")
    return name


def _parameters(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """``map<string, InferParameter>`` as plain Python values; unset entries are dropped."""
    decoded: dict[str, Any] = {}
    for key, parameter in parameters.items():
        kind = parameter.WhichOneof("parameter_choice")
        if kind is not None:
            decoded[key] = getattr(parameter, kind)
    return decoded


def _set_parameters(target: MutableMapping[str, Any], parameters: Mapping[str, Any]) -> None:
    """Write response parameters; values of types InferParameter cannot carry are skipped."""
    for key, value in parameters.items():
        if isinstance(value, bool):
            target[key].bool_param = value
        elif isinstance(value, int) and -_INT64_MAX - 1 <= value <= _INT64_MAX:
            target[key].int64_param = value
        elif isinstance(value, int) and 0 <= value < 1 << 64:
            target[key].uint64_param = value
        elif isinstance(value, float):
            target[key].double_param = value
        elif isinstance(value, str):
            target[key].string_param = value
        else:
            logger.debug("Response parameter %r of type %s not sent", key, type(value).__name__)


def _headers(metadata: Sequence[tuple[str, str | bytes]] | None) -> dict[str, str]:
    """Call metadata as headers: names lower-cased, repeated names joined, binary values dropped."""
    headers: dict[str, str] = {}
    for key, value in metadata or ():
        if isinstance(value, bytes):
            continue
        name = key.lower()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


def _check_response_size(size: int, limit: int) -> None:
    if size > limit:
        raise PayloadTooLarge(
            f"The response holds more than {limit:,} bytes, this server's gRPC message limit; "
            "request fewer outputs or send a smaller batch."
        )
