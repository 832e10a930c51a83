"""Lineage: the graph across domains, from a source to a deployment.

``source:/customers/3`` -> ``data:/customers/3`` -> ``runs:/<id>`` (the runs that read it) ->
``models:/<logged model id>`` -> ``models:/fraud/2`` -> ``deployments:/fraud-api``, walked
upstream and downstream from any of them through each domain's public service, with the
caller's access (objects the caller may not read are left out, or shown redacted when a
readable one names them). Nothing is stored here: every edge is what a domain records.

The entities and URI rules load with the package; the service on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shamal import lazy
from shamal.lineage._entities import Direction, Edge, Lineage, Node, NodeKind
from shamal.lineage._uris import MAX_URI, NodeRef, parse_uri

if TYPE_CHECKING:
    from shamal.lineage._service import (
        DEFAULT_DEPTH,
        DEFAULT_NODES,
        MAX_DEPTH,
        MAX_FANOUT,
        MAX_NODES,
        LineageService,
    )

_WHERE: dict[str, tuple[str, str | None]] = {
    "DEFAULT_DEPTH": ("_service", "DEFAULT_DEPTH"),
    "DEFAULT_NODES": ("_service", "DEFAULT_NODES"),
    "LineageService": ("_service", "LineageService"),
    "MAX_DEPTH": ("_service", "MAX_DEPTH"),
    "MAX_FANOUT": ("_service", "MAX_FANOUT"),
    "MAX_NODES": ("_service", "MAX_NODES"),
}

__all__ = [
    "DEFAULT_DEPTH",
    "DEFAULT_NODES",
    "MAX_DEPTH",
    "MAX_FANOUT",
    "MAX_NODES",
    "MAX_URI",
    "Direction",
    "Edge",
    "Lineage",
    "LineageService",
    "Node",
    "NodeKind",
    "NodeRef",
    "parse_uri",
]


def __getattr__(name: str) -> Any:
    return lazy.attribute(__name__, _WHERE, name, globals())
