"""The lineage page in process: the chain from a deployment up to its dataset version and
source (the journey "follow lineage from a deployment to its data"), down from the data to
the runs that read it, each node linked to its page; another team's objects absent or
redacted without a name; refused URIs and bad values answer 400 pages."""

from __future__ import annotations

import json
import re
from urllib.parse import unquote

from fastapi.testclient import TestClient

from shamal.lineage import Node, NodeKind
from shamal.server import Platform
from shamal.tracking import Dataset, DatasetInput
from shamal.webui._lineage import href_of
from tests.lineage.test_service import _chain
from tests.registry.conftest import People, people
from tests.webui.conftest import sign_in

__all__ = ["people"]

HOSTILE = '<img src=x onerror="window.__xss=1">'


def _links(html: str) -> set[str]:
    return {unquote(h.replace("&amp;", "&")) for h in re.findall(r'href="([^"]*)"', html)}


def test_from_a_deployment_up_to_its_data_and_source(
    api: TestClient, browser: TestClient, platform: Platform, people: People
) -> None:
    chain = _chain(platform, people, "mo", "red", "")
    sign_in(browser, people.secrets["vi"])
    answer = browser.get("/ui/lineage", params={"uri": chain.deployment, "direction": "upstream"})
    assert answer.status_code == 200, answer.text
    html = answer.text
    assert '<svg class="graph"' in html
    links = _links(html)
    run_id = chain.run.removeprefix("runs:/")
    assert "/ui/datasets/customers/versions/1" in links
    assert "/ui/models/fraud/versions/1" in links
    assert "/ui/deployments/fraud-api" in links
    assert any(re.fullmatch(rf"/ui/experiments/\d+/runs/{run_id}", link) for link in links)
    assert f"/ui/lineage?uri={chain.logged_model}" in links  # no page of its own
    assert "<code>source:/customers/1</code>" in html
    # The plain tables say the same without the picture.
    for relation in ("ingested", "read", "logged", "registered", "serves"):
        assert f"<td>{relation}</td>" in html
    assert '<option value="up" selected>' in html
    # The dataset version's page leads here, and the walk goes on down from it.
    version_page = browser.get("/ui/datasets/customers/versions/1").text
    assert "/ui/lineage?uri=data:/customers/1" in _links(version_page)
    down = browser.get(
        "/ui/lineage", params={"uri": chain.data, "direction": "downstream", "depth": 1}
    )
    assert down.status_code == 200
    assert f"<code>{chain.run}</code>" in down.text
    assert f"<code>{chain.other_run}</code>" in down.text
    assert "<code>deployments:/fraud-api</code>" not in down.text  # one hop only
    assert '<option value="down" selected>' in down.text


def test_other_teams_objects_are_404_or_redacted(
    api: TestClient, browser: TestClient, platform: Platform, people: People
) -> None:
    red = _chain(platform, people, "mo", "red", "")
    blue = _chain(platform, people, "bo", "blue", "b-")
    # Blue's run claims to have read red's version: blue sees it only as a hidden node.
    red_version = platform.datasets.version(people.principals["mo"], "customers/1")
    claimed = Dataset("customers", red_version.digest, "shamal", json.dumps({"uri": red.data}))
    blue_run = blue.run.removeprefix("runs:/")
    platform.tracking.log_inputs(people.principals["bo"], blue_run, [DatasetInput(claimed)], [])
    sign_in(browser, people.secrets["bo"])
    for start in (red.data, red.run, red.version, red.deployment, red.logged_model):
        refused = browser.get("/ui/lineage", params={"uri": start})
        assert refused.status_code == 404, start
        assert "fraud-api" not in refused.text.replace("b-fraud-api", "")
    seen = browser.get("/ui/lineage", params={"uri": blue.run, "direction": "up"})
    assert seen.status_code == 200
    assert "hidden dataset version" in seen.text
    assert "data:/customers/1" not in seen.text
    assert "data%3A%2Fcustomers%2F1" not in seen.text
    assert "/ui/datasets/customers/" not in seen.text
    assert "source:/customers/" not in seen.text
    assert "/ui/datasets/b-customers/versions/1" in _links(seen.text)  # their own is linked
    assert 'class="node state-redacted"' in seen.text


def test_refused_uris_and_bad_values_answer_400_pages(
    api: TestClient, browser: TestClient, people: People
) -> None:
    sign_in(browser, people.secrets["vi"])
    empty = browser.get("/ui/lineage")
    assert empty.status_code == 200
    assert 'name="uri"' in empty.text
    for uri in ("file:///etc/passwd", "data:/../../etc/passwd", "runs:/not-a-run", HOSTILE):
        answer = browser.get("/ui/lineage", params={"uri": uri, "direction": "both"})
        assert answer.status_code == 400, uri
        assert 'role="alert"' in answer.text
        assert 'name="uri"' in answer.text  # the form, to correct it
        assert "<img" not in answer.text
    for params in (
        {"uri": "data:/x/1", "direction": "sideways"},
        {"uri": "data:/x/1", "depth": "0"},
        {"uri": "data:/x/1", "depth": "99"},
        {"uri": "data:/x/1", "depth": "two"},
        {"uri": "data:/" + "a" * 700},
    ):
        answer = browser.get("/ui/lineage", params=params)
        assert answer.status_code == 400, params
        assert "Traceback" not in answer.text
    assert browser.get("/ui/lineage", params={"uri": "data:/nope/1"}).status_code == 404


def test_each_kind_links_to_its_page_with_names_encoded() -> None:
    version = Node(
        "models:/a b/c?/2", NodeKind.MODEL_VERSION, "x", {"model": "a b#?%", "version": 2}
    )
    assert href_of(version) == "/ui/models/a%20b%23%3F%25/versions/2"
    run = Node("runs:/" + "a" * 32, NodeKind.RUN, "r", {"experiment_id": "7"})
    assert href_of(run) == f"/ui/experiments/7/runs/{'a' * 32}"
    lost = Node("runs:/" + "a" * 32, NodeKind.RUN, "r", {})
    assert href_of(lost) == "/ui/lineage?uri=runs%3A%2F" + "a" * 32
    hidden = Node("redacted:1", NodeKind.DATASET_VERSION, redacted=True)
    assert href_of(hidden) == ""
    odd = Node("input:/x/0", NodeKind.INPUT, HOSTILE)
    assert href_of(odd) == ""


def test_hostile_names_in_the_graph_render_as_text(
    api: TestClient, browser: TestClient, platform: Platform, people: People
) -> None:
    ctx, principal = people.ctx("mo"), people.principals["mo"]
    platform.datasets.create(ctx, "plain", "red")
    version = platform.datasets.ingest(ctx, "plain", [b"id\n1\n2\n"], "csv")
    tracking = platform.tracking
    experiment = tracking.create_experiment(ctx, HOSTILE, {"shamal.team": "red"}).experiment_id
    run = tracking.create_run(ctx, experiment, HOSTILE, None, {}).info.run_id
    used = Dataset(HOSTILE, version.digest, "shamal", json.dumps({"uri": version.uri}))
    other = Dataset(HOSTILE, "d" * 8, "javascript:alert(1)", json.dumps({"uri": "javascript:x"}))
    tracking.log_inputs(principal, run, [DatasetInput(used), DatasetInput(other)], [])
    sign_in(browser, people.secrets["vi"])
    for uri, direction in ((version.uri, "down"), (f"runs:/{run}", "up")):
        answer = browser.get("/ui/lineage", params={"uri": uri, "direction": direction})
        assert answer.status_code == 200, answer.text
        assert "<img" not in answer.text
        assert 'href="javascript' not in answer.text
        assert "&lt;img src=x onerror=&#34;window.__xss=1&#34;&gt;" in answer.text
    inputs = browser.get("/ui/lineage", params={"uri": f"runs:/{run}", "direction": "up"}).text
    assert "run input" in inputs  # the input that is no dataset of ours: listed, not linked
