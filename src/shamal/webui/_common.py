"""What every page module shares: its routes' shape, the services on the app, a page's
context and whether the signed-in principal may see a write control."""

from __future__ import annotations

import functools
import importlib.util
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from fastapi import Request

from shamal.security import Principal, Role
from shamal.webui._session import csrf_of

T = TypeVar("T")


@dataclass(frozen=True)
class Route:
    """One route of a page module: ``_router`` adds every module's ``ROUTES``."""

    path: str
    endpoint: Callable[..., Any]
    methods: Sequence[str] = ("GET",)


def service_of(request: Request, name: str, kind: type[T]) -> T:
    """The service the server put on ``app.state`` as ``name`` (the same object the API's
    routes call).

    Raises:
        TypeError: ``app.state.name`` is not a ``kind`` (a wiring mistake, never user input).
    """
    found = getattr(request.app.state, name)
    if not isinstance(found, kind):
        raise TypeError(f"app.state.{name} is not a {kind.__name__}")
    return found


def context(request: Request, principal: Principal, title: str, **values: Any) -> dict[str, Any]:
    """A page's template context: its title, who is signed in, the forms' CSRF token and
    ``values``."""
    return {"title": title, "principal": principal, "csrf": csrf_of(request), **values}


def may_write(principal: Principal, team: str | None, needed: Role = Role.MEMBER) -> bool:
    """Whether to show ``principal`` a write control on an object of ``team`` (None: open to
    every account). Only what to draw: the service still checks the role when the form is
    posted, so a hidden control is never the only guard."""
    if principal.user.is_admin or team is None:
        return True
    role = principal.roles.get(team)
    return role is not None and role >= needed


#: Where MLflow's own UI answers, when the ``mlflow`` package (the ``mlflow-ui`` extra) is
#: installed: ``shamal.webui._mlflow_ui``.
STOCK_UI_PATH = "/mlflow/"


@functools.cache
def stock_ui_build() -> Path | None:
    """The folder of MLflow's built UI inside the installed ``mlflow`` package (its
    ``index.html`` and ``static-files``), or None when only ``mlflow-skinny`` (or no MLflow)
    is installed. Found without importing MLflow."""
    try:
        spec = importlib.util.find_spec("mlflow")
    except (ImportError, ValueError):  # a finder that refuses it: not installed here
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        build = Path(location) / "server" / "js" / "build"
        if (build / "index.html").is_file():
            return build
    return None


def stock_ui(request: Request) -> Path | None:
    """MLflow's built UI when this server serves it: installed, and not turned off
    (``SHAMAL_MLFLOW_UI=false``)."""
    if not getattr(request.app.state.settings, "mlflow_ui", True):
        return None
    return stock_ui_build()


def mlflow_link_target(request: Request, fragment: str) -> str | None:
    """Where an MLflow UI address (``#/experiments/1/runs/<id>``, what the stock client's
    "View run at" prints) opens: in MLflow's own UI when the server serves it, else the
    page of Shamal's UI that shows the same experiment or run; None for any other
    fragment."""
    found = _MLFLOW_FRAGMENT.match(fragment or "")
    if found is None:
        return None
    if stock_ui(request) is not None:
        return STOCK_UI_PATH + found.group(0).rstrip("/")
    experiment, run = found.groups()
    if run:
        return f"/ui/experiments/{experiment}/runs/{run}"
    return f"/ui/experiments/{experiment}"


#: The fragments the stock MLflow client prints ("View run at", "View experiment at").
_MLFLOW_FRAGMENT = re.compile(r"^#/experiments/([0-9]{1,18})(?:/runs/([0-9a-f]{32}))?/?$")
