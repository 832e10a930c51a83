"""The web UI: server-rendered pages over the same services, roles and team scopes as the API.

Pages are Jinja2 templates rendered on the server (autoescaped), with small ES modules and
one style sheet shipped in this package: no build step, no CDN, no inline script or style
(the Content-Security-Policy forbids them). A person signs in with an API token, which a
sealed, HttpOnly, SameSite=Strict cookie carries and every request re-authenticates.
"""

from __future__ import annotations

from shamal.webui._downsample import bucket_edges, downsample
from shamal.webui._render import CONTENT_SECURITY_POLICY, SECURITY_HEADERS
from shamal.webui._router import PUBLIC_ROUTES, UIRoute, ui_router
from shamal.webui._seal import SessionSeal
from shamal.webui._session import (
    CSRF_FIELD,
    SESSION_COOKIE,
    csrf_protected,
    session_principal,
)

__all__ = [
    "CONTENT_SECURITY_POLICY",
    "CSRF_FIELD",
    "PUBLIC_ROUTES",
    "SECURITY_HEADERS",
    "SESSION_COOKIE",
    "SessionSeal",
    "UIRoute",
    "bucket_edges",
    "csrf_protected",
    "downsample",
    "session_principal",
    "ui_router",
]
