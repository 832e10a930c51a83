"""The one error path: every failure becomes a JSON body with a stable code."""

from __future__ import annotations

import logging
import math

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from shamal.errors import (
    EndpointNotFound,
    InternalError,
    InvalidParameter,
    ShamalError,
    Unauthenticated,
)
from shamal.mlflow import is_mlflow_path, mlflow_status

logger = logging.getLogger(__name__)


def error_response(
    exc: ShamalError, headers: dict[str, str] | None = None, *, path: str = ""
) -> JSONResponse:
    """The one error answer. Under the MLflow dialect's prefixes, MLflow's status mapping."""
    all_headers = dict(headers or {})
    if isinstance(exc, Unauthenticated):
        all_headers.setdefault("WWW-Authenticate", 'Bearer realm="shamal"')
    status = mlflow_status(exc) if is_mlflow_path(path) else exc.status
    return JSONResponse(exc.to_body(), status_code=status, headers=all_headers)


def _describe_validation(exc: RequestValidationError) -> str:
    # Locations and reasons only: echoing the input could reflect secrets or CRLF.
    parts = []
    for error in exc.errors()[:5]:
        location = ".".join(str(p) for p in error.get("loc", ()) if p != "body") or "body"
        parts.append(f"{location}: {error.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


async def _on_shamal_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ShamalError)
    if exc.status >= 500:
        logger.error("request failed: %s (%s)", exc.code, exc.message)
    retry_after_s = getattr(exc, "retry_after_s", None)
    headers = None if retry_after_s is None else {"Retry-After": str(math.ceil(retry_after_s))}
    return error_response(exc, headers, path=request.url.path)


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return error_response(InvalidParameter(_describe_validation(exc)), path=request.url.path)


async def _on_http_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 404:
        return error_response(EndpointNotFound("no such endpoint; see /docs for the API"))
    if exc.status_code == 405:
        body = {"error_code": "ENDPOINT_NOT_FOUND", "message": "method not allowed here"}
        return JSONResponse(body, status_code=405, headers=dict(exc.headers or {}))
    if exc.status_code >= 500:
        return error_response(InternalError("internal error"))
    body = {"error_code": "INVALID_PARAMETER_VALUE", "message": "bad request"}
    return JSONResponse(body, status_code=exc.status_code, headers=dict(exc.headers or {}))


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    logger.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(InternalError("internal error; the server log has the details"))


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ShamalError, _on_shamal_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(Exception, _on_unexpected)
