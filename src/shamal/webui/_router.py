"""The UI's router: its routes, and the one place their failures become pages."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, ClassVar

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.responses import JSONResponse, Response

from shamal.errors import ShamalError, Unauthenticated
from shamal.webui import (
    _artifacts,
    _audit,
    _auth,
    _data,
    _data_features,
    _deployments,
    _jobs,
    _jobs_usage,
    _lineage,
    _mlflow_ui,
    _models,
    _monitors,
    _pages,
    _pipelines,
    _series,
)
from shamal.webui._render import SECURITY_HEADERS, page
from shamal.webui._seal import SessionSeal
from shamal.webui._session import CsrfRefused, SignedOut

logger = logging.getLogger(__name__)

#: The modules of pages, each with its ``ROUTES``.
PAGE_MODULES = (
    _pages,
    _models,
    _artifacts,
    _data,
    _data_features,
    _lineage,
    _jobs,
    _jobs_usage,
    _pipelines,
    _deployments,
    _monitors,
    _audit,
    _mlflow_ui,
)

#: Pages anyone may open: the sign-in form and the static files it needs (and those of
#: MLflow's own UI, a public release).
PUBLIC_ROUTES = frozenset({"/ui/sign-in", "/ui/static/{name}", "/mlflow/static-files/{path:path}"})
API_PREFIX = "/ui/api/"


def _is_api(path: str) -> bool:
    """A call made by script (answered in JSON), not a page: ``/ui/api/...`` and every call
    MLflow's own UI makes under ``/mlflow/``."""
    return path.startswith(API_PREFIX) or (path.startswith("/mlflow/") and path != "/mlflow/")


def _error_page(request: Request, status: int, message: str) -> Response:
    if _is_api(request.url.path):
        body = {"error_code": "UI_ERROR", "message": message}
        return JSONResponse(body, status_code=status, headers=SECURITY_HEADERS)
    principal = getattr(request.state, "principal", None)
    context = {"title": "Not possible", "principal": principal, "csrf": "", "message": message}
    if principal is not None:
        context["csrf"] = request.state.ui_seal.csrf_token(request.state.ui_session)
    return page("error.html", context, status)


def _signed_out(request: Request, exc: SignedOut) -> Response:
    if _is_api(request.url.path):
        return _error_page(request, Unauthenticated.status, "signed out: sign in again")
    return _auth.sign_out_response(request, exc.return_to)


class UIRoute(APIRoute):
    """A route of the UI: the request carries the session seal; signed out it redirects to
    the sign-in form, a refused form answers 403, a service's refusal becomes a page with
    its status (JSON under ``/ui/api/``); every answer carries the security headers."""

    session_seal: ClassVar[SessionSeal]

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            request.state.ui_seal = self.session_seal  # set by ui_router's subclass
            try:
                response = await handler(request)
            except SignedOut as exc:
                response = _signed_out(request, exc)
            except CsrfRefused:
                response = _auth.refused_page(request)
            except RequestValidationError:
                response = _error_page(
                    request, 400, "This address has a value the page cannot take."
                )
            except ShamalError as exc:
                response = _error_page(request, exc.status, exc.message)
            for name, value in SECURITY_HEADERS.items():
                response.headers.setdefault(name, value)
            return response

        return route


def ui_router(keys_dir: Path) -> APIRouter:
    """The web UI's routes, to include in the server's app.

    Args:
        keys_dir: the server's keys folder; the session cookies' key is kept there
            (``ui-session.key``, made 0600 on first use, shared by the server's workers).
    """
    seal = SessionSeal.from_keys_dir(keys_dir)
    route_class = type("SealedUIRoute", (UIRoute,), {"session_seal": seal})
    router = APIRouter(route_class=route_class, include_in_schema=False)
    get = ["GET"]
    router.add_api_route("/", _pages.home, methods=get)
    router.add_api_route("/ui/sign-in", _auth.sign_in_page, methods=get)
    router.add_api_route("/ui/sign-in", _auth.sign_in, methods=["POST"])
    router.add_api_route("/ui/sign-out", _auth.sign_out, methods=["POST"])
    router.add_api_route("/ui/static/{name}", _auth.static, methods=get)
    router.add_api_route(
        "/ui/api/runs/{run_id}/metrics/{key:path}", _series.metric_series, methods=get
    )
    routes = [route for module in PAGE_MODULES for route in module.ROUTES]
    # Fixed paths first: /ui/jobs/usage must win over /ui/jobs/{job_id}, whichever module
    # declares which (the sort is stable, so each module's own order stays).
    for route in sorted(routes, key=lambda r: "{" in r.path):
        router.add_api_route(route.path, route.endpoint, methods=list(route.methods))
    return router
