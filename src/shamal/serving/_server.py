"""The model-server process: REST (uvicorn) and gRPC on one asyncio loop, and a graceful drain.

Start-up loads every ``--model`` and the deployment's current versions first (a bad ``--model``
or a deployment with no loadable primary stops the process before it listens; versions a
deployment adds later load on a thread while the server runs, see
:mod:`shamal.serving._repository`), binds the
REST listener itself with ``IPPROTO_TCP`` so accepted connections keep ``TCP_NODELAY`` (a socket
made with protocol 0 loses it and every keep-alive request pays ~44 ms of delayed ACK), then prints
one line per listener (``Serving OIP REST on http://HOST:PORT``) for operators and tests.

SIGTERM or SIGINT starts the drain: readiness answers 503 at once and new inference requests get
503 + ``Retry-After``; requests in flight and batches already queued run to the end (at most
``drain_timeout_s``); then both listeners close and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.util
import logging
import signal
import socket
import sys
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from shamal.errors import InvalidParameter, ServiceUnavailable
from shamal.serving._access import Access
from shamal.serving._core import InferenceCore
from shamal.serving._rest import DEFAULT_MAX_REQUEST_BYTES, RestApp

__all__ = ["ServerOptions", "bind_listener", "run_server", "serve_forever"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerOptions:
    """Where and how the process listens.

    Attributes:
        host: interface for both listeners.
        http_port: REST port (0 = any free port; the chosen one is printed).
        grpc_port: gRPC port, or None for no gRPC.
        max_request_bytes: largest REST body and gRPC message.
        drain_timeout_s: longest wait for in-flight work after SIGTERM.
        access: who may call the routes other than the probes (None: anyone).
        allowed_hosts: names accepted in the ``Host`` header (None: any).
    """

    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int | None = None
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    drain_timeout_s: float = 30.0
    access: Access | None = None
    allowed_hosts: frozenset[str] | None = None


#: Most bytes of request line + headers per request (uvicorn's httptools parser has no cap).
MAX_HEADER_BYTES = 64 * 1024


class _BoundedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with a cap on URL + header bytes: a request past it gets
    uvicorn's own 400 and the connection closes, instead of headers piling up in memory."""

    _header_bytes = 0

    def on_message_begin(self) -> None:
        self._header_bytes = 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value))
        super().on_header(name, value)

    def _count(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > MAX_HEADER_BYTES:
            raise ValueError("request headers too large")  # the parser turns it into a 400


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handlers: the drain decides when it stops."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket made with ``IPPROTO_TCP`` (so accepted sockets get TCP_NODELAY).

    Raises:
        InvalidParameter: the address cannot be bound (in use, no such interface).
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except socket.gaierror:
        raise InvalidParameter(f"Cannot resolve the host {host!r}.") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(address)
        sock.listen(2048)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise InvalidParameter(
            f"Cannot listen on {host}:{port} ({exc.strerror}); pick another --http-port."
        ) from None
    return sock


async def serve_forever(
    core: InferenceCore,
    options: ServerOptions,
    *,
    announce: Callable[[str], None] = print,
    on_stop: Callable[[], None] | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT, drain, and return the exit code (0 after a clean drain).

    Raises:
        InvalidParameter: a listener cannot be bound.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    sock = bind_listener(options.host, options.http_port)
    core.start()
    try:
        grpc_server = await _start_grpc(core, options)
    except BaseException:
        sock.close()
        await core.stop()
        raise
    config = uvicorn.Config(
        RestApp(
            core,
            max_request_bytes=options.max_request_bytes,
            access=options.access,
            allowed_hosts=options.allowed_hosts,
        ),
        lifespan="off",
        log_level="warning",
        access_log=False,
        http=_BoundedHttpTools,
        timeout_graceful_shutdown=max(1, int(options.drain_timeout_s)),
        timeout_keep_alive=30,
    )
    server = _Uvicorn(config)
    rest_task = loop.create_task(server.serve(sockets=[sock]))
    port = sock.getsockname()[1]
    # Everything loaded so far lives as long as the process: keep it out of the collector's
    # full passes, which otherwise walk every model object and stall requests for milliseconds.
    gc.collect()
    gc.freeze()
    announce(f"Serving OIP REST on http://{_host_text(options.host)}:{port}")
    if grpc_server is not None:
        announce(f"Serving OIP gRPC on {_host_text(options.host)}:{options.grpc_port}")
    stopper = loop.create_task(stop.wait())
    await asyncio.wait({stopper, rest_task}, return_when=asyncio.FIRST_COMPLETED)
    failed = rest_task.done()
    if failed:
        logger.error("The REST server stopped on its own; shutting down")
    logger.info("Draining: readiness is now false; finishing in-flight requests")
    clean = await core.drain(options.drain_timeout_s)
    if on_stop is not None:
        on_stop()
    server.should_exit = True
    if grpc_server is not None:
        await grpc_server.stop(options.drain_timeout_s)
    await asyncio.gather(rest_task, return_exceptions=True)
    stopper.cancel()
    await core.stop()
    if options.access is not None:
        await options.access.close()
    return 0 if clean and not failed else 1


async def _start_grpc(core: InferenceCore, options: ServerOptions) -> Any:
    if options.grpc_port is None:
        return None
    if importlib.util.find_spec("shamal.serving._grpc") is None:
        raise InvalidParameter("This build of Shamal has no gRPC front end; drop --grpc-port.")
    from shamal.serving._grpc import start_grpc_server

    try:
        return await start_grpc_server(
            core,
            host=options.host,
            port=options.grpc_port,
            max_message_bytes=options.max_request_bytes,
            access=options.access,
        )
    except ServiceUnavailable as exc:
        raise InvalidParameter(f"{exc.message} Pick another --grpc-port.") from None


def _host_text(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def run_server(
    core: InferenceCore,
    options: ServerOptions,
    *,
    on_stop: Callable[[], None] | None = None,
) -> int:
    """Run :func:`serve_forever` on a fresh event loop (uvloop when installed)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] ships uvloop
        uvloop = None  # type: ignore[assignment]

    def announce(line: str) -> None:
        print(line, flush=True)

    try:
        main = serve_forever(core, options, announce=announce, on_stop=on_stop)
        return uvloop.run(main) if uvloop is not None else asyncio.run(main)
    finally:
        sys.stdout.flush()
