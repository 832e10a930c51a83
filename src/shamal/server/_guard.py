"""A pure ASGI middleware guarding every request: Host allow-list, body size and pace.

All run before any routing or parsing. The body limit is enforced on the bytes
actually received, not only on ``Content-Length``: a chunked or lying body is
cut off at the limit (413), and the application never sees the rest. A body that
stalls (no bytes for ``body_timeout_s``) or trickles (under ``min_body_rate`` bytes a
second on average, once ``rate_grace_s`` have passed) is cut off too (408): a slow
client cannot hold a request open for ever.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import NoReturn

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shamal.errors import PayloadTooLarge, ShamalError

logger = logging.getLogger(__name__)


class _BodyCutOff(ShamalError):
    """Raised to the application from ``receive``: the guard answers for it. A ShamalError,
    so the application's error path answers it without logging a failure of its own."""


class _BodyTooLarge(_BodyCutOff, PayloadTooLarge):
    pass


class _BodyTooSlow(_BodyCutOff):
    status = 408
    code = "REQUEST_TIMEOUT"


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


def _holds_nul(scope: Scope) -> bool:
    """A NUL in the path or the query string, raw or percent-encoded."""
    query: bytes = scope.get("query_string", b"")
    return "\x00" in scope.get("path", "") or b"\x00" in query or b"%00" in query


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
        body_timeout_s: longest wait for the next piece of a body (None: no limit).
        min_body_rate: least average bytes a second a body must arrive at, from the
            application's first read of it (0: no floor) ...
        rate_grace_s: ... once this many seconds have passed since that read.
        clock: monotonic seconds, for the rate.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        allowed_hosts: Sequence[str],
        max_body: int,
        upload_limits: Sequence[tuple[str, int]] = (),
        body_timeout_s: float | None = None,
        min_body_rate: int = 0,
        rate_grace_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app
        self.any_host = "*" in allowed_hosts
        self.allowed_hosts = {h.lower() for h in allowed_hosts}
        self.max_body = max_body
        self.upload_limits = tuple(upload_limits)
        self.body_timeout_s = body_timeout_s
        self.min_body_rate = min_body_rate
        self.rate_grace_s = rate_grace_s
        self.clock = clock

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
        if _holds_nul(scope):
            # No name, filter or path holds one, and PostgreSQL text cannot (a 500 there).
            await _send_error(
                send, 400, "INVALID_PARAMETER_VALUE", "a URL must not hold a NUL character"
            )
            return
        limit = self._limit_for(scope.get("path", ""))
        declared = _header(scope, b"content-length")
        if declared is not None and not declared.strip().isdigit():
            # RFC 9110: a Content-Length that is not a number is a malformed request.
            await _send_error(
                send, 400, "INVALID_PARAMETER_VALUE", "Content-Length must be a decimal number"
            )
            return
        if declared is not None and int(declared) > limit:
            await _send_error(send, 413, "REQUEST_TOO_LARGE", f"body over {limit} bytes")
            return
        await self._guarded(scope, receive, send, limit)

    async def _guarded(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        body = _WatchedBody(self, receive, limit)
        started = False

        async def watched_send(message: Message) -> None:
            nonlocal started
            cut = body.cut
            if cut is not None and not started and message["type"] == "http.response.start":
                # The app turned the cut-off into some other answer; the guard's is the truth.
                started = True
                await _send_error(send, cut.status, cut.code, cut.message)
                return
            if cut is not None and message["type"] == "http.response.body" and started:
                return
            if message["type"] == "http.response.start":
                started = True
                message = _with_nosniff(message)
            await send(message)

        try:
            await self.app(scope, body.receive, watched_send)
        except Exception:
            if body.cut is None:
                raise
            if not started:
                await _send_error(send, body.cut.status, body.cut.code, body.cut.message)
        if body.cut is not None:
            logger.info(
                "cut off the body of %s %r: %s", scope["method"], scope["path"], body.cut.code
            )


class _WatchedBody:
    """A request's ``receive``, held to the guard's size, stall and pace limits; ``cut`` is
    the limit it broke, raised to the application."""

    def __init__(self, guard: RequestGuard, receive: Receive, limit: int) -> None:
        self._guard = guard
        self._receive = receive
        self._limit = limit
        self._received = 0
        self._done = False
        self._first_read: float | None = None
        self.cut: _BodyCutOff | None = None

    def _cut_off(self, error: _BodyCutOff) -> NoReturn:
        self.cut = error
        raise error

    async def _next(self) -> Message:
        timeout = self._guard.body_timeout_s
        if self._done or timeout is None:
            return await self._receive()
        try:
            with anyio.fail_after(timeout):
                return await self._receive()
        except TimeoutError:
            self._cut_off(_BodyTooSlow(f"no body data for {timeout:g} s"))

    async def receive(self) -> Message:
        if self._first_read is None:
            self._first_read = self._guard.clock()
        message = await self._next()
        if message["type"] != "http.request":  # http.disconnect: nothing more will come
            self._done = True
            return message
        self._received += len(message.get("body", b""))
        if self._received > self._limit:
            self._cut_off(_BodyTooLarge(f"body over {self._limit} bytes"))
        self._done = not message.get("more_body", False)
        rate = self._guard.min_body_rate
        if not self._done and rate:
            elapsed = self._guard.clock() - self._first_read
            if elapsed > self._guard.rate_grace_s and self._received < rate * elapsed:
                self._cut_off(_BodyTooSlow(f"body slower than {rate} bytes/s"))
        return message


def _with_nosniff(start: Message) -> Message:
    """``start`` with the nosniff header added (once)."""
    headers = list(start.get("headers", []))
    if not any(name.lower() == _NOSNIFF[0] for name, _ in headers):
        headers.append(_NOSNIFF)
    return {**start, "headers": headers}
