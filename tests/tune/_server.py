"""`python -m tests.tune._server server ...`: the real `shamal server` with the tune
routes mounted, as the integrator wires them (until they are, in ``_app``/``_platform``).

When the app already serves the tune routes, nothing is added.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

import shamal.server._run as run
from shamal.cli import app as cli
from shamal.server import create_app as _create_app
from shamal.tune import api as tune_api
from shamal.tune._service import TuneService


def create_app(settings: Any, platform: Any = None) -> FastAPI:
    app = _create_app(settings, platform)
    if not any(getattr(r, "path", "") == "/api/v1/tune/studies" for r in app.routes):
        app.include_router(tune_api.router)
        app.state.tune = TuneService(
            platform.db, platform.audit, platform.settings.resolved_database_url
        )
    return app


if __name__ == "__main__":
    run.create_app = create_app  # type: ignore[attr-defined]
    cli()
