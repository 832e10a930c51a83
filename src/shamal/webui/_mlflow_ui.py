"""MLflow's own UI under ``/mlflow/``, behind Shamal's sign-in, when the ``mlflow`` package
(the ``mlflow-ui`` extra) is installed.

The built UI is served from the installed package, never copied: ``/mlflow/`` is its
``index.html`` and ``/mlflow/static-files/...`` its scripts, styles and pictures. The UI
calls the server with addresses relative to its page (``ajax-api/2.0/mlflow/runs/search``,
``graphql``, ``get-artifact``), so its calls arrive under ``/mlflow/`` carrying the session
cookie: each is handed to the server's own route of the same path, as if it came with the
session's token, so it meets the same routes, roles, team scopes, limits and audit as the
stock client's calls. Nothing but those calls is handed on.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import Request
from starlette.responses import FileResponse, Response
from starlette.types import Message, Receive, Scope, Send

from shamal.errors import NotFound
from shamal.security import Principal
from shamal.webui._common import STOCK_UI_PATH, Route, stock_ui
from shamal.webui._render import SECURITY_HEADERS, redirect
from shamal.webui._session import SESSION_COOKIE, SameOrigin, SessionPrincipal, session_seal

#: MLflow's UI styles itself at run time (CSS-in-JS puts ``<style>`` elements in the page),
#: loads its charts' workers from ``blob:`` addresses and draws pictures from ``data:``
#: ones; everything else stays as strict as Shamal's own pages: only this server's scripts.
STOCK_UI_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; "
    "worker-src 'self' blob:; frame-src 'self' blob:; form-action 'self'; base-uri 'self'; "
    "frame-ancestors 'none'"
)
_HEADERS = {**SECURITY_HEADERS, "Content-Security-Policy": STOCK_UI_POLICY}
#: The server calls MLflow's UI makes, by the path after ``/mlflow/``.
FORWARDED_PREFIXES = ("ajax-api/",)
FORWARDED_PATHS = frozenset({"graphql", "get-artifact", "model-versions/get-artifact"})
_STATIC = "static-files/"


def _build(request: Request) -> Path:
    build = stock_ui(request)
    if build is None:
        raise NotFound(
            "MLflow's own UI is not served here: it needs the mlflow-ui extra installed "
            "(pip install 'shamal[mlflow-ui]') and SHAMAL_MLFLOW_UI left on. Shamal's UI is "
            "at /ui/."
        )
    return build


async def stock_ui_home(principal: SessionPrincipal) -> Response:
    """``/mlflow``: to ``/mlflow/``, where the UI's relative addresses resolve."""
    return redirect(STOCK_UI_PATH)


async def stock_ui_page(request: Request, principal: SessionPrincipal) -> Response:
    """``/mlflow/``: MLflow's UI, for a signed-in person (signed out: the sign-in form,
    which comes back here with the UI's own route, the part after ``#``)."""
    index = _build(request) / "index.html"
    return FileResponse(index, media_type="text/html", headers=_HEADERS | _NO_STORE)


_NO_STORE = {"Cache-Control": "no-store"}
_IMMUTABLE = {"Cache-Control": "public, max-age=2419200, immutable"}


async def stock_ui_file(request: Request, path: str) -> Response:
    """``/mlflow/static-files/<path>``: a file of the built UI (its scripts are MLflow's
    public release, so they need no session, as Shamal's own ``/ui/static/`` files)."""
    build = _build(request).resolve()
    parts = path.split("/")
    if not path or any(p in ("", ".", "..") or "\\" in p for p in parts):
        raise NotFound("no such file")
    found = build.joinpath(*parts).resolve()
    if not found.is_relative_to(build) or not found.is_file():
        raise NotFound("no such file")
    return FileResponse(found, headers=_HEADERS | _IMMUTABLE)


async def stock_ui_read(request: Request, path: str, principal: SessionPrincipal) -> Response:
    """A call of MLflow's UI that reads (GET): answered by the server's own route."""
    return _forward(request, path, principal)


async def stock_ui_write(request: Request, path: str, principal: SameOrigin) -> Response:
    """A call of MLflow's UI that changes something: the same, once the browser has said
    that it comes from this site (see :func:`same_origin_protected`)."""
    return _forward(request, path, principal)


def _forward(request: Request, path: str, principal: Principal) -> Response:
    if not (path.startswith(FORWARDED_PREFIXES) or path in FORWARDED_PATHS):
        raise NotFound("no such page")
    _build(request)
    token = session_seal(request).open(request.cookies.get(SESSION_COOKIE, ""))
    if token is None:  # session_principal opened it a moment ago
        raise NotFound("no such page")
    return _Forwarded(token)


class _Forwarded(Response):
    """Answers by calling the app again with the path less ``/mlflow``, the session's token
    as the bearer and no cookie: the server's route of that path answers."""

    def __init__(self, token: str) -> None:
        super().__init__()
        self._token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        prefix = STOCK_UI_PATH.rstrip("/")
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
        headers = [
            (name, value)
            for name, value in scope["headers"]
            if name not in (b"authorization", b"cookie")
        ]
        headers.append((b"authorization", b"Bearer " + self._token.encode()))
        # What routing put on the scope is left behind: the app routes the call afresh.
        inner = {
            key: value
            for key, value in scope.items()
            if key not in ("route", "endpoint", "path_params") and not key.startswith("fastapi")
        }
        inner.update(
            path=scope["path"].removeprefix(prefix),
            raw_path=raw_path.removeprefix(prefix.encode()),
            headers=headers,
            state=dict(scope.get("state", {})),
        )
        await scope["app"](inner, receive, _with_headers(send))


#: Added to every answer handed back (the API's own answers do not carry them): a file the
#: UI reads is never sniffed into a page, and no address leaks to another site.
_FORWARDED_HEADERS = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"same-origin")]


def _with_headers(send: Send) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            present = {name.lower() for name, _ in message.get("headers", [])}
            extra = [(n, v) for n, v in _FORWARDED_HEADERS if n not in present]
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return sending


ROUTES = [
    Route("/mlflow", stock_ui_home),
    Route(STOCK_UI_PATH, stock_ui_page),
    Route(f"{STOCK_UI_PATH}{_STATIC}{{path:path}}", stock_ui_file),
    Route(f"{STOCK_UI_PATH}{{path:path}}", stock_ui_read),
    Route(f"{STOCK_UI_PATH}{{path:path}}", stock_ui_write, ("POST", "PUT", "PATCH", "DELETE")),
]
