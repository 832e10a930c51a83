"""``GET /api/v1/lineage``: the graph as JSON, for the caller's own objects only; malformed,
foreign-scheme and other teams' URIs are a clear 4xx that names nothing of anyone's."""

from __future__ import annotations

from fastapi.testclient import TestClient

from shamal.server import Platform
from tests.lineage.test_service import HOSTILE, _chain
from tests.registry.conftest import People, people

__all__ = ["people"]


def test_the_graph_over_http_and_what_others_get(
    api: TestClient, platform: Platform, people: People
) -> None:
    chain = _chain(platform, people, "mo", "red", "")
    vi, bo = people.headers("vi"), people.headers("bo")
    answer = api.get(
        "/api/v1/lineage", params={"uri": chain.data, "direction": "down", "depth": 4}, headers=vi
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["start"], body["direction"], body["depth"], body["truncated"]) == (
        chain.data,
        "down",
        4,
        False,
    )
    ids = {n["id"] for n in body["nodes"]}
    assert {chain.run, chain.logged_model, chain.version, chain.deployment} <= ids
    assert {"source", "target", "relation", "attributes"} == set(body["edges"][0])
    up = api.get("/api/v1/lineage", params={"uri": chain.deployment, "direction": "up"}, headers=vi)
    assert "source:/customers/1" in {n["id"] for n in up.json()["nodes"]}
    absent = api.get("/api/v1/lineage", params={"uri": "data:/nope/1"}, headers=bo).json()
    for start in (chain.data, chain.run, chain.version, chain.deployment, chain.logged_model):
        other = api.get("/api/v1/lineage", params={"uri": start}, headers=bo)
        assert other.status_code == 404, start
        assert other.json() == absent  # another team's object reads exactly as a missing one


def test_hostile_requests_are_4xx_and_leak_nothing(api: TestClient, people: People) -> None:
    vi = people.headers("vi")
    for uri in HOSTILE:
        if not uri:
            continue
        answer = api.get("/api/v1/lineage", params={"uri": uri}, headers=vi)
        assert answer.status_code == 400, (uri, answer.text)
        assert answer.json()["error_code"] == "INVALID_PARAMETER_VALUE"
        assert "Traceback" not in answer.text
    for params in (
        {},
        {"uri": ""},
        {"uri": "data:/x/1", "direction": "sideways"},
        {"uri": "data:/x/1", "depth": 0},
        {"uri": "data:/x/1", "depth": 99},
        {"uri": "data:/x/1", "max_nodes": 100_000},
        {"uri": "data:/x/1", "extra": "1"},
    ):
        assert api.get("/api/v1/lineage", params=params, headers=vi).status_code == 400, params
    unknown_token = {"Authorization": "Bearer not-a-token"}
    assert (
        api.get("/api/v1/lineage", params={"uri": "data:/x/1"}, headers=unknown_token).status_code
        == 401
    )
