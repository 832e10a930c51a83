"""The Open Inference Protocol over REST, as a plain ASGI application.

No framework sits on the inference path: routing is a split of the path, the body is read with
our own size cap (``Content-Length`` over the cap is refused before a byte is read; chunked bodies
are counted as they arrive), and errors are ``{"error": "..."}`` with the status of the
:class:`ShamalError` raised (``Retry-After`` on 429/503). Messages of unexpected exceptions are
logged, never sent.

Routes: ``GET /v2/health/live``, ``/v2/health/ready``, ``/v2``, ``/v2/models``,
``/v2/models/{m}[/versions/{v}]``, ``.../ready``, ``POST .../infer``, ``GET /metrics``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from shamal.errors import (
    EndpointNotFound,
    InvalidParameter,
    NotFound,
    PayloadTooLarge,
    ServiceUnavailable,
    ShamalError,
    TooManyRequests,
)
from shamal.serving._access import Access, OpenAccess, bearer_token, host_allowed
from shamal.serving._core import InferenceCore
from shamal.serving._metrics import CONTENT_TYPE_LATEST
from shamal.serving._rest_codec import (
    decode_body,
    decode_raw_request,
    decode_request,
    encode_response,
    is_raw,
)
from shamal.serving._types import InferRequest, InferResponse, ModelMetadata

__all__ = ["RestApp"]

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: Routes open to every caller: what orchestrators and scrapers call without credentials.
_PROBES = (["v2", "health", "live"], ["v2", "health", "ready"], ["metrics"])
_JSON = b"application/json"
_PICKLE_TYPES = {"application/vnd.bentoml+pickle", "application/python-pickle"}
_PICKLE_TYPES |= {"application/x-python-pickle", "application/pickle"}
DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024
#: Bodies and answers past this size are decoded and encoded on a worker thread, so that one
#: large JSON tensor does not hold up every other request on the event loop.
OFF_LOOP_BYTES = 256 * 1024


class _Disconnected(Exception):
    """The client went away while we read its body."""


class _MethodNotAllowed(ShamalError):
    status = 405
    code = "METHOD_NOT_ALLOWED"


class _UnsupportedMediaType(ShamalError):
    status = 415
    code = "UNSUPPORTED_MEDIA_TYPE"


class RestApp:
    """ASGI app serving one :class:`InferenceCore`.

    Args:
        core: the inference core (started on the same event loop).
        max_request_bytes: the largest body accepted, after decompression too.
    """

    def __init__(
        self,
        core: InferenceCore,
        *,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        access: Access | None = None,
        allowed_hosts: frozenset[str] | None = None,
    ):
        self.core = core
        self.max_request_bytes = max_request_bytes
        self.access: Access = access or OpenAccess()
        self.allowed_hosts = allowed_hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        try:
            await self._dispatch(scope, receive, send)
        except _Disconnected:
            return
        except ShamalError as exc:
            await _send_error(send, exc)
        except Exception:
            logger.exception("Unhandled error on %s %s", scope.get("method"), scope.get("path"))
            await _send_json(send, 500, {"error": "Internal server error."})

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        parts = path.strip("/").split("/")
        if not host_allowed(_header(scope, b"host"), self.allowed_hosts):
            raise InvalidParameter("Host not allowed.")
        if parts not in _PROBES:
            model = parts[2] if len(parts) >= 3 and parts[:2] == ["v2", "models"] else None
            await self.access.check(bearer_token(_header(scope, b"authorization")), model)
        if parts[0] == "v2":
            if len(parts) >= 3 and parts[1] == "models":
                await self._model_route(parts[2:], scope, receive, send)
                return
            _expect(method, "GET")
            await self._server_route(parts[1:], send)
            return
        if parts == ["metrics"]:
            _expect(method, "GET")
            await _send(send, 200, self.core.metrics.exposition(), CONTENT_TYPE_LATEST.encode())
            return
        raise EndpointNotFound(f"No route for {method} {path[:128]}.")

    async def _server_route(self, rest: list[str], send: Send) -> None:
        core = self.core
        if rest == [] or rest == [""]:
            meta = core.server_metadata()
            body = {"name": meta.name, "version": meta.version, "extensions": list(meta.extensions)}
            await _send_json(send, 200, body)
        elif rest == ["health", "live"]:
            if not core.live():
                raise ServiceUnavailable("The server is stopping.")
            await _send_json(send, 200, {"live": True})
        elif rest == ["health", "ready"]:
            if not core.ready():
                raise ServiceUnavailable("The server is not ready (loading or draining).")
            await _send_json(send, 200, {"ready": True})
        elif rest == ["models"]:
            await _send_json(send, 200, {"models": core.model_names()})
        else:
            raise EndpointNotFound("No such route under /v2.")

    async def _model_route(
        self, rest: list[str], scope: Scope, receive: Receive, send: Send
    ) -> None:
        model, version, tail = _model_path(rest)
        method = scope["method"]
        if tail == "infer":
            _expect(method, "POST")
            await self._infer(model, version, scope, receive, send)
        elif tail == "ready":
            _expect(method, "GET")
            if not self.core.model_ready(model, version):
                versions = self.core.repository.models.get(model)
                if versions is None or (version is not None and version not in versions):
                    raise NotFound(f"Model '{model[:128]}' has no such version here.")
                raise ServiceUnavailable(f"Model '{model}' is not ready.")
            await _send_json(send, 200, {"name": model, "ready": True})
        elif tail == "":
            _expect(method, "GET")
            await _send_json(send, 200, _metadata_body(self.core.model_metadata(model, version)))
        else:
            raise EndpointNotFound("No such model route.")

    async def _infer(
        self, model: str, version: str | None, scope: Scope, receive: Receive, send: Send
    ) -> None:
        headers = {
            key.decode("latin-1"): value.decode("latin-1") for key, value in scope["headers"]
        }
        try:
            # Before the body: an unknown model is a 404 whatever the body holds (too large,
            # malformed, pickled), and nothing of it is read.
            self.core.check_served(model, version)
            content_type = headers.get("content-type", "").split(";")[0].strip().lower()
            if content_type in _PICKLE_TYPES:
                raise _UnsupportedMediaType(
                    "Pickled request bodies are refused; send JSON or binary tensors (OIP)."
                )
            body = await _read_body(receive, headers.get("content-length"), self.max_request_bytes)
            body = decode_body(body, headers.get("content-encoding"), self.max_request_bytes)
            request = await self._decode(body, model, version, headers)
        except ShamalError as exc:
            self.core.count(model, version or "", "rest", exc.status, 0.0)
            raise
        response = await self.core.infer_via(request, "rest")
        if _answer_bytes(response) > OFF_LOOP_BYTES:
            payload, json_length = await asyncio.to_thread(encode_response, response, request)
        else:
            payload, json_length = encode_response(response, request)
        if json_length is None:
            await _send(send, 200, payload, _JSON)
        else:
            extra = [(b"inference-header-content-length", str(json_length).encode())]
            await _send(send, 200, payload, b"application/octet-stream", extra)

    async def _decode(
        self, body: bytes, model: str, version: str | None, headers: dict[str, str]
    ) -> InferRequest:
        header_length = headers.get("inference-header-content-length")
        if is_raw(header_length):
            spec, batched = self.core.raw_input(model, version, headers)
            return decode_raw_request(
                body, spec, batched, model=model, version=version, headers=headers
            )
        if len(body) > OFF_LOOP_BYTES:
            return await asyncio.to_thread(
                decode_request, body, header_length, model=model, version=version, headers=headers
            )
        return decode_request(body, header_length, model=model, version=version, headers=headers)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def _answer_bytes(response: InferResponse) -> int:
    return sum(tensor.data.nbytes for tensor in response.outputs)


def _model_path(rest: list[str]) -> tuple[str, str | None, str]:
    """``{m}[/versions/{v}][/ready|/infer]`` -> model, version, tail."""
    model = rest[0]
    tail = rest[1:]
    version = None
    if len(tail) >= 2 and tail[0] == "versions":
        version = tail[1]
        tail = tail[2:]
    if len(tail) > 1 or not model or version == "":
        raise EndpointNotFound("No such model route.")
    return model, version, tail[0] if tail else ""


def _expect(method: str, allowed: str) -> None:
    if method != allowed and not (allowed == "GET" and method == "HEAD"):
        raise _MethodNotAllowed(f"Use {allowed} here.")


async def _read_body(receive: Receive, declared: str | None, limit: int) -> bytes:
    if declared is not None:
        if not declared.strip().isdigit():
            raise InvalidParameter("Content-Length must be an integer.")
        if int(declared) > limit:
            raise PayloadTooLarge(
                f"The request body is larger than the server's limit of {limit} bytes."
            )
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(
                f"The request body is larger than the server's limit of {limit} bytes."
            )
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _metadata_body(meta: ModelMetadata) -> dict[str, Any]:
    def tensors(specs: Any) -> list[dict[str, Any]]:
        return [{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)} for s in specs]

    return {
        "name": meta.name,
        "versions": list(meta.versions),
        "platform": meta.platform,
        "inputs": tensors(meta.inputs),
        "outputs": tensors(meta.outputs),
    }


async def _send_error(send: Send, exc: ShamalError) -> None:
    extra: list[tuple[bytes, bytes]] = []
    retry = getattr(exc, "retry_after_s", None)
    if isinstance(exc, TooManyRequests | ServiceUnavailable) and retry is not None:
        extra.append((b"retry-after", str(max(1, math.ceil(retry))).encode()))
    if exc.status == 413:
        extra.append((b"connection", b"close"))
    if exc.status == 401:
        extra.append((b"www-authenticate", b'Bearer realm="shamal-serve"'))
    body = json.dumps({"error": exc.message}).encode()
    await _send(send, exc.status, body, _JSON, extra)


async def _send_json(send: Send, status: int, body: dict[str, Any]) -> None:
    await _send(send, status, json.dumps(body, separators=(",", ":")).encode(), _JSON)


async def _send(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
