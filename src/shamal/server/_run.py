"""Run the server: one process or several workers sharing one listening socket."""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from types import FrameType

import uvicorn
from fastapi import FastAPI

from shamal.config import Settings, is_loopback_host
from shamal.errors import InvalidParameter
from shamal.scheduler.live import SchedulerThread
from shamal.server._app import create_app
from shamal.server._platform import Platform, start_platform
from shamal.server._redact import access_log_config

logger = logging.getLogger(__name__)


#: Seconds a worker may take to answer its supervisor's ping (uvicorn's default: 5).
_WORKER_HEALTHCHECK_S = 60


def make_listener(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket created with ``proto=IPPROTO_TCP``.

    asyncio only sets TCP_NODELAY on accepted connections whose socket says
    ``IPPROTO_TCP``; uvicorn's own pre-bound sockets (``--workers``) say 0, and
    every keep-alive response then waits ~40 ms for a delayed ACK. Binding here
    avoids that and lets ``port=0`` pick a free port.
    """
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _finish_on_sigterm(signum: int, frame: FrameType | None) -> None:
    """SIGTERM outside uvicorn's drain (before it, or re-raised by it after): unwind, so the
    scheduler stops, the database closes and exit handlers run, then exit 0 (a stop that was
    asked for and done)."""
    raise SystemExit(0)


def _unwind_on_sigterm() -> None:
    """Make SIGTERM unwind the process instead of killing it where it stands.

    uvicorn drains on SIGTERM, then restores the handler it found and raises the signal
    again. With the default handler that kills the process at once: no ``finally`` and no
    ``atexit`` runs, so children the server started (the quickstart's model server) were
    left running and SQLite's log was left behind. With this handler the re-raised
    signal ends the process the way Ctrl-C does.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _finish_on_sigterm)


def app_from_env() -> FastAPI:
    """Application factory for worker processes: settings from the environment."""
    app = create_app(Settings())
    settle_heap()
    return app


def settle_heap() -> None:
    """Keep the cyclic garbage collector off the objects a server process starts with.

    A server holds a few hundred thousand long-lived objects (modules, routes, schemas,
    the ORM's mappings) and makes short-lived ones by the thousand per request (a
    log-batch parses 1,000 metrics, a history page returns 25,000 points). With the
    default thresholds a collection runs every 700 allocations, and the older
    generations' passes walk the whole heap. Frozen, the startup objects are never
    walked again, and a larger first threshold makes collections rarer. Garbage without
    cycles is freed by reference counting as before; only cycles wait longer.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 10, 10)


def serve(
    settings: Settings,
    *,
    on_ready: Callable[[Platform, str], None] | None = None,
) -> None:
    """Migrate, bootstrap, then serve until SIGINT/SIGTERM (graceful drain).

    Args:
        settings: configuration; ``settings.workers > 1`` forks worker processes.
        on_ready: called with the platform and the base URL once the socket is bound.

    Raises:
        InvalidParameter: a non-loopback bind without an explicit Host allow-list.
    """
    if not is_loopback_host(settings.host) and not settings.allowed_hosts:
        raise InvalidParameter(
            f"binding {settings.host} exposes Shamal beyond this machine: set "
            "SHAMAL_ALLOWED_HOSTS to the names clients use (e.g. '[\"shamal.example.com\"]')"
        )
    _unwind_on_sigterm()
    platform = start_platform(settings)
    sock = make_listener(settings.host, settings.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    base_url = f"http://{shown}:{port}"
    common = {
        "timeout_graceful_shutdown": int(settings.graceful_shutdown_s),
        "server_header": False,
        "proxy_headers": False,
        "log_level": "info",
        "access_log": settings.access_log,
        "log_config": access_log_config(),  # tokens in a query string or path never logged
    }
    scheduler = None
    if settings.scheduler.enabled:
        scheduler = SchedulerThread(platform.scheduler_loop(api_url=base_url))
    if on_ready is not None:
        on_ready(platform, base_url)
    watching = threading.Event()
    try:
        if settings.audit_check_s > 0:
            threading.Thread(
                target=platform.audit_watch.run,
                args=(watching, settings.audit_check_s),
                name="shamal-audit-watch",
                daemon=True,
            ).start()
        if scheduler is not None:
            scheduler.start()
        if settings.workers == 1:
            config = uvicorn.Config(create_app(settings, platform), **common)  # type: ignore[arg-type]
            settle_heap()
            uvicorn.Server(config).run(sockets=[sock])
            return
        if scheduler is None:
            platform.close()  # each worker opens its own connections
        # Workers rebuild Settings from the environment: hand them ours.
        os.environ.update(_settings_env(settings))
        config = uvicorn.Config(
            "shamal.server._run:app_from_env",
            factory=True,
            workers=settings.workers,
            # A worker starting up imports every domain and opens the platform while holding
            # the GIL; on a busy machine that outlasts uvicorn's 5 s ping, and the supervisor
            # would kill and restart it for ever. A hung worker is still replaced, later.
            timeout_worker_healthcheck=_WORKER_HEALTHCHECK_S,
            **common,  # type: ignore[arg-type]
        )
        from uvicorn.supervisors import Multiprocess

        Multiprocess(config, sockets=[sock]).run()
    finally:
        watching.set()
        if scheduler is not None:
            scheduler.stop()
        sock.close()
        platform.close()


def _settings_env(settings: Settings) -> dict[str, str]:
    env = {
        "SHAMAL_HOME": str(settings.home),
        "SHAMAL_HOST": settings.host,
        "SHAMAL_PORT": str(settings.port),
        "SHAMAL_ACCESS_LOG": str(settings.access_log).lower(),
    }
    if settings.database_url:
        env["SHAMAL_DATABASE_URL"] = settings.database_url
    # Workers validate submissions against the same pools and classes; they never schedule.
    scheduler = settings.scheduler.model_copy(update={"enabled": False})
    env["SHAMAL_SCHEDULER"] = scheduler.model_dump_json()
    return env
