"""The server's app with the promotion router mounted, whether or not the server mounts it
itself yet (the same path is never mounted twice)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.routing import APIRoute

from shamal.config import Settings
from shamal.pipelines import promotion_router
from shamal.server import Platform, create_app

PROMOTE_PATH = "/api/v1/models/{name}/promote"


def app_with_gates(settings: Settings, platform: Platform | None = None) -> FastAPI:
    app = create_app(settings, platform)
    if not any(isinstance(r, APIRoute) and r.path == PROMOTE_PATH for r in app.routes):
        app.include_router(promotion_router)
    return app
