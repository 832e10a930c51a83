"""The streams API: the push endpoint (JSON rows, Arrow IPC; once per Idempotency-Key, all
or nothing), a consumer's micro-batches, dead letters, and hostile requests (no key, a key
with control characters, credentials in a stream name, lying Arrow lengths, unknown fields)
that answer 4xx and change nothing."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.ipc as paipc
from fastapi.testclient import TestClient

from tests.registry.conftest import People, people

__all__ = ["people"]

PUSH = "/api/v1/datasets/orders/push"


def _ipc(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with paipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _setup(api: TestClient, people: People) -> dict[str, str]:
    mo = people.headers("mo")
    made = api.post("/api/v1/datasets", json={"name": "orders", "team": "red"}, headers=mo)
    assert made.status_code == 201, made.text
    return mo


def _rows(api: TestClient, people: People) -> int:
    latest = api.get("/api/v1/datasets/orders/latest", headers=people.headers("vi"))
    return int(latest.json()["row_count"]) if latest.status_code == 200 else 0


def test_a_push_is_written_once_per_idempotency_key(api: TestClient, people: People) -> None:
    mo = _setup(api, people)
    rows = [{"id": 1, "total": 2.5}, {"id": 2, "total": 4.0}]
    first = api.post(PUSH, json=rows, headers={**mo, "Idempotency-Key": "order-batch-1"})
    assert first.status_code == 201, first.text
    body = first.json()
    assert (body["written"], body["replayed"], body["version"]["version"]) == (2, False, 1)
    assert body["version"]["source"] == {"kind": "push", "format": "json"}
    again = api.post(PUSH, json={"rows": rows}, headers={**mo, "Idempotency-Key": "order-batch-1"})
    assert again.status_code == 200, again.text
    assert again.json()["replayed"] is True
    assert again.json()["version"]["version"] == 1
    table = pa.table({"id": [3], "total": [1.0]})
    arrow_headers = {
        **mo,
        "Idempotency-Key": "order-batch-2",
        "Content-Type": "application/vnd.apache.arrow.stream",
    }
    arrow = api.post(PUSH, content=_ipc(table), headers=arrow_headers)
    assert arrow.status_code == 201, arrow.text
    assert arrow.json()["version"]["row_count"] == 3
    assert api.post(PUSH, content=_ipc(table), headers=arrow_headers).status_code == 200
    assert _rows(api, people) == 3


def test_hostile_pushes_answer_4xx_and_write_nothing(api: TestClient, people: People) -> None:
    mo = _setup(api, people)
    api.post(PUSH, json=[{"id": 1, "total": 1.0}], headers={**mo, "Idempotency-Key": "k0"})
    key = {**mo, "Idempotency-Key": "k1"}
    cases = [
        api.post(PUSH, json=[{"id": 1, "total": 1.0}], headers=mo),  # no key
        api.post(PUSH, json=[{"id": 1, "total": 1.0}], headers={**mo, "Idempotency-Key": "a\tb"}),
        api.post(
            PUSH, json=[{"id": 1, "total": 1.0}], headers={**mo, "Idempotency-Key": "k" * 300}
        ),
        api.post(PUSH, content=b"{not json", headers={**key, "Content-Type": "application/json"}),
        api.post(PUSH, json={"rowz": []}, headers=key),
        api.post(PUSH, json=[], headers=key),
        api.post(PUSH, json=[{"id": 2, "total": 1.0}, {"id": 3, "total": "Fatima"}], headers=key),
        api.post(PUSH, json=[{"id": 2, "other": 1.0}], headers=key),
        api.post(PUSH, content=b"id,total\n1,2\n", headers={**key, "Content-Type": "text/csv"}),
        api.post(
            PUSH,
            content=_ipc(pa.table({"id": [1], "total": [1.0]}))[:-12] + b"\xff" * 12,
            headers={**key, "Content-Type": "application/vnd.apache.arrow.stream"},
        ),
        api.post(
            PUSH,
            json=[{"id": 1, "total": 1.0}],
            headers={**people.headers("vi"), "Idempotency-Key": "k"},
        ),
    ]
    codes = [answer.status_code for answer in cases]
    assert all(400 <= code < 500 for code in codes), codes
    assert codes[-1] == 403
    for answer in cases:
        assert set(answer.json()) >= {"error_code", "message"}
        assert "Fatima" not in answer.text
    assert _rows(api, people) == 1
    # The refused key stays free: the corrected push goes through.
    fixed = api.post(PUSH, json=[{"id": 2, "total": 1.0}], headers=key)
    assert fixed.status_code == 201, fixed.text


def test_micro_batches_skip_committed_keys_and_park_poison(api: TestClient, people: People) -> None:
    mo = _setup(api, people)
    url = "/api/v1/datasets/orders/stream-batches"
    records = [
        {"key": "1-0", "row": {"id": 1, "total": 1.0}},
        {"key": "2-0", "row": {"id": 2, "total": "n/a"}},
        {"key": "3-0", "row": {"id": 3, "total": 3.0}},
    ]
    dead = [{"key": "4-0", "reason": "the payload is not JSON", "digest": "a" * 64, "size": 3}]
    body = {"stream": "redis:orders", "records": records, "dead": dead}
    first = api.post(url, json=body, headers=mo)
    assert first.status_code == 200, first.text
    assert {k: first.json()[k] for k in ("written", "skipped", "parked")} == {
        "written": 2,
        "skipped": 0,
        "parked": 2,
    }
    again = api.post(url, json=body, headers=mo).json()
    assert (again["version"], again["written"], again["skipped"]) == (None, 0, 4)
    letters = api.get("/api/v1/datasets/orders/dead-letters", headers=mo)
    assert letters.status_code == 200
    assert sorted(d["key"] for d in letters.json()) == ["2-0", "4-0"]
    assert "n/a" not in letters.text
    assert (
        api.get("/api/v1/datasets/orders/dead-letters", headers=people.headers("bo")).status_code
        == 404
    )
    hostile = [
        {**body, "stream": "amqp://guest:guest@rabbit/orders"},
        {**body, "extra": 1},
        {**body, "records": [{"key": "", "row": {"id": 1, "total": 1.0}}]},
        {**body, "records": [{"key": "x", "row": [1, 2]}]},
        {**body, "dead": [{"key": "x", "reason": "r", "digest": "zz", "size": 1}]},
    ]
    for case in hostile:
        answer = api.post(url, json=case, headers=mo)
        assert answer.status_code == 400, (case, answer.text)
        assert "guest" not in answer.text
    assert _rows(api, people) == 2
