"""The HTTP server: app factory, platform start-up and the process runner."""

from __future__ import annotations

from shamal.server._app import PUBLIC_ROUTES, create_app
from shamal.server._platform import Platform, start_platform
from shamal.server._run import make_listener, serve

__all__ = ["PUBLIC_ROUTES", "Platform", "create_app", "make_listener", "serve", "start_platform"]
