"""The stock ``mlflow.MlflowClient`` webhooks API against a real server, end to end: a model
version registered with the client reaches a receiver as MLflow's ``model_version.created``
payload, signed so that MLflow's own HMAC recomputation verifies it.

The server lets webhooks reach loopback (``SHAMAL_EVENTS__ALLOW_PRIVATE_WEBHOOKS=true``) so
the receiver can live in the test; deliveries run from the scheduler loop every 2 s.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.live import LiveServer
from tests.polling import wait_for

pytestmark = pytest.mark.slow

SECRET = "mlflow-webhook-secret-0123456789"


@dataclass
class Receiver:
    url: str = ""
    got: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bodies(self) -> list[tuple[dict[str, str], dict[str, Any], bytes]]:
        with self.lock:
            return [(h, json.loads(b), b) for h, b in self.got]


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            with state.lock:
                state.got.append(({k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(200)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            del format, args

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/mlflow-hook"
    yield state
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    env = {"SHAMAL_EVENTS__ALLOW_PRIVATE_WEBHOOKS": "true"}
    with LiveServer(tmp_path_factory.mktemp("mlflow-hooks-home"), env=env) as live:
        yield live


@pytest.fixture
def client(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> Any:
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", server.token)
    mlflow.set_tracking_uri(server.url)  # process-global: other tests' servers may have set it
    mlflow.set_registry_uri(server.url)
    return mlflow.MlflowClient(tracking_uri=server.url, registry_uri=server.url)


def _verified(headers: dict[str, str], raw: bytes) -> bool:
    """MLflow's own recomputation of the signature (``mlflow.webhooks.delivery``)."""
    from mlflow.webhooks.delivery import _generate_hmac_signature

    expected = _generate_hmac_signature(
        SECRET, headers["x-mlflow-delivery-id"], headers["x-mlflow-timestamp"], raw.decode()
    )
    return expected == headers.get("x-mlflow-signature")


def _of(receiver: Receiver, entity: str, action: str) -> list[tuple[dict[str, str], Any, bytes]]:
    return [
        (h, body, raw)
        for h, body, raw in receiver.bodies()
        if (body.get("entity"), body.get("action")) == (entity, action)
    ]


def test_the_stock_client_manages_webhooks_and_gets_signed_mlflow_payloads(
    client: Any, receiver: Receiver
) -> None:
    from mlflow.entities.webhook import WebhookEvent, WebhookStatus
    from mlflow.exceptions import MlflowException

    hook = client.create_webhook(
        name="to-ci",
        url=receiver.url,
        events=["model_version.created"],
        description="tell CI",
        secret=SECRET,
    )
    assert (hook.name, hook.url, hook.description) == ("to-ci", receiver.url, "tell CI")
    assert hook.events == [WebhookEvent("model_version", "created")]
    assert hook.status == WebhookStatus.ACTIVE
    assert hook.secret is None  # never shown again
    assert client.get_webhook(hook.webhook_id).name == "to-ci"
    assert [h.webhook_id for h in client.list_webhooks()] == [hook.webhook_id]

    tested = client.test_webhook(hook.webhook_id)
    assert tested.success, tested
    assert tested.response_status == 200
    ((headers, body, raw),) = _of(receiver, "model_version", "created")
    assert body["data"]["name"] == "example_model"
    assert _verified(headers, raw)

    experiment = client.create_experiment("webhooks-e2e")
    run = client.create_run(experiment)
    client.create_registered_model("churn")
    client.create_model_version("churn", f"runs:/{run.info.run_id}/model", run_id=run.info.run_id)

    def delivered() -> list[tuple[dict[str, str], Any, bytes]]:
        return [
            d for d in _of(receiver, "model_version", "created") if d[1]["data"]["name"] == "churn"
        ]

    ((headers, body, raw),) = wait_for(delivered, deadline_s=30, what="the model_version.created")
    assert set(body) == {"entity", "action", "timestamp", "data"}
    assert body["data"] == {
        "name": "churn",
        "version": "1",
        "source": f"runs:/{run.info.run_id}/model",
        "run_id": run.info.run_id,
        "tags": {},
        "description": None,
    }
    assert _verified(headers, raw)
    assert not _verified({**headers, "x-mlflow-timestamp": "1"}, raw)

    changed = client.update_webhook(
        hook.webhook_id,
        events=["model_version_alias.created", "model_version.created"],
        status="DISABLED",
    )
    assert changed.status == WebhookStatus.DISABLED
    assert {str(e) for e in changed.events} == {
        "model_version_alias.created",
        "model_version.created",
    }
    client.update_webhook(hook.webhook_id, status="ACTIVE")
    client.set_registered_model_alias("churn", "prod", "1")  # delivered once resumed
    ((headers, body, raw),) = wait_for(
        lambda: _of(receiver, "model_version_alias", "created"), deadline_s=30, what="the alias"
    )
    assert body["data"] == {"name": "churn", "alias": "prod", "version": "1"}
    assert _verified(headers, raw)

    with pytest.raises(MlflowException, match="supported events"):
        client.create_webhook(name="prompts", url=receiver.url, events=["prompt.created"])
    with pytest.raises(MlflowException, match="RESOURCE_DOES_NOT_EXIST|does not exist"):
        client.get_webhook("0" * 32)
    client.delete_webhook(hook.webhook_id)
    assert list(client.list_webhooks()) == []
