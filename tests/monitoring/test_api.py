"""The monitoring API as clients call it: audited changes, clear 4xx for hostile bodies,
other teams' monitors answering 404, and a webhook made for an alert URL."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from shamal.deployments._service import DeploymentService
from shamal.server import Platform
from tests.monitoring.conftest import DEPLOYMENT, MODEL, People, send

BASE = "/api/v1/monitors"


def _body(**change: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"deployment": DEPLOYMENT, "schedule_s": 3600}
    body.update(change)
    return body


@pytest.mark.usefixtures("reference")
def test_a_monitor_is_made_run_and_read_over_http_and_audited(
    api: TestClient, people: People, deployments: DeploymentService, platform: Platform
) -> None:
    made = api.post(BASE, json=_body(name="watch", window=500), headers=people.headers("mo"))
    assert made.status_code == 200, made.text
    assert made.json()["reference"] == {"model": MODEL, "version": 1, "follows_primary": True}
    send(deployments, people, samples=5)
    ran = api.post(f"{BASE}/watch/run", headers=people.headers("mo"))
    assert ran.status_code == 200, ran.text
    result = ran.json()["result"]
    assert result["samples"] == 5
    series = api.get(f"{BASE}/watch/series", headers=people.headers("vi")).json()["points"]
    assert {p["column"] for p in series} == {"amount", "country", "score"}
    listed = api.get(BASE, params={"deployment": DEPLOYMENT}, headers=people.headers("vi"))
    assert [m["name"] for m in listed.json()["monitors"]] == ["watch"]
    actions = [e.action for e in platform.audit.entries(limit=50) if e.target == "monitor:watch"]
    assert {"monitor.create", "monitor.run"} <= set(actions)
    assert api.post(f"{BASE}/watch/pause", headers=people.headers("mo")).json()["paused"]
    gone = api.delete(f"{BASE}/watch", headers=people.headers("rita"))
    assert gone.status_code == 204
    assert api.get(f"{BASE}/watch", headers=people.headers("mo")).status_code == 404


@pytest.mark.usefixtures("reference", "deployments")
@pytest.mark.parametrize(
    "body",
    [
        _body(threshold="NaN"),
        _body(threshold=-1),
        _body(drift_share=0),
        _body(schedule_s=1),
        _body(window=0),
        _body(on_drift="retrain:"),
        _body(on_drift="shell:rm -rf /"),
        _body(tests={"amount": "t-test"}),
        _body(correction="fdr"),
        _body(columns=["x\x00y"]),
        _body(unknown_key=1),
        _body(deployment="../../etc/passwd"),
        _body(name="Has Spaces"),
        _body(reference={"model": MODEL, "version": 0}),
    ],
)
def test_hostile_bodies_are_refused_and_nothing_is_made(
    api: TestClient, people: People, body: dict[str, Any]
) -> None:
    answer = api.post(BASE, json=body, headers=people.headers("mo"))
    assert answer.status_code in (400, 422), answer.text
    assert "Traceback" not in answer.text
    assert api.get(BASE).json()["monitors"] == []


@pytest.mark.usefixtures("reference", "deployments")
def test_another_teams_monitor_answers_404_everywhere(api: TestClient, people: People) -> None:
    assert api.post(BASE, json=_body(name="watch"), headers=people.headers("mo")).status_code == 200
    for method, path in [
        ("GET", f"{BASE}/watch"),
        ("GET", f"{BASE}/watch/results"),
        ("GET", f"{BASE}/watch/series"),
        ("POST", f"{BASE}/watch/run"),
        ("POST", f"{BASE}/watch/pause"),
        ("DELETE", f"{BASE}/watch"),
    ]:
        assert api.request(method, path, headers=people.headers("bo")).status_code == 404
    refused = api.post(BASE, json=_body(name="theirs"), headers=people.headers("bo"))
    assert refused.status_code == 404
    assert api.get(BASE, headers=people.headers("bo")).json()["monitors"] == []


@pytest.mark.usefixtures("reference", "deployments")
def test_an_alert_url_subscribes_a_webhook_to_the_monitors_drift(
    api: TestClient, people: People, platform: Platform
) -> None:
    alert = "https://hooks.example.com/drift"
    # A webhook needs a maintainer: a member's alert is refused, and no monitor is left.
    refused = api.post(BASE, json=_body(name="w", alert_url=alert), headers=people.headers("mo"))
    assert refused.status_code == 403
    assert api.get(BASE).json()["monitors"] == []
    made = api.post(BASE, json=_body(name="w", alert_url=alert), headers=people.headers("rita"))
    assert made.status_code == 200, made.text
    hook = platform.events.get_webhook(people.principals["rita"], made.json()["webhook_id"])
    assert hook.url == alert
    assert hook.filter == "drift_detected where monitor = 'w'"
    assert api.delete(f"{BASE}/w", headers=people.headers("rita")).status_code == 204
    assert platform.events.list_webhooks(people.principals["rita"]) == []


@pytest.mark.usefixtures("references")
def test_sketches_are_uploaded_and_bad_ones_refused_over_http(
    api: TestClient, people: People
) -> None:
    path = f"/api/v1/monitor-references/{MODEL}/versions/1"
    bad = api.post(
        f"{path}/sketches",
        json={"sketches": {"score": {"name": "score", "kind": "numeric", "count": "many"}}},
        headers=people.headers("mo"),
    )
    assert bad.status_code == 400, bad.text
    assert api.get(path, headers=people.headers("mo")).status_code == 404
    built = api.post(
        f"{path}/build",
        json={"dataset": "txns/1", "label": "is_fraud"},
        headers=people.headers("mo"),
    )
    assert built.status_code == 200, built.text
    assert built.json()["columns"]["is_fraud"]["role"] == "label"
