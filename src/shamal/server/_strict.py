"""Strict reading of requests: query parameters a route does not declare (a typo should fail,
not be ignored), JSON strings no store can hold, and paths with repeated slashes."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from types import UnionType
from typing import Any, Union, get_args, get_origin
from urllib.parse import quote

from fastapi import Request
from starlette.responses import RedirectResponse
from starlette.routing import Match, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shamal.errors import InvalidParameter
from shamal.mlflow import is_mlflow_path
from shamal.server._errors import error_response
from shamal.webui import STOCK_UI_PATH


def _takes_many(annotation: Any) -> bool:
    origin = get_origin(annotation)
    if origin in (list, tuple, set, frozenset):
        return True
    if origin in (Union, UnionType):
        return any(_takes_many(arg) for arg in get_args(annotation))
    return False


def _declared_query(dependant: Any) -> tuple[frozenset[str], frozenset[str]]:
    """(every query parameter the route takes, those that take several values)."""
    # A handful of dependencies per route: cheaper to walk than to cache by identity.
    names: set[str] = set()
    many: set[str] = set()
    stack = [dependant]
    while stack:
        current = stack.pop()
        for param in current.query_params:
            names.add(param.alias)
            if _takes_many(param.field_info.annotation):
                many.add(param.alias)
        stack.extend(current.dependencies)
    return frozenset(names), frozenset(many)


async def reject_unknown_query(request: Request) -> None:
    """App-wide dependency: 400 for any query parameter the matched route does not take.

    ``async`` although it awaits nothing: FastAPI runs a plain-def dependency in a worker
    thread, a round trip on every request.
    """
    path = request.url.path
    if not request.query_params or is_mlflow_path(path) or path.startswith(STOCK_UI_PATH):
        # The MLflow dialect reads GET fields from the query itself; MLflow's own UI's calls
        # are handed, query and all, to the route of their path, which checks them then.
        return
    dependant = getattr(request.scope.get("route"), "dependant", None)
    if dependant is None:
        return
    declared, many = _declared_query(dependant)
    unknown = sorted(set(request.query_params) - declared)
    if unknown:
        shown = ", ".join(repr(k[:40]) for k in unknown[:3])
        raise InvalidParameter(f"unknown query parameter {shown}")
    repeated = sorted(
        key
        for key in set(request.query_params) - many
        if len(request.query_params.getlist(key)) > 1
    )
    if repeated:
        raise InvalidParameter(f"query parameter {repeated[0][:40]!r} may be given only once")


#: A JSON escape of a UTF-16 surrogate (``\ud800``..``\udfff``), the only way one can reach a
#: parsed string: raw bytes of a surrogate are not UTF-8 and fail to parse anyway.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE = re.compile("[\ud800-\udfff]")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _holds_lone_surrogate(body: bytes) -> bool:
    """Whether ``body`` is JSON with a string (or key) holding a lone surrogate.

    Escaped pairs (``\\ud83d\\ude00``) decode to one character and pass. A body that is not
    JSON is the route's to refuse.
    """
    if _SURROGATE_ESCAPE.search(body) is None:
        return False
    try:
        stack: list[Any] = [json.loads(body)]
    except (ValueError, RecursionError):
        return False
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value) is not None:
                return True
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False


class RejectLoneSurrogates:
    """400 for a JSON body that holds a lone UTF-16 surrogate (``"\\ud800"``), on every route.

    Python's ``json`` reads such strings, but nothing can store or encode them as UTF-8: the
    database drivers and encoders raise deep inside a route (a 500). Checked once here, before
    routing, so every route (the MLflow dialect reads its bodies itself) answers alike. The
    body is read whole (the guard around this caps it) and handed on; the routes under
    ``skip_prefixes`` stream binary bodies and are left alone.
    """

    def __init__(self, app: ASGIApp, *, skip_prefixes: Sequence[str] = ()) -> None:
        self.app = app
        self.skip_prefixes = tuple(skip_prefixes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] not in _BODY_METHODS
            or scope["path"].startswith(self.skip_prefixes)
        ):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if _holds_lone_surrogate(body):
            problem = InvalidParameter("the JSON body holds a lone UTF-16 surrogate (\\ud800)")
            await error_response(problem, path=scope["path"])(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


_SLASHES = re.compile("/{2,}")
#: What a redirect's ``Location`` keeps as it is; everything else (``\``, spaces...) is
#: percent-encoded, so no browser reads the target as another host (``/\host``).
_LOCATION_SAFE = "/:@!$&'()*+,;=-._~"


def redirect_merged_slashes(router: Router) -> None:
    """Answer a path with repeated slashes as a stock server (Werkzeug's routing) does.

    A path that matches no route as written (``//model-versions/get-artifact``) but matches
    one once its slashes are merged gets a 308 to the merged path, its query kept; the
    client sends the request again there, and that route's own checks (``Invalid path``
    for a path that climbs out) answer it. Paths that match no route either way answer as
    before. The target is always one path on this server (one leading slash).
    """
    not_found = router.default

    async def merged_or_not_found(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and "//" in path:
            merged = _SLASHES.sub("/", path)
            probe = {**scope, "path": merged}
            if any(route.matches(probe)[0] is not Match.NONE for route in router.routes):
                query = scope.get("query_string", b"").decode("latin-1")
                location = quote(merged, safe=_LOCATION_SAFE) + (f"?{query}" if query else "")
                await RedirectResponse(location, status_code=308)(scope, receive, send)
                return
        await not_found(scope, receive, send)

    router.default = merged_or_not_found
