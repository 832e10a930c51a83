"""The server's app with the promotion router mounted, whether or not the server mounts it
itself yet (the same path is never mounted twice)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.routing import APIRoute, iter_route_contexts

from shamal.config import Settings
from shamal.pipelines import promotion_router
from shamal.server import Platform, create_app

PROMOTE_PATH = "/api/v1/models/{name}/promote"


def has_gates(app: FastAPI) -> bool:
    """Whether ``app`` serves the promotion route (routers included: each route's context)."""
    return any(
        isinstance(rc.original_route, APIRoute) and rc.path == PROMOTE_PATH
        for rc in iter_route_contexts(app.routes)
    )


def app_with_gates(settings: Settings, platform: Platform | None = None) -> FastAPI:
    app = create_app(settings, platform)
    if not has_gates(app):
        app.include_router(promotion_router)
    return app
