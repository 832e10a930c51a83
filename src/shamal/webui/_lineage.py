"""The lineage page: the graph around an object (a dataset version, a run, a model, a
deployment), drawn as a layered picture and listed as plain tables beside it.

The lineage service walks it with the signed-in principal, as the API does: the start must
be the person's to read (else 404), and an object they may not read that a readable one
names is shown redacted: its kind only, never its name or id.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import quote, urlencode

from fastapi import Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from shamal.errors import InvalidParameter
from shamal.lineage import (
    DEFAULT_DEPTH,
    MAX_DEPTH,
    MAX_URI,
    Direction,
    Lineage,
    LineageService,
    Node,
    NodeKind,
)
from shamal.webui import _svg
from shamal.webui._common import Route, context, service_of
from shamal.webui._render import page
from shamal.webui._session import SessionPrincipal

#: The ways the page takes, each as the service names it (``upstream`` reads better in a
#: link; ``up`` is what the API takes).
_WAYS = {
    "up": Direction.UP,
    "upstream": Direction.UP,
    "down": Direction.DOWN,
    "downstream": Direction.DOWN,
    "both": Direction.BOTH,
}
_STATE = {
    NodeKind.SOURCE: "source",
    NodeKind.DATASET_VERSION: "dataset",
    NodeKind.INPUT: "input",
    NodeKind.RUN: "run",
    NodeKind.LOGGED_MODEL: "logged-model",
    NodeKind.MODEL_VERSION: "model-version",
    NodeKind.DEPLOYMENT: "deployment",
}
_KIND_TITLE = {
    NodeKind.SOURCE: "source",
    NodeKind.DATASET_VERSION: "dataset version",
    NodeKind.INPUT: "run input",
    NodeKind.RUN: "run",
    NodeKind.LOGGED_MODEL: "logged model",
    NodeKind.MODEL_VERSION: "model version",
    NodeKind.DEPLOYMENT: "deployment",
}
_DATASET = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
_DEPLOYMENT = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_RUN_URI = re.compile(r"^runs:/([0-9a-f]{32})$")
_EXPERIMENT = re.compile(r"^[0-9]{1,18}$")
#: Attributes listed for a node in the table (the rest stay in the API's answer).
_SHOWN = (
    "status",
    "rows",
    "digest",
    "phase",
    "revision",
    "stage",
    "team",
    "user",
    "kind",
    "format",
)


def _lineage(request: Request) -> LineageService:
    return service_of(request, "lineage", LineageService)


def _version(raw: Any) -> int | None:
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 1 else None


def _lineage_href(uri: str) -> str:
    return "/ui/lineage?" + urlencode({"uri": uri})


def _data_href(attributes: Any) -> str:
    name, number = attributes.get("dataset"), _version(attributes.get("version"))
    if isinstance(name, str) and _DATASET.match(name) and number:
        return f"/ui/datasets/{name}/versions/{number}"
    return ""


def _run_href(node: Node) -> str:
    found = _RUN_URI.match(node.id)
    experiment = str(node.attributes.get("experiment_id", ""))
    if found and _EXPERIMENT.match(experiment):
        return f"/ui/experiments/{experiment}/runs/{found.group(1)}"
    return _lineage_href(node.id) if found else ""


def _model_href(attributes: Any) -> str:
    name, number = attributes.get("model"), _version(attributes.get("version"))
    if isinstance(name, str) and name and number:
        return f"/ui/models/{quote(name, safe='')}/versions/{number}"
    return ""


def _deployment_href(node: Node) -> str:
    name = node.id.removeprefix("deployments:/")
    return f"/ui/deployments/{name}" if _DEPLOYMENT.match(name) else ""


#: Each kind's page; a kind left out (a run's input that is not a dataset) has none.
_PAGES: dict[NodeKind, Callable[[Node], str]] = {
    NodeKind.DATASET_VERSION: lambda n: _data_href(n.attributes) or _lineage_href(n.id),
    NodeKind.RUN: _run_href,
    NodeKind.MODEL_VERSION: lambda n: _model_href(n.attributes) or _lineage_href(n.id),
    NodeKind.DEPLOYMENT: _deployment_href,
    NodeKind.SOURCE: lambda n: _lineage_href(n.id),
    NodeKind.LOGGED_MODEL: lambda n: _lineage_href(n.id),
}


def href_of(node: Node) -> str:
    """The UI page of ``node``: its own page where the UI has one, else the lineage page
    around it; empty for a redacted node or one lineage cannot start from."""
    found = _PAGES.get(node.kind)
    return "" if node.redacted or found is None else found(node)


@dataclass(frozen=True)
class NodeRow:
    """A node as the page lists it (a redacted one keeps only its kind)."""

    key: str
    kind: str
    label: str
    uri: str
    href: str
    lineage_href: str
    facts: list[tuple[str, str]]
    redacted: bool
    start: bool


def _label(node: Node) -> str:
    if node.redacted:
        return f"hidden {_KIND_TITLE[node.kind]}"
    if node.kind is NodeKind.DATASET_VERSION:
        name, number = node.attributes.get("dataset"), _version(node.attributes.get("version"))
        if isinstance(name, str) and number:
            return f"{name} v{number}"
    return node.label or node.id


def _fact(key: str, value: Any) -> str:
    """An attribute as the tables show it: a digest cut to 12 characters (its title in the
    version's page holds it whole)."""
    text = str(value)
    return text.removeprefix("sha256:")[:12] if "digest" in key and len(text) > 12 else text


def _facts(node: Node) -> list[tuple[str, str]]:
    if node.redacted:
        return []
    shown = [(k, node.attributes.get(k)) for k in _SHOWN]
    return [
        (k, _fact(k, v))
        for k, v in shown
        if isinstance(v, str | int | float) and v not in ("", "None")
    ]


def _rows(graph: Lineage) -> list[NodeRow]:
    rows = []
    for node in graph.nodes:
        own = href_of(node)
        walkable = not node.redacted and node.kind is not NodeKind.INPUT
        rows.append(
            NodeRow(
                key=node.id,
                kind=_KIND_TITLE[node.kind],
                label=_label(node),
                uri="" if node.redacted else node.id,
                href=own,
                lineage_href=_lineage_href(node.id) if walkable else "",
                facts=_facts(node),
                redacted=node.redacted,
                start=node.id == graph.start,
            )
        )
    return rows


def _edge_rows(graph: Lineage, labels: dict[str, str]) -> list[tuple[str, str, str, str]]:
    """(from, to, relation, details) of each edge, the ends named as the node table names
    them."""
    rows = []
    for edge in graph.edges:
        facts = [
            f"{k}={_fact(k, v)}"
            for k, v in sorted(edge.attributes.items())
            if isinstance(v, str | int | float | bool) and v != ""
        ]
        rows.append(
            (
                labels.get(edge.source, ""),
                labels.get(edge.target, ""),
                edge.relation,
                ", ".join(facts),
            )
        )
    return rows


def _picture(graph: Lineage, rows: list[NodeRow]) -> Any:
    kinds = {n.id: n for n in graph.nodes}
    boxes = [
        _svg.Node(
            id=row.key,
            label=row.label,
            state="redacted" if row.redacted else _STATE[kinds[row.key].kind],
            href=row.href,
            detail="start" if row.start else row.uri,
        )
        for row in rows
    ]
    edges = [(e.source, e.target) for e in graph.edges]
    return _svg.dag(boxes, edges, f"Lineage of {graph.start}")


async def lineage_page(
    request: Request,
    principal: SessionPrincipal,
    uri: Annotated[str, Query(max_length=MAX_URI)] = "",
    direction: Annotated[str, Query(pattern="^(" + "|".join(_WAYS) + ")$")] = "both",
    depth: Annotated[int, Query(ge=1, le=MAX_DEPTH)] = DEFAULT_DEPTH,
) -> Response:
    """The lineage graph around ``uri``, ``depth`` hops upstream, downstream or both. A URI
    the service does not take answers 400 with the form to correct it."""
    graph: Lineage | None = None
    error = ""
    if uri:
        svc = _lineage(request)
        try:
            graph = await run_in_threadpool(
                lambda: svc.lineage(principal, uri, direction=_WAYS[direction], depth=depth)
            )
        except InvalidParameter as exc:
            error = exc.message
    rows = _rows(graph) if graph is not None else []
    labels = {row.key: row.label for row in rows}
    values = context(
        request,
        principal,
        "Lineage",
        uri=uri,
        direction=_WAYS[direction].value,
        depth=depth,
        max_depth=MAX_DEPTH,
        graph=graph,
        rows=rows,
        edges=_edge_rows(graph, labels) if graph is not None else [],
        picture=_picture(graph, rows) if graph is not None and rows else None,
        error=error,
    )
    return page("lineage.html", values, 400 if error else 200)


ROUTES = [Route("/ui/lineage", lineage_page)]
