"""LineageService on SQLite and PostgreSQL: the chain source -> dataset version -> run ->
logged model -> model version -> deployment, built through each domain's service, walked
down from the data and up from the deployment; two teams see only their own; bounds; and
hostile URIs refused without a trace of anyone's objects."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from shamal.deployments._entities import DeploymentSpec, WeightedUri
from shamal.errors import InvalidParameter, NotFound
from shamal.lineage import Direction, Lineage, LineageService, NodeKind
from shamal.registry import TEAM_TAG
from shamal.server import Platform
from shamal.tracking import Dataset, DatasetInput, LoggedModelSpec
from tests.registry.conftest import People, people

__all__ = ["people"]


def _csv() -> list[bytes]:
    sink = io.BytesIO()
    pacsv.write_csv(pa.table({"id": [1, 2, 3], "amount": [1.5, 2.5, 3.5]}), sink)
    return [sink.getvalue()]


@dataclass(frozen=True)
class Chain:
    data: str
    run: str
    other_run: str
    logged_model: str
    version: str
    run_version: str
    deployment: str


def _chain(platform: Platform, people: People, who: str, team: str, prefix: str) -> Chain:
    """A team's chain: a dataset version read by two runs (one logged a model, registered as
    version 1 and deployed; the other registered version 2 from its own files)."""
    ctx = people.ctx(who)
    principal = people.principals[who]
    name = f"{prefix}customers"
    platform.datasets.create(ctx, name, team)
    version = platform.datasets.ingest(ctx, name, _csv(), "csv")
    tracking = platform.tracking
    exp = tracking.create_experiment(ctx, f"{prefix}exp", {"shamal.team": team}).experiment_id
    runs = [tracking.create_run(ctx, exp, n, None, {}).info.run_id for n in ("train", "tune")]
    used = Dataset(name, version.digest, "shamal", json.dumps({"uri": version.uri}))
    for run in runs:
        tracking.log_inputs(
            principal, run, [DatasetInput(used, (("mlflow.data.context", "x"),))], []
        )
    model = tracking.models.create(ctx, exp, LoggedModelSpec(name="model", source_run_id=runs[0]))
    registry = platform.registry
    registry.create_registered_model(ctx, f"{prefix}fraud", tags={TEAM_TAG: team})
    registry.create_model_version(
        ctx, f"{prefix}fraud", f"models:/{model.model_id}", model_id=model.model_id
    )
    registry.create_model_version(ctx, f"{prefix}fraud", f"runs:/{runs[1]}/model", run_id=runs[1])
    spec = DeploymentSpec(primaries=(WeightedUri(f"models:/{prefix}fraud/1"),), team=team)
    platform.deployments.deploy(ctx, f"{prefix}fraud-api", spec)
    return Chain(
        data=version.uri,
        run=f"runs:/{runs[0]}",
        other_run=f"runs:/{runs[1]}",
        logged_model=f"models:/{model.model_id}",
        version=f"models:/{prefix}fraud/1",
        run_version=f"models:/{prefix}fraud/2",
        deployment=f"deployments:/{prefix}fraud-api",
    )


@pytest.fixture
def service(platform: Platform) -> LineageService:
    return platform.lineage


def _edges(graph: Lineage) -> set[tuple[str, str, str]]:
    return {(e.source, e.target, e.relation) for e in graph.edges}


def test_from_the_data_down_to_the_deployment_and_back_up_to_the_source(
    service: LineageService, platform: Platform, people: People
) -> None:
    chain = _chain(platform, people, "mo", "red", "")
    source = "source:/customers/1"
    down = service.lineage(people.principals["vi"], chain.data, direction=Direction.DOWN)
    assert _edges(down) == {
        (chain.data, chain.run, "read"),
        (chain.data, chain.other_run, "read"),
        (chain.run, chain.logged_model, "logged"),
        (chain.logged_model, chain.version, "registered"),
        (chain.other_run, chain.run_version, "registered"),
        (chain.version, chain.deployment, "serves"),
    }
    read = next(e for e in down.edges if e.relation == "read")
    assert read.attributes["digest_matches"] is True
    assert not down.truncated
    up = service.lineage(people.principals["vi"], chain.deployment, direction=Direction.UP)
    assert _edges(up) == {
        (chain.version, chain.deployment, "serves"),
        (chain.logged_model, chain.version, "registered"),
        (chain.run, chain.logged_model, "logged"),
        (chain.data, chain.run, "read"),
        (source, chain.data, "ingested"),
    }
    kinds = {n.id: n.kind for n in up.nodes}
    assert kinds[source] is NodeKind.SOURCE
    assert kinds[chain.deployment] is NodeKind.DEPLOYMENT
    assert next(n for n in up.nodes if n.id == source).attributes["kind"] == "upload"
    # Any node starts a walk; an alias starts at the version it names now.
    both = service.lineage(people.principals["vi"], "data:/customers@latest", depth=1)
    assert _edges(both) == {
        (source, chain.data, "ingested"),
        (chain.data, chain.run, "read"),
        (chain.data, chain.other_run, "read"),
    }
    one_hop = service.lineage(people.principals["vi"], chain.run_version, direction=Direction.UP)
    assert (chain.other_run, chain.run_version, "registered") in _edges(one_hop)


def test_two_teams_see_only_their_own(
    service: LineageService, platform: Platform, people: People
) -> None:
    red = _chain(platform, people, "mo", "red", "")
    blue = _chain(platform, people, "bo", "blue", "b-")
    for start in (red.data, red.run, red.logged_model, red.version, red.deployment):
        with pytest.raises(NotFound) as refused:
            service.lineage(people.principals["bo"], start)
        assert "customers" not in str(refused.value)
        assert "fraud" not in str(refused.value)
    # Blue's run also read red's version (it claims so in its inputs): red's readers never
    # see blue's run, and blue sees red's version only as a redacted node.
    blue_run = blue.run.removeprefix("runs:/")
    red_version = platform.datasets.version(people.principals["mo"], "customers/1")
    claimed = Dataset("customers", red_version.digest, "shamal", json.dumps({"uri": red.data}))
    platform.tracking.log_inputs(people.principals["bo"], blue_run, [DatasetInput(claimed)], [])
    seen_by_red = service.lineage(people.principals["vi"], red.data, direction=Direction.DOWN)
    assert blue.run not in {n.id for n in seen_by_red.nodes}
    seen_by_blue = service.lineage(people.principals["bo"], blue.run, direction=Direction.UP)
    hidden = [n for n in seen_by_blue.nodes if n.redacted]
    assert len(hidden) == 1
    assert hidden[0].kind is NodeKind.DATASET_VERSION
    assert hidden[0].label == ""
    assert not hidden[0].attributes
    shown = json.dumps(seen_by_blue.to_json())
    assert '"data:/customers/1"' not in shown  # red's version is named nowhere
    assert "source:/customers/" not in shown
    # The admin sees both chains.
    admin = service.lineage(people.principals["admin"], red.data, direction=Direction.DOWN)
    assert blue.run in {n.id for n in admin.nodes}


def test_bounds_hold(service: LineageService, platform: Platform, people: People) -> None:
    chain = _chain(platform, people, "mo", "red", "")
    small = service.lineage(
        people.principals["vi"], chain.data, direction=Direction.DOWN, max_nodes=3
    )
    assert len(small.nodes) == 3
    assert small.truncated
    shallow = service.lineage(
        people.principals["vi"], chain.data, direction=Direction.DOWN, depth=1
    )
    assert {n.kind for n in shallow.nodes} == {NodeKind.DATASET_VERSION, NodeKind.RUN}
    for depth, nodes in ((0, 10), (21, 10), (3, 0), (3, 1001)):
        with pytest.raises(InvalidParameter):
            service.lineage(people.principals["vi"], chain.data, depth=depth, max_nodes=nodes)


HOSTILE = (
    "",
    "file:///etc/passwd",
    "/etc/passwd",
    "http://169.254.169.254/latest/meta-data/",
    "s3://bucket/x",
    "data:/../../etc/passwd",
    "data:/%2e%2e/1",
    "data:/customers/0",
    "data:/customers/1/../2",
    "runs:/../../x",
    "runs:/" + "a" * 32 + "/../../etc/passwd",
    "runs:/" + "a" * 32 + "/model/..",
    "runs:/" + "a" * 32 + "/%2e%2e/x",
    "runs:/not-a-run-id",
    "models:/../1",
    "models:/a/b/1",
    "models:/fraud/1\x00",
    "deployments:/../x",
    "deployments:/a\r\nX: 1",
    "data:/" + "a" * 700,
    "dbfs:/x",
    "gopher://127.0.0.1:6379/_SET",
)


def test_hostile_uris_are_refused_and_echo_nothing(service: LineageService, people: People) -> None:
    for uri in HOSTILE:
        with pytest.raises(InvalidParameter) as refused:
            service.lineage(people.principals["vi"], uri)
        if len(uri) > 3:
            assert uri not in str(refused.value)


def test_unknown_objects_are_not_found(service: LineageService, people: People) -> None:
    for uri in (
        "data:/nothing/1",
        "runs:/" + "0" * 32,
        "runs:/" + "0" * 32 + "/model",
        "models:/m-" + "0" * 32,
        "models:/nothing/1",
        "models:/nothing@prod",
        "deployments:/nothing",
        "source:/nothing/1",
    ):
        with pytest.raises(NotFound):
            service.lineage(people.principals["vi"], uri)


def test_runs_reading_matches_the_uri_exactly(platform: Platform, people: People) -> None:
    """LIKE wildcards in a name (``_``) and longer or differently keyed sources never match."""
    ctx, principal = people.ctx("mo"), people.principals["mo"]
    tracking = platform.tracking
    exp = tracking.create_experiment(ctx, "exact", {"shamal.team": "red"}).experiment_id
    sources = {
        "exact": {"uri": "data:/a_b/1"},
        "wildcard": {"uri": "data:/axb/1"},
        "longer": {"uri": "data:/a_b/10"},
        "other-key": {"path": "data:/a_b/1"},
    }
    runs = {}
    for label, source in sources.items():
        run = tracking.create_run(ctx, exp, label, None, {}).info.run_id
        used = Dataset(label, "0" * 64, "shamal", json.dumps(source))
        tracking.log_inputs(principal, run, [DatasetInput(used)], [])
        runs[label] = run
    found = tracking.runs_reading(principal, "data:/a_b/1")
    assert [info.run_id for info, _ in found] == [runs["exact"]]
    assert tracking.runs_reading(people.principals["bo"], "data:/a_b/1") == []
    with pytest.raises(InvalidParameter):
        tracking.runs_reading(principal, "data:/a_b/1", limit=0)
