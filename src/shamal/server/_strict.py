"""Reject query parameters a route does not declare: a typo should fail, not be ignored."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from shamal.errors import InvalidParameter
from shamal.mlflow_dialect import is_mlflow_path


def _declared_query(dependant: Any) -> frozenset[str]:
    # A handful of dependencies per route: cheaper to walk than to cache by identity.
    names: set[str] = set()
    stack = [dependant]
    while stack:
        current = stack.pop()
        names.update(p.alias for p in current.query_params)
        stack.extend(current.dependencies)
    return frozenset(names)


def reject_unknown_query(request: Request) -> None:
    """App-wide dependency: 400 for any query parameter the matched route does not take."""
    if not request.query_params or is_mlflow_path(request.url.path):
        return  # the MLflow dialect reads GET fields from the query itself
    dependant = getattr(request.scope.get("route"), "dependant", None)
    if dependant is None:
        return
    unknown = sorted(set(request.query_params) - _declared_query(dependant))
    if unknown:
        shown = ", ".join(repr(k[:40]) for k in unknown[:3])
        raise InvalidParameter(f"unknown query parameter {shown}")
