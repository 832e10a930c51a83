"""The web UI: server-rendered pages over the same services, roles and team scopes as the API.

Pages are Jinja2 templates rendered on the server (autoescaped), with small ES modules and
one style sheet shipped in this package: no build step, no CDN, no inline script or style
(the Content-Security-Policy forbids them). A person signs in with an API token, which a
sealed, HttpOnly, SameSite=Strict cookie carries and every request re-authenticates.
With the ``mlflow-ui`` extra installed, MLflow's own built UI answers under ``/mlflow/``
behind the same sign-in (``_mlflow_ui``).
"""

from __future__ import annotations

from shamal.webui._common import STOCK_UI_PATH, stock_ui_build
from shamal.webui._downsample import bucket_edges, downsample
from shamal.webui._render import CONTENT_SECURITY_POLICY, SECURITY_HEADERS
from shamal.webui._router import PUBLIC_ROUTES, UIRoute, ui_router
from shamal.webui._seal import SessionSeal
from shamal.webui._session import (
    CSRF_FIELD,
    SESSION_COOKIE,
    csrf_protected,
    same_origin_protected,
    session_principal,
)

__all__ = [
    "CONTENT_SECURITY_POLICY",
    "CSRF_FIELD",
    "PUBLIC_ROUTES",
    "SECURITY_HEADERS",
    "SESSION_COOKIE",
    "STOCK_UI_PATH",
    "SessionSeal",
    "UIRoute",
    "bucket_edges",
    "csrf_protected",
    "downsample",
    "same_origin_protected",
    "session_principal",
    "stock_ui_build",
    "ui_router",
]
