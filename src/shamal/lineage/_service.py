"""The lineage graph across domains, walked on demand through each domain's public service.

source -> dataset version (``data:/NAME/N``) -> runs that read it (their inputs) -> logged
models they made -> model versions registered from those runs or models -> deployments that
serve those versions. Nothing is stored here: every edge is what a domain already records
(a version's ``source``, a run's inputs, a logged model's ``source_run_id``, a model version's
``run_id`` and ``model_id``, a deployment's routes), read with the caller's access.

Access: the start must be an object the caller may read (else 404, as if absent). Objects
found by searching downstream (runs that read a version, versions made from a run,
deployments serving a version) are searched among what the caller may read: others are left
out, unseen. An object a readable one names (a run's input, a version's run, a deployment's
model version) that the caller may not read, or that is gone, appears redacted: its kind and
an opaque id, no name, and the walk stops there. Bounded: ``depth`` hops each way,
``max_nodes`` nodes, ``MAX_FANOUT`` neighbours of any one node.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from shamal.datasets import DatasetService, DataVersion
from shamal.deployments import Deployment, DeploymentService
from shamal.errors import InvalidParameter, NotFound, PermissionDenied
from shamal.lineage._entities import Direction, Edge, Lineage, Node, NodeKind
from shamal.lineage._uris import NodeRef, parse_uri
from shamal.pipelines import CACHED_FROM_RUN_TAG
from shamal.registry import ModelVersion, RegistryService
from shamal.security import Principal
from shamal.tracking import LoggedModel, Run, RunInfo, TrackingService

__all__ = [
    "DEFAULT_DEPTH",
    "DEFAULT_NODES",
    "MAX_DEPTH",
    "MAX_FANOUT",
    "MAX_NODES",
    "LineageService",
]

logger = logging.getLogger(__name__)

DEFAULT_DEPTH, MAX_DEPTH = 6, 20
DEFAULT_NODES, MAX_NODES = 200, 1000
#: Neighbours taken from any one node, each way (a dataset read by thousands of runs).
MAX_FANOUT = 50
_HIDDEN = (NotFound, PermissionDenied)
_CONTEXT_TAG = "mlflow.data.context"
#: Source fields shown on a source node (the version's reader sees the whole record anyway;
#: these are the ones that say where rows came from).
_SOURCE_LABEL_KEYS = ("kind", "format", "uri", "url", "table", "topic", "stream", "subject")

Step = tuple[Node, Edge]


@dataclass
class _Walk:
    """One walk's state: what it found, and the bounds it keeps."""

    principal: Principal
    max_nodes: int
    nodes: dict[str, Node] = field(default_factory=dict)
    edges: dict[tuple[str, str, str], Edge] = field(default_factory=dict)
    truncated: bool = False
    redactions: int = 0

    def redacted(self, kind: NodeKind) -> Node:
        self.redactions += 1
        return Node(f"redacted:{self.redactions}", kind, redacted=True)

    def add(self, node: Node, edge: Edge) -> bool:
        """Add ``node`` (if new and room is left) and ``edge``; True when the node is new
        and the walk may go on from it."""
        new = node.id not in self.nodes
        if new and len(self.nodes) >= self.max_nodes:
            self.truncated = True
            return False
        self.nodes.setdefault(node.id, node)
        self.edges.setdefault((edge.source, edge.target, edge.relation), edge)
        return new and not node.redacted


class LineageService:
    """Walks lineage across datasets, tracking, the registry and deployments. Thread-safe
    (it keeps nothing); one per process."""

    def __init__(
        self,
        datasets: DatasetService,
        tracking: TrackingService,
        registry: RegistryService,
        deployments: DeploymentService,
    ) -> None:
        self._datasets = datasets
        self._tracking = tracking
        self._registry = registry
        self._deployments = deployments

    def lineage(
        self,
        principal: Principal,
        uri: str,
        *,
        direction: Direction = Direction.BOTH,
        depth: int = DEFAULT_DEPTH,
        max_nodes: int = DEFAULT_NODES,
    ) -> Lineage:
        """The graph around the object ``uri`` names, ``depth`` hops upstream, downstream or
        both. An alias (``data:/customers@prod``, ``models:/fraud@champion``) starts at the
        version it names now.

        Raises:
            InvalidParameter: a URI of no form lineage takes, or bounds out of range.
            NotFound: nothing there the caller may read (another team's object included).
        """
        if not 1 <= depth <= MAX_DEPTH:
            raise InvalidParameter(f"depth must be between 1 and {MAX_DEPTH}")
        if not 1 <= max_nodes <= MAX_NODES:
            raise InvalidParameter(f"max_nodes must be between 1 and {MAX_NODES}")
        start = self._start(principal, parse_uri(uri))
        walk = _Walk(principal, max_nodes, {start.id: start})
        ways = (Direction.UP, Direction.DOWN) if direction is Direction.BOTH else (direction,)
        for way in ways:
            self._go(walk, start, way, depth)
        return Lineage(
            start.id,
            direction,
            depth,
            tuple(walk.nodes.values()),
            tuple(walk.edges.values()),
            walk.truncated,
        )

    # ------------------------------------------------------------------ the walk
    def _go(self, walk: _Walk, start: Node, way: Direction, depth: int) -> None:
        frontier = [start]
        for _ in range(depth):
            following: list[Node] = []
            for node in frontier:
                for neighbour, edge in self._bounded(walk, self._steps(walk, node, way)):
                    if walk.add(neighbour, edge):
                        following.append(neighbour)
            if not following:
                return
            frontier = following

    @staticmethod
    def _bounded(walk: _Walk, steps: Iterator[Step]) -> Iterator[Step]:
        for count, step in enumerate(steps):
            if count == MAX_FANOUT:
                walk.truncated = True
                return
            yield step

    def _steps(self, walk: _Walk, node: Node, way: Direction) -> Iterator[Step]:
        try:
            ref = parse_uri(node.id)
        except InvalidParameter:  # a name no URI of ours can carry: shown, not followed
            return iter(())
        table: dict[NodeKind, tuple[Callable[[_Walk, NodeRef], Iterator[Step]], ...]] = {
            NodeKind.SOURCE: (_nothing, self._source_down),
            NodeKind.DATASET_VERSION: (self._data_up, self._data_down),
            NodeKind.RUN: (self._run_up, self._run_down),
            NodeKind.LOGGED_MODEL: (self._logged_up, self._logged_down),
            NodeKind.MODEL_VERSION: (self._version_up, self._version_down),
            NodeKind.DEPLOYMENT: (self._deployment_up, _nothing),
        }
        up, down = table[ref.kind]
        return up(walk, ref) if way is Direction.UP else down(walk, ref)

    # ------------------------------------------------------------------ the start
    def _start(self, principal: Principal, ref: NodeRef) -> Node:
        try:
            return self._load(principal, ref)
        except _HIDDEN:
            raise NotFound(
                "nothing at that URI that you can see: it does not exist, or belongs to a team "
                "you are not in"
            ) from None

    def _load(self, principal: Principal, ref: NodeRef) -> Node:
        """The node ``ref`` names, read with the caller's access (raises NotFound)."""
        if ref.kind is NodeKind.DATASET_VERSION:
            return _data_node(self._datasets.version(principal, _data_ref(ref)))
        if ref.kind is NodeKind.SOURCE:
            return _source_node(self._datasets.version(principal, f"{ref.name}/{ref.version}"))
        if ref.kind is NodeKind.RUN:
            return _run_node(self._tracking.run_info(principal, ref.name))
        if ref.kind is NodeKind.LOGGED_MODEL:
            return _logged_node(self._tracking.models.get(principal, ref.name))
        if ref.kind is NodeKind.MODEL_VERSION:
            if ref.alias is not None:
                found = self._registry.get_model_version_by_alias(principal, ref.name, ref.alias)
            else:
                assert ref.version is not None
                found = self._registry.get_model_version(principal, ref.name, ref.version)
            return _version_node(found)
        return _deployment_node(self._deployments.get(principal, ref.name))

    def _named(self, walk: _Walk, ref: NodeRef) -> Node:
        """The node a readable object names: itself, or redacted when hidden or gone."""
        try:
            return self._load(walk.principal, ref)
        except _HIDDEN:
            return walk.redacted(ref.kind)

    # ------------------------------------------------------------------ sources and data
    def _source_down(self, walk: _Walk, ref: NodeRef) -> Iterator[Step]:
        data = self._named(walk, NodeRef(NodeKind.DATASET_VERSION, ref.name, ref.version))
        yield data, Edge(f"source:/{ref.name}/{ref.version}", data.id, "ingested")

    def _data_up(self, walk: _Walk, ref: NodeRef) -> Iterator[Step]:
        found = self._datasets.version(walk.principal, _data_ref(ref))
        source = _source_node(found)
        yield source, Edge(source.id, found.uri, "ingested")
        # A training set the feature store saved: the dataset versions its views read.
        used = found.source.get("feature_views") if found.source.get("kind") == "features" else None
        for view in (used if isinstance(used, list) else [])[:MAX_FANOUT]:
            named = _data_uri(json.dumps({"uri": view.get("dataset")}))
            if named is None:
                continue
            node = self._named(walk, named)
            detail = {"feature_view": view.get("view")}
            yield node, Edge(node.id, found.uri, "joined", detail)

    def _data_down(self, walk: _Walk, ref: NodeRef) -> Iterator[Step]:
        found = self._datasets.version(walk.principal, _data_ref(ref))
        reads = self._tracking.runs_reading(walk.principal, found.uri, limit=MAX_FANOUT + 1)
        for info, used in reads:
            run = _run_node(info)
            detail = {
                "digest_matches": used.dataset.digest == found.digest,
                "context": dict(used.tags).get(_CONTEXT_TAG),
            }
            yield run, Edge(found.uri, run.id, "read", detail)

    # ------------------------------------------------------------------ runs
    def _run_up(self, walk: _Walk, ref: NodeRef) -> Iterator[Step]:
        run = self._tracking.get_run(walk.principal, ref.name)
        target = f"runs:/{ref.name}"
        for index, used in enumerate(run.dataset_inputs):
            data = used.dataset
            detail: dict[str, Any] = {
                "digest": data.digest,
                "context": dict(used.tags).get(_CONTEXT_TAG),
            }
            named = _data_uri(data.source)
            if named is None:
                node = Node(
                    f"input:/{ref.name}/{index}",
                    NodeKind.INPUT,
                    data.name,
                    {"digest": data.digest, "source_type": data.source_type},
                )
            else:
                node = self._named(walk, named)
                if not node.redacted:
                    detail["digest_matches"] = data.digest == node.attributes.get("digest")
            yield node, Edge(node.id, target, "read", detail)
        for model_id in run.model_inputs:
            node = self._named(walk, NodeRef(NodeKind.LOGGED_MODEL, model_id))
            yield node, Edge(node.id, target, "input")
        producer = run.tags.get(CACHED_FROM_RUN_TAG)
        if producer:
            node = self._named(walk, NodeRef(NodeKind.RUN, producer))
            yield node, Edge(node.id, target, "reused", {"cache": "hit"})

    def _run_down(self, walk: _Walk, ref: NodeRef) -> Iterator[Step]:
        info = self._tracking.run_info(walk.principal, ref.name)
        source = f"runs:/{ref.name}"
        made = self._tracking.models.search(
            walk.principal,
            experiment_ids=[info.experiment_id],
            filter_string=f"source_run_id = '{info.run_id}'",  # a server-minted hex id
            order_by=[],
            max_results=MAX_FANOUT + 1,
            page_token=None,
        ).items
        made = [m for m in made if m.source_run_verified]  # a claimed run is no lineage
        for model in made:
            node = _logged_node(model)
            yield node, Edge(source, node.id, "logged")
        logged = {m.model_id for m in made}
        versions = self._registry.versions_from(
            walk.principal, run_ids=[info.run_id], limit=MAX_FANOUT + 1
        )
        for version in versions:
            if version.model_id not in logged:  # else it hangs under its logged model
                node = _version_node(version)
                yield node, Edge(source, node.id, "registered")
        for reuser in self._reusers(walk, info):
            node = _run_node(reuser.info)
            yield node, Edge(source, node.id, "reused", {"cache": "hit"})

    def _reusers(self, walk: _Walk, info: RunInfo) -> list[Run]:
        """Pipeline steps' runs (in the run's experiment, where a pipeline keeps its steps)
        that took this run's result from the step cache instead of running again."""
        return self._tracking.search_runs(
            walk.principal,
            experiment_ids=[info.experiment_id],
            filter_string=f"tags.`{CACHED_FROM_RUN_TAG}` = '{info.run_id}'",  # a minted hex id
            view="active",
            max_results=MAX_FANOUT + 1,
            order_by=[],
            page_token=None,
        ).items

    # ------------------------------------------------------------------ models
    def _logged_up(self, walk: _Walk, ref: NodeRef) -> Iterator[Step]:
        model = self._tracking.models.get(walk.principal, ref.name)
        if model.source_run_id and model.source_run_verified:
            run = self._named(walk, NodeRef(NodeKind.RUN, model.source_run_id))
            yield run, Edge(run.id, f"models:/{ref.name}", "logged")

    def _logged_down(self, walk: _Walk, ref: NodeRef) -> Iterator[Step]:
        versions = self._registry.versions_from(
            walk.principal, model_ids=[ref.name], limit=MAX_FANOUT + 1
        )
        for version in versions:
            node = _version_node(version)
            yield node, Edge(f"models:/{ref.name}", node.id, "registered")

    def _version_up(self, walk: _Walk, ref: NodeRef) -> Iterator[Step]:
        found = self._version(walk, ref)
        target = f"models:/{found.name}/{found.version}"
        if found.model_id is not None:
            node = self._named(walk, NodeRef(NodeKind.LOGGED_MODEL, found.model_id))
        elif found.run_id is not None and found.run_verified:
            node = self._named(walk, NodeRef(NodeKind.RUN, found.run_id))
        else:
            return
        yield node, Edge(node.id, target, "registered")

    def _version_down(self, walk: _Walk, ref: NodeRef) -> Iterator[Step]:
        found = self._version(walk, ref)
        source = f"models:/{found.name}/{found.version}"
        serving = self._deployments.serving(
            walk.principal, found.name, found.version, limit=MAX_FANOUT + 1
        )
        for deployment in serving:
            roles = sorted(
                r.role.value
                for r in deployment.split.routes
                if (r.model_name, r.version) == (found.name, found.version)
            )
            node = _deployment_node(deployment)
            yield node, Edge(source, node.id, "serves", {"roles": roles})

    def _version(self, walk: _Walk, ref: NodeRef) -> ModelVersion:
        assert ref.version is not None  # nodes are named by number, never by alias
        return self._registry.get_model_version(walk.principal, ref.name, ref.version)

    def _deployment_up(self, walk: _Walk, ref: NodeRef) -> Iterator[Step]:
        deployment = self._deployments.get(walk.principal, ref.name)
        roles: dict[tuple[str, int], list[str]] = {}
        for route in deployment.split.routes:
            roles.setdefault((route.model_name, route.version), []).append(route.role.value)
        for (model, number), held in roles.items():
            node = self._named(walk, NodeRef(NodeKind.MODEL_VERSION, model, number))
            edge = Edge(node.id, f"deployments:/{ref.name}", "serves", {"roles": sorted(held)})
            yield node, edge


# ---------------------------------------------------------------------- nodes
def _nothing(_walk: _Walk, _ref: NodeRef) -> Iterator[Step]:
    return iter(())


def _data_ref(ref: NodeRef) -> str:
    if ref.version is not None:
        return f"{ref.name}/{ref.version}"
    return f"{ref.name}@{ref.alias}" if ref.alias is not None else ref.name


def _data_uri(source: str) -> NodeRef | None:
    """The dataset version a run input's source names (``{"uri": "data:/NAME/N"}``), if it
    names one by number; None for any other source."""
    try:
        named = json.loads(source).get("uri")
    except (ValueError, AttributeError):
        return None
    if not isinstance(named, str) or not named.startswith("data:/"):
        return None
    try:
        ref = parse_uri(named)
    except InvalidParameter:
        return None
    return ref if ref.version is not None else None


def _data_node(found: DataVersion) -> Node:
    return Node(
        found.uri,
        NodeKind.DATASET_VERSION,
        found.uri,
        {
            "dataset": found.dataset,
            "version": found.version,
            "digest": found.digest,
            "status": found.status.value,
            "rows": found.row_count,
            "created_at": found.created_at.isoformat(),
        },
    )


def _source_node(found: DataVersion) -> Node:
    source: dict[str, Any] = dict(found.source)
    shown = [str(source[k]) for k in _SOURCE_LABEL_KEYS if isinstance(source.get(k), str | int)]
    return Node(
        f"source:/{found.dataset}/{found.version}",
        NodeKind.SOURCE,
        " ".join(shown) or "source",
        source,
    )


def _run_node(info: RunInfo) -> Node:
    return Node(
        f"runs:/{info.run_id}",
        NodeKind.RUN,
        info.run_name,
        {
            "experiment_id": info.experiment_id,
            "status": info.status,
            "lifecycle_stage": info.lifecycle_stage,
            "user": info.user_id,
        },
    )


def _logged_node(model: LoggedModel) -> Node:
    return Node(
        f"models:/{model.model_id}",
        NodeKind.LOGGED_MODEL,
        model.name,
        {"experiment_id": model.experiment_id, "status": model.status},
    )


def _version_node(version: ModelVersion) -> Node:
    return Node(
        f"models:/{version.name}/{version.version}",
        NodeKind.MODEL_VERSION,
        f"{version.name} v{version.version}",
        {
            "model": version.name,
            "version": version.version,
            "stage": version.current_stage.value,
            "aliases": list(version.aliases),
        },
    )


def _deployment_node(deployment: Deployment) -> Node:
    return Node(
        f"deployments:/{deployment.name}",
        NodeKind.DEPLOYMENT,
        deployment.name,
        {
            "team": deployment.team,
            "revision": deployment.revision,
            "phase": deployment.state.phase.value,
        },
    )
