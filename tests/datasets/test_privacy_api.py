"""Privacy over HTTP: policies as JSON or YAML (unknown keys a 400 that changes nothing), the
privacy-officer grant (platform admins give it, audited), reveal (403 for anybody else),
erasure and key rotation; no personal value in an error body."""

from __future__ import annotations

import io

import pyarrow.parquet as pq
from fastapi.testclient import TestClient

from tests.registry.conftest import People, people

__all__ = ["people"]

SOURCE = (
    b"id,email,phone\n"
    b"1,amal.secret@example.ae,+971501234567\n"
    b"2,badr@example.ae,+971509999999\n"
    b"3,amal.secret@example.ae,+971501234567\n"
)
POLICY = {
    "version": 1,
    "columns": {
        "email": {"action": "hmac", "purpose": "crm"},
        "phone": {"action": "tokenize", "purpose": "support"},
    },
}


def _ready(api: TestClient, people: People) -> None:
    mo, rita = people.headers("mo"), people.headers("rita")
    assert api.post("/api/v1/datasets", json={"name": "c", "team": "red"}, headers=mo).is_success
    put = api.put("/api/v1/datasets/c/privacy", json=POLICY, headers=rita)
    assert put.status_code == 200, put.text
    up = api.post("/api/v1/dataset-uploads/c", params={"format": "csv"}, content=SOURCE, headers=mo)
    assert up.status_code == 201, up.text


def test_policies_over_http(api: TestClient, people: People) -> None:
    _ready(api, people)
    rita = people.headers("rita")
    shown = api.get("/api/v1/datasets/c/privacy", headers=people.headers("vi")).json()
    assert shown["policy"] == POLICY
    assert "hmac" in shown["yaml"]
    for body in (
        {**POLICY, "owner": "x"},
        {"columns": {"email": {"action": "hmac", "purpose": "crm", "pepper": "x"}}},
        {"yaml": "columns: {email: {action: hmac, purpose: crm}}\nsalt: 1"},
        {"yaml": 3},
    ):
        refused = api.put("/api/v1/datasets/c/privacy", json=body, headers=rita)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    assert api.get("/api/v1/datasets/c/privacy", headers=rita).json()["policy"] == POLICY
    as_yaml = {"yaml": "columns: {email: {action: hmac, purpose: crm}}"}
    assert api.put("/api/v1/datasets/c/privacy", json=as_yaml, headers=rita).status_code == 200
    member = api.put("/api/v1/datasets/c/privacy", json=POLICY, headers=people.headers("mo"))
    assert member.status_code == 403
    assert api.delete("/api/v1/datasets/c/privacy", headers=rita).status_code == 204
    assert api.get("/api/v1/datasets/c/privacy", headers=rita).json()["policy"] is None


def test_reveal_needs_the_privacy_officer_grant(api: TestClient, people: People) -> None:
    _ready(api, people)
    part = api.get("/api/v1/datasets/c/versions/1/parts/0", headers=people.headers("vi"))
    phones = pq.read_table(io.BytesIO(part.content)).column("phone").to_pylist()
    body = {"column": "phone", "tokens": [phones[0], phones[1]]}
    for who in ("rita", "admin", "otto"):
        denied = api.post("/api/v1/datasets/c/reveal", json=body, headers=people.headers(who))
        assert denied.status_code == 403, denied.text
        assert "privacy-officer" in denied.json()["message"]
    not_admin = api.put("/api/v1/users/otto/grants/privacy-officer", headers=people.headers("rita"))
    assert not_admin.status_code == 403
    assert api.put("/api/v1/users/otto/grants/unknown").status_code == 400
    granted = api.put("/api/v1/users/otto/grants/privacy-officer")  # the admin's client
    assert granted.status_code == 200, granted.text
    assert granted.json()["privacy_officer"] is True
    shown = api.post("/api/v1/datasets/c/reveal", json=body, headers=people.headers("otto"))
    assert shown.status_code == 200, shown.text
    assert shown.json() == {"values": ["+971501234567", "+971509999999"]}
    assert shown.headers["cache-control"] == "no-store"
    rotated = api.post("/api/v1/privacy/keys")
    assert rotated.status_code == 201
    again = api.post("/api/v1/datasets/c/reveal", json=body, headers=people.headers("otto"))
    assert again.json()["values"] == ["+971501234567", "+971509999999"]
    taken = api.delete("/api/v1/users/otto/grants/privacy-officer")
    assert taken.json()["privacy_officer"] is False
    gone = api.post("/api/v1/datasets/c/reveal", json=body, headers=people.headers("otto"))
    assert gone.status_code == 403
    audit = api.get("/api/v1/audit", params={"limit": 500}).text
    assert "user.grant" in audit
    assert "dataset.reveal" in audit
    assert "+971" not in audit


def test_erasure_over_http(api: TestClient, people: People) -> None:
    _ready(api, people)
    body = {"column": "email", "subject": "amal.secret@example.ae"}
    denied = api.post("/api/v1/datasets/c/erasures", json=body, headers=people.headers("mo"))
    assert denied.status_code == 403
    assert "amal" not in denied.text
    done = api.post("/api/v1/datasets/c/erasures", json=body, headers=people.headers("rita"))
    assert done.status_code == 201, done.text
    assert done.json()["rows_removed"] == 2
    assert "amal" not in done.text
    listed = api.get("/api/v1/datasets/c/erasures", headers=people.headers("rita")).json()
    assert [e["rows_removed"] for e in listed] == [2]
    version = api.get("/api/v1/datasets/c/latest", headers=people.headers("vi")).json()
    assert version["row_count"] == 1
    assert version["transformations"][-1]["action"] == "erasure"
    unknown = api.post(
        "/api/v1/datasets/c/erasures", json={**body, "why": "x"}, headers=people.headers("rita")
    )
    assert unknown.status_code == 400
    assert "amal" not in unknown.text
    audit = api.get("/api/v1/audit", params={"limit": 500}).text
    assert "dataset.erase" in audit
    assert "amal" not in audit
