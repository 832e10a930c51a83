"""A live HTTP server in this process (uvicorn on a thread) serving the platform's app with
its routers: the CLI reaches it over TCP as it would any server."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from shamal.server import Platform, create_app
from tests.live import free_port


@contextmanager
def serving(platform: Platform, deadline_s: float = 30.0) -> Iterator[str]:
    """The URL of the platform's app served on a free loopback port until the block ends."""
    port = free_port()
    app = create_app(platform.settings, platform)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="gate-server", daemon=True)
    thread.start()
    end = time.monotonic() + deadline_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > end:
            server.should_exit = True
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)  # polling with a deadline, not synchronising on a sleep
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
