"""What every page module shares: its routes' shape, the services on the app, a page's
context and whether the signed-in principal may see a write control."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
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
