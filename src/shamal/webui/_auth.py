"""Signing in and out, the home page the MLflow client's links land on, static files."""

from __future__ import annotations

import contextlib
import logging
import re
from datetime import timedelta
from typing import Annotated

from fastapi import Form, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import RedirectResponse, Response

from shamal.errors import NotFound, Unauthenticated
from shamal.security import AuditContext, AuditLog
from shamal.webui._common import STOCK_UI_PATH, mlflow_link_target
from shamal.webui._render import page, redirect, static_file
from shamal.webui._seal import SESSION_MAX_AGE_S, new_nonce
from shamal.webui._session import (
    SESSION_COOKIE,
    SIGN_IN_COOKIE,
    CsrfChecked,
    may_sign_in,
    principal_of_token,
    safe_return_path,
    security_of,
    session_seal,
)

logger = logging.getLogger(__name__)

_SIGN_IN_PATH = "/ui/sign-in"
#: A route of MLflow's own UI kept across signing in (``/mlflow/#/models/m1``): its
#: address is a fragment of plain path characters.
_STOCK_UI_ROUTE = re.compile(r"^#/[A-Za-z0-9/_.~%-]{0,300}$")


def after_sign_in(request: Request, next_path: str, fragment: str) -> str:
    """Where signing in leads: the page of an MLflow link's fragment; MLflow's own UI at
    the route its address named, when that is where the person was going; else ``next``,
    when it is one of the UI's own pages."""
    target = mlflow_link_target(request, fragment)
    if target is not None:
        return target
    back = safe_return_path(next_path)
    if back == STOCK_UI_PATH and _STOCK_UI_ROUTE.match(fragment or ""):
        return back + fragment
    return back


def _set_cookie(response: Response, request: Request, name: str, value: str, max_age: int) -> None:
    """HttpOnly, SameSite=Strict, Path=/; Secure when the page came over https. A
    ``max_age`` of 0 clears the cookie."""
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path="/",
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )


def sign_out_response(request: Request, return_to: str = "") -> RedirectResponse:
    """To the sign-in form, the session cookie cleared."""
    target = _SIGN_IN_PATH
    if return_to and safe_return_path(return_to) == return_to:
        target += f"?next={return_to}"
    response = redirect(target)
    _set_cookie(response, request, SESSION_COOKIE, "", 0)
    return response


def sign_in_page(
    request: Request,
    next_path: Annotated[str | None, Query(alias="next", max_length=320)] = None,
) -> Response:
    """The sign-in form: a token field, and the fragment of an MLflow link kept by script."""
    return sign_in_form(request, next_path)


def sign_in_form(
    request: Request, next_path: str | None, error: str = "", status_code: int = 200
) -> Response:
    nonce = new_nonce()
    context = {
        "title": "Sign in",
        "principal": None,
        "csrf": session_seal(request).csrf_token(nonce),
        "next": safe_return_path(next_path) if next_path else "",
        "error": error,
    }
    response = page("sign_in.html", context, status_code)
    _set_cookie(response, request, SIGN_IN_COOKIE, nonce, 3600)
    return response


async def sign_in(
    request: Request,
    token: Annotated[str, Form(max_length=512)] = "",
    csrf: Annotated[str, Form(max_length=128)] = "",
    next_path: Annotated[str, Form(alias="next", max_length=320)] = "",
    fragment: Annotated[str, Form(max_length=320)] = "",
    once: Annotated[str, Form(max_length=128)] = "",
) -> Response:
    """Check the token with the security service and open a session with it; or, with
    ``once``, use a one-time sign-in link's code, which opens a session with a new token
    of the link's user.

    A wrong form token answers 403; a token or link that is not accepted, the form again
    with a 401. Both outcomes are audited (``ui.sign_in``).
    """
    seal = session_seal(request)
    if not seal.csrf_valid(request.cookies.get(SIGN_IN_COOKIE, ""), csrf):
        return refused_page(request)
    principal = None
    message = (
        "That token was not accepted: it is unknown, expired or revoked, or not a personal token."
    )
    with contextlib.suppress(Unauthenticated):
        if once:
            token = await _redeem(request, once.strip())
        principal = await principal_of_token(request, token.strip())
    audit: AuditLog = request.app.state.audit
    if principal is None or not may_sign_in(principal):
        ctx = AuditContext(action="ui.sign_in", actor="anonymous", target="ui")
        await run_in_threadpool(audit.record_outcome, ctx, "unauthenticated")
        if once:
            message = (
                "That sign-in link was used already or has expired. Sign in with a token "
                "(the admin's is in SHAMAL_HOME/token)."
            )
        return sign_in_form(request, next_path or None, message, 401)
    ctx = AuditContext(action="ui.sign_in", actor=principal.name, principal=principal, target="ui")
    await run_in_threadpool(audit.record_outcome, ctx, "ok")
    target = after_sign_in(request, next_path, fragment)
    response = redirect(target)
    _set_cookie(response, request, SESSION_COOKIE, seal.seal(token.strip()), SESSION_MAX_AGE_S)
    _set_cookie(response, request, SIGN_IN_COOKIE, "", 0)
    return response


async def _redeem(request: Request, code: str) -> str:
    """The secret of the new token a one-time link's ``code`` gives.

    Raises:
        Unauthenticated: the link is unknown, expired or used.
    """
    issued = await run_in_threadpool(
        security_of(request).redeem_sign_in_link, code, timedelta(seconds=SESSION_MAX_AGE_S)
    )
    return issued.secret


async def sign_out(request: Request, principal: CsrfChecked) -> Response:
    """Forget the session in this browser (the token itself stays valid: revoke it with
    ``shamal tokens revoke`` to end every session made with it)."""
    logger.info("%s signed out of the web UI", principal.name)
    return sign_out_response(request)


def refused_page(request: Request) -> Response:
    """403: a form posted without its synchronizer token (or a stale one)."""
    context = {
        "title": "Form refused",
        "principal": getattr(request.state, "principal", None),
        "csrf": "",
        "message": (
            "This form was refused: it did not carry the security token of your session, "
            "so it may not have come from this site. Go back, reload the page and try again."
        ),
    }
    return page("error.html", context, 403)


def static(name: str) -> Response:
    found = static_file(name)
    if found is None:
        raise NotFound("no such file")
    return found
