"""MLflow's webhooks API through the app in-process: its shapes, who may use it, and
hostile inputs (a clear MLflow error, nothing changed). The stock client end to end is in
``test_mlflow_webhooks.py``."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from shamal.events import EventKind, EventService
from shamal.events._delivery import body_of
from shamal.events._filters import EventFilter
from shamal.server import Platform
from tests.events.conftest import People

BASE = "/api/2.0/mlflow/webhooks"
URL = "https://hooks.example.com/mlflow?token=abc"
CREATED = {"entity": "MODEL_VERSION", "action": "CREATED"}


def _made(api: TestClient, headers: dict[str, str], **fields: Any) -> dict[str, Any]:
    body = {"name": "to-ci", "url": URL, "events": [CREATED], **fields}
    answer = api.post(BASE, json=body, headers=headers)
    assert answer.status_code == 200, answer.text
    hook: dict[str, Any] = answer.json()["webhook"]
    return hook


def _listed(api: TestClient, headers: dict[str, str]) -> list[dict[str, Any]]:
    hooks: list[dict[str, Any]] = api.get(BASE, headers=headers).json().get("webhooks", [])
    return hooks


def test_an_mlflow_webhook_is_made_read_changed_and_deleted(
    api: TestClient, platform: Platform, people: People
) -> None:
    rita = people.headers("rita")
    hook = _made(api, rita, description="tell CI", secret="s" * 20)
    assert set(hook) == {
        "webhook_id",
        "name",
        "description",
        "url",
        "events",
        "status",
        "creation_timestamp",
        "last_updated_timestamp",
    }
    assert (hook["name"], hook["description"], hook["status"]) == ("to-ci", "tell CI", "ACTIVE")
    assert hook["events"] == [CREATED]
    assert isinstance(hook["creation_timestamp"], int)
    assert hook["creation_timestamp"] > 1e12
    path = f"{BASE}/{hook['webhook_id']}"
    assert api.get(path, headers=rita).json() == {"webhook": hook}
    # Underneath it is a webhook of the stream, in MLflow's format, of team red.
    native = api.get(f"/api/v1/webhooks/{hook['webhook_id']}", headers=rita).json()
    assert (native["team"], native["filter"]) == ("red", "model_version_registered")
    assert (native["format"], native["description"]) == ("mlflow", "tell CI")
    changed = api.patch(
        path,
        json={
            "name": "to-cd",
            "status": "DISABLED",
            "events": [
                {"entity": "MODEL_VERSION_ALIAS", "action": "CREATED"},
                {"entity": "MODEL_VERSION", "action": "CREATED"},
            ],
        },
        headers=rita,
    )
    assert changed.status_code == 200, changed.text
    now = changed.json()["webhook"]
    assert (now["name"], now["status"], now["description"]) == ("to-cd", "DISABLED", "tell CI")
    assert [e["entity"] for e in now["events"]] == ["MODEL_VERSION_ALIAS", "MODEL_VERSION"]
    assert now["last_updated_timestamp"] >= hook["last_updated_timestamp"]
    native = api.get(f"/api/v1/webhooks/{hook['webhook_id']}", headers=rita).json()
    assert native["active"] is False
    wanted = EventFilter.parse(native["filter"])
    moved = {"name": "m", "alias": "prod", "version": 2}
    assert wanted.matches(_event(EventKind.MODEL_ALIAS_MOVED, moved))
    assert not wanted.matches(_event(EventKind.MODEL_ALIAS_MOVED, {**moved, "version": None}))
    assert [h["name"] for h in _listed(api, rita)] == ["to-cd"]
    assert api.delete(path, headers=rita).json() == {}
    assert api.get(path, headers=rita).json()["error_code"] == "RESOURCE_DOES_NOT_EXIST"
    actions = {e.action for e in platform.audit.entries(limit=50, actor="rita")}
    assert {"webhook.create", "webhook.update", "webhook.active", "webhook.delete"} <= actions


def _event(kind: EventKind, payload: dict[str, Any]) -> Any:
    from datetime import UTC, datetime

    from shamal.events import Event

    return Event(1, kind, "models:/m/1", "red", "mo", payload, datetime.now(UTC))


def test_pages_and_native_webhooks_stay_apart(
    api: TestClient, platform: Platform, people: People
) -> None:
    rita = people.headers("rita")
    for n in range(5):
        _made(api, rita, name=f"h{n}")
    native = {"name": "native", "url": URL, "filter": "*"}
    assert api.post("/api/v1/webhooks", json=native, headers=rita).status_code == 201
    seen, token = [], None
    while True:
        params: dict[str, Any] = {"max_results": 2}
        if token:
            params["page_token"] = token
        page = api.get(BASE, params=params, headers=rita).json()
        seen += [h["name"] for h in page["webhooks"]]
        token = page.get("next_page_token")
        if not token:
            break
    assert seen == [f"h{n}" for n in range(5)]
    everything = api.get(BASE, params={"max_results": 1000}, headers=rita).json()
    assert len(everything["webhooks"]) == 5
    assert "next_page_token" not in everything
    native_id = api.get("/api/v1/webhooks", headers=rita).json()["webhooks"][-1]["id"]
    assert api.get(f"{BASE}/{native_id}", headers=rita).status_code == 404


def test_only_maintainers_and_admins_manage_them(
    api: TestClient, platform: Platform, people: People
) -> None:
    hook = _made(api, people.headers("rita"))
    path = f"{BASE}/{hook['webhook_id']}"
    for who in ("mo", "vi"):
        refused = api.post(
            BASE, json={"name": "x", "url": URL, "events": [CREATED]}, headers=people.headers(who)
        )
        assert refused.json()["error_code"] == "PERMISSION_DENIED", who
        assert api.get(path, headers=people.headers(who)).status_code in (403, 404)
    assert api.get(path, headers=people.headers("bo")).status_code == 404
    assert api.delete(path, headers=people.headers("bo")).status_code == 404
    assert _listed(api, people.headers("bo")) == []
    assert [h["webhook_id"] for h in _listed(api, {})] == [hook["webhook_id"]]  # the admin


HOSTILE: list[tuple[dict[str, Any], str]] = [
    ({"url": "http://127.0.0.1:8080/hook"}, "SHAMAL_EVENTS__ALLOW_PRIVATE_WEBHOOKS"),
    ({"url": "http://169.254.169.254/latest/meta-data"}, "refused"),
    ({"url": "file:///etc/passwd"}, "http"),
    *(
        ({"url": url}, "refused")
        for url in (
            "http://localhost:8080/x",
            "http://[::ffff:127.0.0.1]/x",
            "http://2130706433/x",
            "http://0x7f000001/x",
            "http://127.1/x",
            "http://0.0.0.0/x",
            "http://metadata.google.internal/x",
            "http://100.100.100.200/x",
            "http://[fd00:ec2::254]/x",
        )
    ),
    ({"url": "http://good.example@127.0.0.1/x"}, ""),
    ({"url": "gopher://127.0.0.1:6379/_SET"}, "http"),
    ({"url": "http://[::1]/x"}, "refused"),
    ({"events": [{"entity": "PROMPT", "action": "CREATED"}]}, "model_version.created"),
    ({"events": [{"entity": "BUDGET_POLICY", "action": "EXCEEDED"}]}, "supported events"),
    ({"events": [{"entity": "NOPE", "action": "CREATED"}]}, "not supported"),
    ({"events": [{"entity": "MODEL_VERSION"}]}, "action"),
    ({"events": ["model_version.created"]}, "entity"),
    ({"events": []}, "events"),
    ({"events": [CREATED] * 40}, "at most"),
    ({"name": "x" * 100_000}, "name"),
    ({"name": "../../etc"}, "name"),
    ({"name": "a\u202eb"}, "name"),
    ({"name": ""}, "name"),
    ({"status": "PAUSED"}, "ACTIVE or DISABLED"),
    ({"secret": "short"}, "secret"),
    ({"secret": "x" * 5000}, "secret"),
    ({"description": "d" * 10_000}, "description"),
    ({"team": "../red"}, ""),
]


@pytest.mark.parametrize(("change", "said"), HOSTILE)
def test_hostile_creations_are_refused_clearly(
    api: TestClient, people: People, change: dict[str, Any], said: str
) -> None:
    body = {"name": "hook", "url": URL, "events": [CREATED], **change}
    answer = api.post(BASE, json=body, headers=people.headers("rita"))
    assert 400 <= answer.status_code < 500, answer.text
    error = answer.json()
    assert set(error) >= {"error_code", "message"}
    assert said in error["message"]
    assert "Traceback" not in error["message"]
    assert len(error["message"]) < 600
    assert _listed(api, people.headers("rita")) == []


def test_hostile_changes_and_ids_change_nothing(api: TestClient, people: People) -> None:
    rita = people.headers("rita")
    hook = _made(api, rita)
    path = f"{BASE}/{hook['webhook_id']}"
    for change in (
        {"url": "http://10.0.0.1/x"},
        {"url": "http://127.0.0.1:5432/"},
        {"events": [{"entity": "REGISTERED_MODEL", "action": "CREATED"}]},
        {"status": 1},
        {"name": "y" * 1000},
        {"secret": "\n" * 20},
    ):
        answer = api.patch(path, json=change, headers=rita)
        assert answer.status_code == 400, (change, answer.text)
    assert api.get(path, headers=rita).json() == {"webhook": hook}
    for bad in ("nope", "0" * 32, "..%2F" * 10, "a" * 5000, "%00"):
        assert api.get(f"{BASE}/{bad}", headers=rita).status_code in (400, 404), bad
        assert api.delete(f"{BASE}/{bad}", headers=rita).status_code in (400, 404), bad
    for params in (
        {"max_results": "0"},
        {"max_results": "99999"},
        {"page_token": "-1"},
        {"page_token": "x" * 100},
        {"max_results": "1e400"},
    ):
        assert api.get(BASE, params=params, headers=rita).status_code == 400, params
    for body in ({"event": {"entity": "PROMPT", "action": "CREATED"}}, {"event": "x"}):
        answer = api.post(f"{path}/test", json=body, headers=rita)
        assert answer.status_code == 400, answer.text


def test_a_test_send_to_an_unreachable_receiver_says_so(
    api: TestClient, platform: Platform, people: People
) -> None:
    hook = _made(api, {}, url="https://hooks.invalid/mlflow")  # the admin's: a platform hook
    answer = api.post(f"{BASE}/{hook['webhook_id']}/test", json={}, headers={})
    assert answer.status_code == 200, answer.text
    result = answer.json()["result"]
    assert result["success"] is False
    assert result["error_message"]
    assert "hooks.invalid/mlflow" not in result["error_message"]


def test_the_courier_sends_mlflow_bodies_and_skips_what_mlflow_lacks(
    events: EventService, people: People
) -> None:
    from dataclasses import replace

    hook, _ = events.create_webhook(people.ctx("rita"), "h", URL, "*")
    registered = _event(EventKind.MODEL_VERSION_REGISTERED, {"name": "m", "version": 3})
    job = _event(EventKind.JOB_FINISHED, {"state": "failed"})
    assert body_of(hook, job) is not None  # Shamal's format carries every event
    mlflow = replace(hook, format="mlflow")
    assert body_of(mlflow, job) is None
    body = body_of(mlflow, registered)
    assert body is not None
    assert b'"model_version"' in body
    assert b'"version": "3"' in body
