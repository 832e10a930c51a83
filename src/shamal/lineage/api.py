"""Native HTTP API of lineage: ``GET /api/v1/lineage?uri=...&direction=both&depth=6``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel

from shamal.api import ERROR_RESPONSES
from shamal.lineage._entities import Direction
from shamal.lineage._service import (
    DEFAULT_DEPTH,
    DEFAULT_NODES,
    MAX_DEPTH,
    MAX_NODES,
    LineageService,
)
from shamal.lineage._uris import MAX_URI
from shamal.security.api import CurrentPrincipal

router = APIRouter(prefix="/api/v1", tags=["lineage"], responses=ERROR_RESPONSES)


def get_lineage(request: Request) -> LineageService:
    service: LineageService = request.app.state.lineage
    return service


Lineages = Annotated[LineageService, Depends(get_lineage)]


class NodeOut(BaseModel):
    id: str
    kind: str
    label: str
    attributes: dict[str, Any]
    redacted: bool


class EdgeOut(BaseModel):
    source: str
    target: str
    relation: str
    attributes: dict[str, Any]


class LineageOut(BaseModel):
    start: str
    direction: str
    depth: int
    truncated: bool
    nodes: list[NodeOut]
    edges: list[EdgeOut]


@router.get(
    "/lineage",
    summary="The lineage graph around an object: source -> dataset version -> run -> logged "
    "model -> model version -> deployment, upstream, downstream or both",
)
def lineage(
    svc: Lineages,
    principal: CurrentPrincipal,
    uri: Annotated[
        str,
        Query(
            min_length=1,
            max_length=MAX_URI,
            description="data:/NAME/N, runs:/RUN_ID, models:/NAME/N, models:/<logged model "
            "id>, deployments:/NAME or source:/NAME/N (aliases: data:/NAME@a, models:/NAME@a)",
        ),
    ],
    direction: Direction = Direction.BOTH,
    depth: Annotated[int, Query(ge=1, le=MAX_DEPTH)] = DEFAULT_DEPTH,
    max_nodes: Annotated[int, Query(ge=1, le=MAX_NODES)] = DEFAULT_NODES,
) -> LineageOut:
    found = svc.lineage(principal, uri, direction=direction, depth=depth, max_nodes=max_nodes)
    return LineageOut.model_validate(found.to_json())
