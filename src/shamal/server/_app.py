"""The application factory: mounts each domain's router behind one error path."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio.to_thread
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from sqlalchemy import text

import shamal
from shamal.artifacts import PrincipalSlots, sweep_spool
from shamal.artifacts import api as artifacts_api
from shamal.config import Settings
from shamal.datasets import api as datasets_api
from shamal.db import current_revision, head_revision
from shamal.deployments import api as deployments_api
from shamal.events import api as events_api
from shamal.features import api as features_api
from shamal.jobs import api as jobs_api
from shamal.jobs import snapshot
from shamal.lineage import api as lineage_api
from shamal.mlflow import (
    MLFLOW_VERSION,
    registry_router,
    traces_router,
    tracking_router,
    webhooks_router,
)
from shamal.mlflow import ui_router as mlflow_ui_router
from shamal.monitoring import api as monitoring_api
from shamal.pipelines import api as pipelines_api
from shamal.pipelines import promotion_router
from shamal.registry import api as registry_api
from shamal.security import api as security_api
from shamal.server._errors import install_error_handlers
from shamal.server._guard import RequestGuard
from shamal.server._platform import Platform, start_platform
from shamal.server._strict import (
    RejectLoneSurrogates,
    redirect_merged_slashes,
    reject_unknown_query,
)
from shamal.tracking import api as tracking_api
from shamal.tune import api as tune_api
from shamal.webui import ui_router

logger = logging.getLogger(__name__)

#: Routes that answer without a token. The route-inventory test holds every
#: other route to the auth dependency, but the web UI's: those need its session cookie
#: (``shamal.webui.session_principal``) and their forms its CSRF check, but the sign-in form
#: and the static files (``shamal.webui.PUBLIC_ROUTES``).
PUBLIC_ROUTES = frozenset(
    {
        "/health",
        "/ready",
        "/version",
        "/api/3.0/mlflow/server-info",
        "/ajax-api/3.0/mlflow/server-info",
    }
)
UPLOAD_PREFIXES: tuple[str, ...] = (
    "/api/v1/artifacts/",
    "/api/2.0/mlflow-artifacts/artifacts/",
    datasets_api.UPLOAD_PREFIX,
    features_api.UPLOAD_PREFIX,
)
#: Code snapshots stream to disk too, up to what a snapshot may be (never more than an upload).
SNAPSHOT_PREFIX = "/api/v1/snapshots/"


def upload_limits(settings: Settings) -> list[tuple[str, int]]:
    """(path prefix, body limit) of the routes that stream large bodies to disk; every
    other route is held to ``max_request_bytes``."""
    limits = [(prefix, settings.max_upload_bytes) for prefix in UPLOAD_PREFIXES]
    limits.append((SNAPSHOT_PREFIX, min(settings.max_upload_bytes, snapshot.MAX_SNAPSHOT_BYTES)))
    return limits


def _bind(app: FastAPI, platform: Platform) -> None:
    app.state.platform = platform
    app.state.settings = platform.settings
    app.state.db = platform.db
    app.state.audit = platform.audit
    app.state.audit_watch = platform.audit_watch
    app.state.security = platform.security
    app.state.artifacts = platform.artifacts
    app.state.tracking = platform.tracking
    app.state.registry = platform.registry
    app.state.jobs = platform.jobs
    app.state.tune = platform.tune
    app.state.deployments = platform.deployments
    app.state.datasets = platform.datasets
    app.state.lineage = platform.lineage
    app.state.dataset_sources = platform.dataset_sources
    app.state.features = platform.features
    app.state.pipelines = platform.pipelines
    app.state.promotion = platform.promotion
    app.state.events = platform.events
    app.state.references = platform.references
    app.state.monitors = platform.monitors
    app.state.traces = platform.traces


def create_app(settings: Settings, platform: Platform | None = None) -> FastAPI:
    """Build the ASGI app.

    Args:
        settings: the configuration.
        platform: already-started services (tests, multi-app processes); when
            None the app starts them in its lifespan and closes them at shutdown.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned = platform is None
        running = start_platform(settings) if owned else platform
        assert running is not None
        _bind(app, running)
        await anyio.to_thread.run_sync(sweep_spool, settings.resolved_upload_spool_dir)
        try:
            yield
        finally:
            if owned:
                running.close()

    app = FastAPI(
        title="Shamal",
        version=shamal.__version__,
        description="Self-hostable ML platform. Every `/api` route needs `Authorization: "
        "Bearer <token>`; the first admin token is written to `SHAMAL_HOME/token`.",
        lifespan=lifespan,
        dependencies=[Depends(reject_unknown_query)],
    )
    if platform is not None:
        _bind(app, platform)
    # Per account: bodies streaming in, and searches or list pages being built.
    app.state.upload_slots = PrincipalSlots("uploads", settings.max_uploads_per_principal)
    app.state.search_slots = PrincipalSlots("searches", settings.max_searches_per_principal)
    app.state.download_slots = PrincipalSlots("downloads", settings.max_downloads_per_principal)
    install_error_handlers(app)
    # Inside the guard (added later, so it runs first): bodies reach it already capped.
    app.add_middleware(RejectLoneSurrogates, skip_prefixes=(*UPLOAD_PREFIXES, SNAPSHOT_PREFIX))
    app.add_middleware(
        RequestGuard,
        allowed_hosts=settings.effective_allowed_hosts,
        max_body=settings.max_request_bytes,
        upload_limits=upload_limits(settings),
        body_timeout_s=settings.body_timeout_s,
        min_body_rate=settings.min_body_rate,
        rate_grace_s=settings.body_rate_grace_s,
    )
    _add_probes(app)
    # Routing tries routes in order: the MLflow dialect carries the volume (a logger sends
    # thousands of requests), so it comes first, after the one route a model calls on every
    # prediction (online features: each route tried before it costs it about 10 us).
    # No path is served by two routers.
    app.include_router(features_api.online_router)
    app.include_router(tracking_router)
    app.include_router(registry_router)
    app.include_router(webhooks_router)
    app.include_router(traces_router)
    app.include_router(mlflow_ui_router)
    app.include_router(security_api.router)
    app.include_router(artifacts_api.router)
    app.include_router(tracking_api.router)
    app.include_router(registry_api.router)
    app.include_router(jobs_api.router)
    app.include_router(tune_api.router)
    app.include_router(deployments_api.router)
    app.include_router(datasets_api.router)
    app.include_router(lineage_api.router)
    app.include_router(features_api.router)
    app.include_router(pipelines_api.router)
    app.include_router(promotion_router)
    app.include_router(events_api.router)
    app.include_router(monitoring_api.router)
    # The web UI (its own sign-in: a sealed session cookie, not a bearer header).
    app.include_router(ui_router(settings.keys_dir))
    redirect_merged_slashes(app.router)
    return app


def _add_probes(app: FastAPI) -> None:
    @app.get("/health", tags=["probes"], summary="Liveness: the process answers")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(
        "/version",
        tags=["probes"],
        summary="The MLflow version the server speaks",
        description=(
            "As a stock MLflow server answers its own version: MLflow 3 clients read it "
            "before features that need a recent server (``log_spans``). Shamal's own "
            "version is in the ``X-Shamal-Version`` header."
        ),
        response_class=PlainTextResponse,
        responses={
            200: {
                "content": {"text/plain": {"schema": {"type": "string"}}},
                "headers": {"X-Shamal-Version": {"schema": {"type": "string"}}},
            }
        },
    )
    def version() -> PlainTextResponse:
        return PlainTextResponse(MLFLOW_VERSION, headers={"X-Shamal-Version": shamal.__version__})

    @app.get(
        "/ready",
        tags=["probes"],
        summary="Readiness: the database answers and its schema is current",
        responses={503: {"description": "Not ready"}},
    )
    def ready(request: Request) -> JSONResponse:
        db = getattr(request.app.state, "db", None)
        if db is None:
            return JSONResponse({"status": "starting"}, status_code=503)
        try:
            with db.engine.connect() as connection:
                connection.execute(text("SELECT 1"))
            current = current_revision(db)
        except Exception:  # noqa: BLE001 - readiness reports any failure as "not ready"
            logger.warning("readiness check failed", exc_info=True)
            return JSONResponse({"status": "database unavailable"}, status_code=503)
        if current != head_revision():
            return JSONResponse({"status": "schema not current"}, status_code=503)
        return JSONResponse({"status": "ready", "schema": current})
