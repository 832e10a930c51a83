"""Reject query parameters a route does not declare: a typo should fail, not be ignored."""

from __future__ import annotations

from types import UnionType
from typing import Any, Union, get_args, get_origin

from fastapi import Request

from shamal.errors import InvalidParameter
from shamal.mlflow_dialect import is_mlflow_path


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
    if not request.query_params or is_mlflow_path(request.url.path):
        return  # the MLflow dialect reads GET fields from the query itself
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
