"""Who is signed in: the session cookie, opened and re-authenticated on every request,
and the CSRF check of every form posted."""

from __future__ import annotations

import logging
import re
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from shamal.errors import Unauthenticated
from shamal.security import Principal, SecurityService
from shamal.webui._seal import SessionSeal

logger = logging.getLogger(__name__)

SESSION_COOKIE = "shamal_session"
#: The sign-in form's pre-session cookie: its CSRF token is bound to this nonce.
SIGN_IN_COOKIE = "shamal_sign_in"
CSRF_FIELD = "csrf"
#: Where a person may be sent back to after signing in: the UI's own pages (and MLflow's
#: own UI, ``/mlflow/``), nothing else.
_RETURN_PATH = re.compile(r"^/(?:ui/[A-Za-z0-9/_.-]{0,300}|mlflow/)$")


class SignedOut(Exception):
    """No usable session: the page answers with a redirect to the sign-in form."""

    def __init__(self, return_to: str = "") -> None:
        super().__init__("signed out")
        self.return_to = return_to


class CsrfRefused(Exception):
    """A form posted without this session's synchronizer token: answered 403."""


def safe_return_path(path: str | None) -> str:
    """``path`` when it is one of the UI's own pages (no scheme, host, ``//`` or ``..``),
    else the experiments list."""
    if path and _RETURN_PATH.match(path) and "//" not in path and ".." not in path:
        return path
    return "/ui/experiments"


def session_seal(request: Request) -> SessionSeal:
    """The seal the UI's route put on the request (see ``UIRoute``)."""
    seal: SessionSeal = request.state.ui_seal
    return seal


def security_of(request: Request) -> SecurityService:
    service: SecurityService = request.app.state.security
    return service


def may_sign_in(principal: Principal) -> bool:
    """Only a person's or service's own token opens a session: a job's token or a
    deployment's is for machines, and does less than its account."""
    return principal.scope == "full"


async def principal_of_token(request: Request, token: str) -> Principal:
    """Authenticate ``token`` as the API does (cache first, then the database in a worker
    thread).

    Raises:
        Unauthenticated: malformed, unknown, expired or revoked; a disabled account.
    """
    security = security_of(request)
    principal = security.cached_principal(token)
    if principal is None:
        principal = await run_in_threadpool(security.authenticate, token)
    return principal


async def session_principal(request: Request) -> Principal:
    """The signed-in principal; a dependency of every page but the sign-in form.

    Raises:
        SignedOut: no cookie, one this server did not seal (or that was changed, or is too
            old), or one whose token no longer authenticates (revoked, expired, disabled).
    """
    return_to = request.url.path if request.method == "GET" else ""
    cookie = request.cookies.get(SESSION_COOKIE, "")
    token = session_seal(request).open(cookie) if cookie else None
    if token is None:
        raise SignedOut(return_to)
    try:
        principal = await principal_of_token(request, token)
    except Unauthenticated:
        logger.info("a session's token no longer authenticates: signed out")
        raise SignedOut(return_to) from None
    if not may_sign_in(principal):
        raise SignedOut(return_to)
    request.state.principal = principal
    request.state.ui_session = cookie
    return principal


SessionPrincipal = Annotated[Principal, Depends(session_principal)]


async def csrf_protected(request: Request, principal: SessionPrincipal) -> Principal:
    """A dependency of every form post of a signed-in page: the form carries this
    session's synchronizer token.

    Raises:
        CsrfRefused: it does not.
    """
    form = await request.form()
    sent = form.get(CSRF_FIELD)
    cookie = request.cookies.get(SESSION_COOKIE, "")
    if not isinstance(sent, str) or not session_seal(request).csrf_valid(cookie, sent):
        raise CsrfRefused
    return principal


CsrfChecked = Annotated[Principal, Depends(csrf_protected)]


async def same_origin_protected(request: Request, principal: SessionPrincipal) -> Principal:
    """A dependency of every state-changing call MLflow's own UI makes with the session
    cookie (``/mlflow/ajax-api/...``, ``/mlflow/graphql``): it has no form to carry a
    synchronizer token, so the browser must say the call came from this site. Its
    ``Origin`` names this host and, where it sends one, ``Sec-Fetch-Site`` is
    ``same-origin``; the cookie, SameSite=Strict, is not sent cross-site in the first place.

    Raises:
        CsrfRefused: no ``Origin``, another origin's, or a cross-site fetch.
    """
    origin = request.headers.get("origin", "")
    host = request.headers.get("host", "")
    site = request.headers.get("sec-fetch-site", "same-origin")
    if not host or urlsplit(origin).netloc != host or site != "same-origin":
        raise CsrfRefused
    return principal


def csrf_of(request: Request) -> str:
    """The synchronizer token the forms of this request's session carry."""
    return session_seal(request).csrf_token(request.cookies.get(SESSION_COOKIE, ""))


SameOrigin = Annotated[Principal, Depends(same_origin_protected)]
