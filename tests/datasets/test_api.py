"""The datasets API: create, upload a source, read versions and parts back, aliases, access,
and hostile requests (unknown keys, bad names, wrong formats) that change nothing."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from fastapi.testclient import TestClient

from tests.registry.conftest import People, people

__all__ = ["people"]

TABLE = pa.table({"id": [1, 2, 3], "score": [0.1, 0.2, 0.3]})


def _csv() -> bytes:
    sink = io.BytesIO()
    pacsv.write_csv(TABLE, sink)
    return sink.getvalue()


def test_a_source_becomes_a_version_whose_parts_read_back(api: TestClient, people: People) -> None:
    mo = people.headers("mo")
    created = api.post("/api/v1/datasets", json={"name": "scores", "team": "red"}, headers=mo)
    assert created.status_code == 201, created.text
    assert created.json()["latest_version"] is None
    up = api.post(
        "/api/v1/dataset-uploads/scores", params={"format": "csv"}, content=_csv(), headers=mo
    )
    assert up.status_code == 201, up.text
    body = up.json()
    assert (body["version"], body["row_count"], body["uri"]) == (1, 3, "data:/scores/1")
    assert [c["name"] for c in body["columns"]] == ["id", "score"]
    part = api.get("/api/v1/datasets/scores/versions/1/parts/0", headers=people.headers("vi"))
    assert part.status_code == 200
    assert pq.read_table(io.BytesIO(part.content)).to_pylist() == TABLE.to_pylist()
    assert api.get("/api/v1/datasets/scores/latest", headers=mo).json()["version"] == 1
    listed = api.get("/api/v1/datasets", headers=mo).json()
    assert [d["name"] for d in listed] == ["scores"]
    versions = api.get("/api/v1/datasets/scores/versions", headers=mo).json()
    assert [v["version"] for v in versions] == [1]


def test_aliases_over_http(api: TestClient, people: People) -> None:
    api.post("/api/v1/datasets", json={"name": "s", "team": "red"}, headers=people.headers("mo"))
    api.post(
        "/api/v1/dataset-uploads/s",
        params={"format": "csv"},
        content=_csv(),
        headers=people.headers("mo"),
    )
    assert (
        api.put(
            "/api/v1/datasets/s/aliases/prod", json={"version": 1}, headers=people.headers("mo")
        ).status_code
        == 403
    )
    moved = api.put(
        "/api/v1/datasets/s/aliases/prod", json={"version": 1}, headers=people.headers("rita")
    )
    assert moved.status_code == 200, moved.text
    assert api.get("/api/v1/datasets/s/aliases/prod").json()["version"] == 1
    assert api.get("/api/v1/datasets/s").json()["aliases"] == {"prod": 1}
    gone = api.delete("/api/v1/datasets/s/aliases/prod", headers=people.headers("rita"))
    assert gone.status_code == 204
    assert api.get("/api/v1/datasets/s/aliases/prod").status_code == 404


def test_other_teams_get_404_for_everything(api: TestClient, people: People) -> None:
    api.post(
        "/api/v1/datasets", json={"name": "red-only", "team": "red"}, headers=people.headers("mo")
    )
    bo = people.headers("bo")
    for path in (
        "/api/v1/datasets/red-only",
        "/api/v1/datasets/red-only/versions",
        "/api/v1/datasets/red-only/latest",
        "/api/v1/datasets/red-only/versions/1/parts/0",
    ):
        assert api.get(path, headers=bo).status_code == 404, path
    up = api.post(
        "/api/v1/dataset-uploads/red-only", params={"format": "csv"}, content=_csv(), headers=bo
    )
    assert up.status_code == 404
    assert api.get("/api/v1/datasets", headers=bo).json() == []


def test_hostile_requests_are_refused_and_change_nothing(api: TestClient, people: People) -> None:
    mo = people.headers("mo")
    for body in (
        {"name": "x", "team": "red", "extra": 1},
        {"name": "../x", "team": "red"},
        {"name": "X", "team": "red"},
        {"name": "a" * 129, "team": "red"},
        {"name": "x\x00", "team": "red"},
    ):
        assert api.post("/api/v1/datasets", json=body, headers=mo).status_code == 400, body
    assert api.get("/api/v1/datasets", headers=mo).json() == []
    api.post("/api/v1/datasets", json={"name": "x", "team": "red"}, headers=mo)
    for params, content in (
        ({"format": "xlsx"}, _csv()),
        ({"format": "csv", "mode": "sideways"}, _csv()),
        ({"format": "parquet"}, b"not parquet at all"),
        ({"format": "csv"}, b"a,b\n1\n"),
    ):
        answer = api.post("/api/v1/dataset-uploads/x", params=params, content=content, headers=mo)
        assert answer.status_code == 400, (params, answer.text)
        assert "Traceback" not in answer.text
    assert api.get("/api/v1/datasets/x/versions", headers=mo).json() == []
    assert api.get("/api/v1/datasets/x/latest", headers=mo).status_code == 404
