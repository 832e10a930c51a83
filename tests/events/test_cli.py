"""`shamal events` and `shamal webhooks` against a real server process: the stream as a
table and as JSON, a webhook made (its secret printed once), delivered to, paused, resumed
and deleted, and clear errors for hostile input."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.datasets._cli import Shamal, cli_against
from tests.events.test_mlflow_webhooks import Receiver, receiver
from tests.live import LiveServer
from tests.polling import wait_for

pytestmark = pytest.mark.slow

__all__ = ["receiver"]

SECRET = "cli-webhook-secret-0123456789"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    env = {"SHAMAL_EVENTS__ALLOW_PRIVATE_WEBHOOKS": "true"}
    with LiveServer(tmp_path_factory.mktemp("events-cli-home"), env=env) as live:
        yield live


@pytest.fixture
def shamal(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> Shamal:
    return cli_against(server, monkeypatch, columns=200)


def _register(server: LiveServer, name: str) -> None:
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=server.url, registry_uri=server.url)
    experiment = client.create_experiment(f"cli-{name}")
    run = client.create_run(experiment)
    client.create_registered_model(name)
    client.create_model_version(name, f"runs:/{run.info.run_id}/model", run_id=run.info.run_id)


def test_webhooks_from_the_command_line(
    shamal: Shamal,
    server: LiveServer,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", server.token)
    code, out = shamal(
        "webhooks", "create", "alerts", receiver.url, "--on", "model_version_registered",
        "--secret", SECRET,
    )  # fmt: skip
    assert code == 0, out
    assert SECRET in out
    code, out = shamal("webhooks", "list", "--json")
    assert code == 0, out
    (hook,) = json.loads(out)
    assert (hook["name"], hook["filter"], hook["active"]) == (
        "alerts",
        "model_version_registered",
        True,
    )
    assert "secret" not in hook
    code, out = shamal("webhooks", "list")
    assert "alerts" in out
    assert "active" in out
    assert SECRET not in out

    _register(server, "churn")
    code, out = shamal("events", "list", "--kind", "model_version_registered")
    assert code == 0, out
    assert "models:/churn/1" in out
    code, out = shamal("events", "list", "--where", "name = 'nope'", "--json")
    assert json.loads(out)["events"] == []
    code, out = shamal("events", "list", "--json")
    (event,) = [e for e in json.loads(out)["events"] if e["kind"] == "model_version_registered"]
    code, out = shamal("events", "list", "--after", str(event["id"]), "--json")
    assert all(e["id"] > event["id"] for e in json.loads(out)["events"])

    def delivered() -> list[dict[str, Any]]:
        code, out = shamal("webhooks", "deliveries", hook["id"], "--json")
        assert code == 0, out
        return [d for d in json.loads(out) if d["ok"]]

    (done,) = wait_for(delivered, what="the delivery", deadline_s=30)
    assert done["event_id"] == event["id"]
    code, out = shamal("webhooks", "deliveries", hook["id"])
    assert code == 0, out
    assert str(event["id"]) in out

    code, out = shamal("webhooks", "pause", hook["id"])
    assert (code, "paused" in out) == (0, True)
    code, out = shamal("webhooks", "resume", hook["id"])
    assert (code, "resumed" in out) == (0, True)
    code, out = shamal("webhooks", "delete", hook["id"])
    assert code == 0, out
    code, out = shamal("webhooks", "list", "--json")
    assert json.loads(out) == []


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("events", "list", "--kind", "nope"), "kind"),
        (("events", "list", "--where", "(" * 500), "filter"),
        (("webhooks", "create", "x", "file:///etc/passwd", "--on", "*"), "url"),
        (("webhooks", "create", "x", "https://h.example.com", "--on", "not_a_kind"), "kind"),
        (("webhooks", "create", "../x", "https://h.example.com", "--on", "*"), "name"),
        (("webhooks", "create", "x", "https://h.example.com", "--on", "*", "--secret", "s"),
         "secret"),
        (("webhooks", "deliveries", "../../etc"), ""),
        (("webhooks", "pause", "0" * 32), "does not exist"),
        (("webhooks", "delete", "%2e%2e"), ""),
    ],
)  # fmt: skip
def test_hostile_input_gets_a_clear_error(shamal: Shamal, args: tuple[str, ...], said: str) -> None:
    code, out = shamal(*args)
    assert code != 0, out
    assert "Traceback" not in out
    assert said.lower() in out.lower()
    code, out = shamal("webhooks", "list", "--json")
    assert json.loads(out) == []
