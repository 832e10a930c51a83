"""The HTTP API of events and webhooks, through the app in-process."""

from __future__ import annotations

from fastapi.testclient import TestClient

from shamal.events import EventKind
from shamal.server import Platform
from tests.events.conftest import People, record

URL = "https://hooks.example.com/in?token=abc"


def test_the_stream_reads_by_position_kind_and_filter(
    api: TestClient, platform: Platform, people: People
) -> None:
    first = record(platform, state="failed")
    second = record(platform, state="succeeded")
    drift = record(platform, EventKind.DRIFT_DETECTED)
    got = api.get("/api/v1/events").json()
    assert [e["id"] for e in got["events"]] == [first, second, drift]
    assert got["next_after"] == drift
    assert got["events"][0]["payload"] == {"state": "failed"}
    after = api.get("/api/v1/events", params={"after": first, "kind": "job_finished"}).json()
    assert [e["id"] for e in after["events"]] == [second]
    failed = api.get("/api/v1/events", params={"where": "state = 'failed'"}).json()
    assert [e["id"] for e in failed["events"]] == [first]
    # Team blue's member sees none of team red's events.
    blue = api.get("/api/v1/events", headers=people.headers("bo")).json()
    assert blue["events"] == []
    red = api.get("/api/v1/events", headers=people.headers("vi")).json()
    assert [e["id"] for e in red["events"]] == [first, second, drift]


def test_hostile_stream_queries_are_refused_clearly(api: TestClient, platform: Platform) -> None:
    record(platform)
    for params in (
        {"where": "x" * 10_000},
        {"where": "(" * 2000 + "a = 1" + ")" * 2000},
        {"where": "name = ''; DROP TABLE events; --"},
        {"where": "__import__('os').system('id') = 1"},
        {"kind": "nope"},
        {"after": "-1"},
        {"limit": "0"},
        {"limit": "100000"},
    ):
        answer = api.get("/api/v1/events", params=params)
        assert answer.status_code == 400, params
        body = answer.json()
        assert body["error_code"] == "INVALID_PARAMETER_VALUE"
        assert "Traceback" not in body["message"]
        assert len(body["message"]) < 500
    assert len(api.get("/api/v1/events").json()["events"]) == 1


def test_webhooks_are_made_read_paused_and_deleted(
    api: TestClient, platform: Platform, people: People
) -> None:
    rita = people.headers("rita")
    made = api.post(
        "/api/v1/webhooks",
        json={"name": "alerts", "url": URL, "filter": "job_finished where state='failed'"},
        headers=rita,
    )
    assert made.status_code == 201, made.text
    hook = made.json()
    assert len(hook["secret"]) >= 32
    assert (hook["team"], hook["filter"]) == ("red", "job_finished where state = 'failed'")
    path = f"/api/v1/webhooks/{hook['id']}"
    listed = api.get("/api/v1/webhooks", headers=rita).json()["webhooks"]
    assert [h["id"] for h in listed] == [hook["id"]]
    assert "secret" not in listed[0]
    assert "secret" not in api.get(path, headers=rita).json()
    assert api.get(path, headers=people.headers("bo")).status_code == 404
    assert api.get(path, headers=people.headers("mo")).status_code in (403, 404)
    paused = api.put(f"{path}/active", json={"active": False}, headers=rita)
    assert paused.json()["active"] is False
    assert api.get(f"{path}/deliveries", headers=rita).json() == {"deliveries": []}
    assert api.delete(path, headers=people.headers("bo")).status_code == 404
    assert api.delete(path, headers=rita).status_code == 204
    assert api.get(path, headers=rita).status_code == 404
    actions = [
        (e.action, e.outcome) for e in reversed(platform.audit.entries(limit=20, actor="rita"))
    ]
    assert actions[-3:] == [
        ("webhook.create", "ok"),
        ("webhook.active", "ok"),
        ("webhook.delete", "ok"),
    ]


def test_hostile_webhooks_are_refused_and_nothing_is_made(api: TestClient, people: People) -> None:
    rita = people.headers("rita")
    base = {"name": "h", "url": URL, "filter": "*"}
    for body, status in (
        ({**base, "url": "file:///etc/passwd"}, 400),
        ({**base, "url": "http://example.com/\r\nX-Injected: 1"}, 400),
        ({**base, "filter": "* where a = '"}, 400),
        ({**base, "filter": "x" * 100_000}, 400),
        ({**base, "name": "../../etc"}, 400),
        ({**base, "unknown": 1}, 400),
        ({**base, "allow_private": True}, 403),
    ):
        answer = api.post("/api/v1/webhooks", json=body, headers=rita)
        assert answer.status_code == status, (body, answer.text)
    assert api.post("/api/v1/webhooks", json=base, headers=people.headers("mo")).status_code == 403
    for bad in ("..%2F..%2Fetc%2Fpasswd", "x" * 5000, "ABCDEF", "%00"):
        assert api.get(f"/api/v1/webhooks/{bad}", headers=rita).status_code in (400, 404)
    assert api.get("/api/v1/webhooks").json() == {"webhooks": []}


def test_the_delivery_log_is_the_maintainers(api: TestClient, people: People) -> None:
    made = api.post(
        "/api/v1/webhooks",
        json={"name": "h", "url": URL, "filter": "*"},
        headers=people.headers("rita"),
    ).json()
    path = f"/api/v1/webhooks/{made['id']}/deliveries"
    assert api.get(path, headers=people.headers("vi")).status_code in (403, 404)
    assert api.get(path).status_code == 200  # the admin
