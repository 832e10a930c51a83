"""Diffs between dataset versions, on SQLite and PostgreSQL: schema changes, the row change
and each column's profile shift, through the service and over HTTP (with refused requests)."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from shamal.datasets import WriteMode
from shamal.datasets._service import DatasetService
from shamal.errors import InvalidParameter, NotFound
from shamal.server import Platform
from tests.registry.conftest import People, people

__all__ = ["people"]

N = 5000


def _parquet(table: pa.Table) -> list[bytes]:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return [sink.getvalue()]


def _tables() -> tuple[pa.Table, pa.Table]:
    rng = np.random.default_rng(7)
    first = pa.table(
        {
            "id": pa.array(np.arange(N), pa.int64()),
            "amount": rng.normal(100.0, 10.0, N),
            "city": rng.choice(["Dubai", "Abu Dhabi"], N),
            "legacy": pa.array(np.zeros(N), pa.float64()),
        }
    )
    second = pa.table(
        {
            "id": pa.array(np.arange(N + 500).astype(np.float64)),  # int64 -> double
            "amount": rng.normal(130.0, 10.0, N + 500),  # a major shift
            "city": rng.choice(["Dubai", "Abu Dhabi"], N + 500),  # the same distribution
            "segment": rng.choice(["a", "b"], N + 500),  # added; legacy removed
        }
    )
    return first, second


@pytest.fixture
def service(platform: Platform, people: People) -> DatasetService:
    svc = platform.datasets
    svc.create(people.ctx("mo"), "sales", "red")
    first, second = _tables()
    svc.ingest(people.ctx("mo"), "sales", _parquet(first), "parquet")
    svc.ingest(people.ctx("mo"), "sales", _parquet(second), "parquet", mode=WriteMode.OVERWRITE)
    svc.set_alias(people.ctx("rita"), "sales", "prod", 1)
    return svc


def test_a_diff_names_schema_changes_rows_and_shifts(
    service: DatasetService, people: People
) -> None:
    found = service.diff(people.principals["vi"], "sales@prod", "sales")
    assert (found.before, found.after) == ("data:/sales/1", "data:/sales/2")
    assert (found.rows_before, found.rows_after, found.row_change) == (N, N + 500, 500)
    assert not found.same_content
    assert [c["name"] for c in found.added] == ["segment"]
    assert [c["name"] for c in found.removed] == ["legacy"]
    assert [(t.name, t.before, t.after) for t in found.type_changes] == [("id", "int64", "double")]
    assert found.profile_scopes == ("version", "version")
    amount = found.profile.column("amount")
    assert amount.psi is not None
    assert amount.psi > 0.25
    assert amount.mean_change == pytest.approx(30.0, abs=1.0)
    city = found.profile.column("city")
    assert city.psi is not None
    assert city.psi < 0.05
    same = service.diff(people.principals["vi"], "sales/2", "sales/2")
    assert same.same_content
    assert not same.schema_changed
    assert same.row_change == 0


def test_a_diff_of_what_the_caller_cannot_read_is_not_found(
    service: DatasetService, people: People
) -> None:
    with pytest.raises(NotFound):
        service.diff(people.principals["bo"], "sales/1", "sales/2")
    with pytest.raises(NotFound):
        service.diff(people.principals["vi"], "sales/1", "sales/9")
    with pytest.raises(InvalidParameter):
        service.diff(people.principals["vi"], "sales/1", "../sales/2")


def test_diff_over_http(api: TestClient, service: DatasetService, people: People) -> None:
    vi = people.headers("vi")
    answer = api.get(
        "/api/v1/datasets/sales/diff", params={"from": "1", "to": "latest"}, headers=vi
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["before"], body["after"], body["row_change"]) == (
        "data:/sales/1",
        "data:/sales/2",
        500,
    )
    assert body["schema_changed"]
    assert [t["name"] for t in body["type_changes"]] == ["id"]
    by_name = {c["name"]: c for c in body["columns"]}
    assert set(by_name) == {"id", "amount", "city"}
    assert by_name["amount"]["psi"] > 0.25
    aliased = api.get("/api/v1/datasets/sales/diff", params={"from": "prod", "to": "2"}, headers=vi)
    assert aliased.json()["before"] == "data:/sales/1"
    for params in (
        {"from": "1"},
        {"from": "0", "to": "1"},
        {"from": "../1", "to": "2"},
        {"from": "1", "to": "2", "extra": "x"},
        {"from": "1%2f..", "to": "2"},
        {"from": "1" * 20, "to": "2"},
    ):
        refused = api.get("/api/v1/datasets/sales/diff", params=params, headers=vi)
        assert refused.status_code == 400, (params, refused.text)
        assert "Traceback" not in refused.text
    missing = api.get("/api/v1/datasets/sales/diff", params={"from": "1", "to": "7"}, headers=vi)
    assert missing.status_code == 404
    other = api.get(
        "/api/v1/datasets/sales/diff", params={"from": "1", "to": "2"}, headers=people.headers("bo")
    )
    absent = api.get(
        "/api/v1/datasets/nope/diff", params={"from": "1", "to": "2"}, headers=people.headers("bo")
    )
    assert other.status_code == absent.status_code == 404  # another team's: as if absent
    assert other.json()["message"] == absent.json()["message"].replace("nope", "sales")
