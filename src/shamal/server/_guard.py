"""A pure ASGI middleware guarding every request: Host allow-list and body size limits.

Both run before any routing or parsing. The body limit is enforced on the bytes
actually received, not only on ``Content-Length``: a chunked or lying body is
cut off at the limit (413), and the application never sees the rest.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger(__name__)


class _BodyTooLarge(Exception):
    pass


#: On every answer: browsers take it as the type it declares and never sniff HTML or script
#: out of an artifact or an error body.
_NOSNIFF = (b"x-content-type-options", b"nosniff")


async def _send_error(send: Send, status: int, code: str, message: str) -> None:
    body = json.dumps({"error_code": code, "message": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                _NOSNIFF,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return None


class RequestGuard:
    """Reject requests for foreign Host names and bodies over the limit.

    Args:
        app: the wrapped application.
        allowed_hosts: host names accepted in the ``Host`` header (``*`` = any).
        max_body: default body limit in bytes.
        upload_limits: (path prefix, limit) pairs for routes that stream large uploads.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        allowed_hosts: Sequence[str],
        max_body: int,
        upload_limits: Sequence[tuple[str, int]] = (),
    ) -> None:
        self.app = app
        self.any_host = "*" in allowed_hosts
        self.allowed_hosts = {h.lower() for h in allowed_hosts}
        self.max_body = max_body
        self.upload_limits = tuple(upload_limits)

    def _host_allowed(self, scope: Scope) -> bool:
        if self.any_host:
            return True
        raw = _header(scope, b"host")
        if raw is None:
            return False
        host = raw.decode("latin-1").strip().lower()
        if host.startswith("["):
            host = host[: host.find("]") + 1]
        elif host.count(":") == 1:
            host = host.split(":", 1)[0]
        return host in self.allowed_hosts

    def _limit_for(self, path: str) -> int:
        for prefix, limit in self.upload_limits:
            if path.startswith(prefix):
                return limit
        return self.max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self._host_allowed(scope):
            await _send_error(send, 400, "INVALID_PARAMETER_VALUE", "host not allowed")
            return
        limit = self._limit_for(scope.get("path", ""))
        declared = _header(scope, b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await _send_error(send, 413, "REQUEST_TOO_LARGE", f"body over {limit} bytes")
            return
        await self._guarded(scope, receive, send, limit)

    async def _guarded(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        received = 0
        exceeded = False
        started = False

        async def limited_receive() -> Message:
            nonlocal received, exceeded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    exceeded = True
                    raise _BodyTooLarge
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            if exceeded and not started and message["type"] == "http.response.start":
                # The app turned the cut-off into some other answer; the truth is 413.
                started = True
                await _send_error(send, 413, "REQUEST_TOO_LARGE", f"body over {limit} bytes")
                return
            if exceeded and message["type"] == "http.response.body" and started:
                return
            if message["type"] == "http.response.start":
                started = True
                message = _with_nosniff(message)
            await send(message)

        try:
            await self.app(scope, limited_receive, watched_send)
        except Exception:
            if not exceeded:
                raise
            if not started:
                await _send_error(send, 413, "REQUEST_TOO_LARGE", f"body over {limit} bytes")


def _with_nosniff(start: Message) -> Message:
    """``start`` with the nosniff header added (once)."""
    headers = list(start.get("headers", []))
    if not any(name.lower() == _NOSNIFF[0] for name, _ in headers):
        headers.append(_NOSNIFF)
    return {**start, "headers": headers}
