"""What a lineage walk returns: nodes (each named by its URI) and the edges between them,
always pointing downstream (source -> dataset version -> run -> logged model -> model version
-> deployment), whichever way the walk went. Frozen; JSON through ``to_json``."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class NodeKind(enum.StrEnum):
    SOURCE = "source"
    DATASET_VERSION = "dataset_version"
    INPUT = "input"
    RUN = "run"
    LOGGED_MODEL = "logged_model"
    MODEL_VERSION = "model_version"
    DEPLOYMENT = "deployment"


class Direction(enum.StrEnum):
    """``up``: towards where things came from; ``down``: towards what was made of them."""

    UP = "up"
    DOWN = "down"
    BOTH = "both"


@dataclass(frozen=True, slots=True)
class Node:
    """One object in the graph. ``id`` is its URI (``data:/customers/3``, ``runs:/<id>``,
    ``models:/<logged model id>``, ``models:/fraud/2``, ``deployments:/fraud-api``,
    ``source:/customers/3``; a run's input that is not a Shamal dataset is
    ``input:/<run id>/<n>``). A ``redacted`` node is one a visible object refers to that
    the caller may not read (or that is gone): it has a kind and an opaque id, nothing else,
    and the walk does not go past it."""

    id: str
    kind: NodeKind
    label: str = ""
    attributes: Mapping[str, Any] = field(default_factory=dict)
    redacted: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind.value,
            "label": self.label,
            "attributes": dict(self.attributes),
            "redacted": self.redacted,
        }


@dataclass(frozen=True, slots=True)
class Edge:
    """``source`` -> ``target`` (downstream), with what links them (``relation``: ingested,
    read, input, logged, registered, serves, joined: a training set from a view's data)
    and its details."""

    source: str
    target: str
    relation: str
    attributes: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "target": self.target,
            "relation": self.relation,
            "attributes": dict(self.attributes),
        }


@dataclass(frozen=True, slots=True)
class Lineage:
    """The graph around ``start``: up to ``depth`` hops each way asked. ``truncated`` says a
    bound (nodes, or neighbours of one node) cut it short."""

    start: str
    direction: Direction
    depth: int
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    truncated: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "direction": self.direction.value,
            "depth": self.depth,
            "truncated": self.truncated,
            "nodes": [n.to_json() for n in self.nodes],
            "edges": [e.to_json() for e in self.edges],
        }
