"""A monitor through a real server process: a reference uploaded by a "training job" over
HTTP, samples posted to the deployment's log as serve processes post them, and the monitor
made, run and shown with `shamal monitor` (its plot written)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from shamal.cli import app
from shamal.client import ShamalClient
from shamal.monitoring import upload_predictions
from shamal.monitoring.core import SketchBuilder
from tests.live import LiveServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, str]]:
    """A server where ``mo``, a member of team red, registered ``fraud`` version 1; and
    mo's token."""
    with LiveServer(tmp_path_factory.mktemp("monitoring-home")) as running:
        admin = httpx.Client(
            base_url=running.url, headers={"Authorization": f"Bearer {running.token}"}, timeout=30
        )
        with admin:
            admin.post("/api/v1/teams", json={"name": "red"}).raise_for_status()
            admin.post("/api/v1/users", json={"name": "mo"}).raise_for_status()
            admin.put("/api/v1/teams/red/members/mo", json={"role": "member"}).raise_for_status()
            token = admin.post("/api/v1/tokens", json={"user": "mo", "name": "t"})
            secret = token.raise_for_status().json()["secret"]
        mo = httpx.Client(
            base_url=running.url, headers={"Authorization": f"Bearer {secret}"}, timeout=30
        )
        with mo:
            mlflow = "/api/2.0/mlflow"
            mo.post(
                f"{mlflow}/registered-models/create",
                json={"name": "fraud", "tags": [{"key": "shamal.team", "value": "red"}]},
            ).raise_for_status()
            mo.post(
                f"{mlflow}/model-versions/create",
                json={"name": "fraud", "source": "mlflow-artifacts:/0/model"},
            ).raise_for_status()
        yield running, secret


def _sketches(shift: float, rows: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "amount": rng.normal(100 + shift, 10, rows),
        "score": rng.beta(2, 5, rows) + shift / 100,
    }


def _post_samples(server: LiveServer, token: str, revision: int, shift: float, seed: int) -> None:
    samples = []
    for i in range(10):
        values = _sketches(shift, 50, seed + i)
        samples.append(
            {
                "revision": revision,
                "version": "1",
                "inputs": {
                    "amount": {"shape": [50], "datatype": "FP64", "data": values["amount"].tolist()}
                },
                "outputs": {
                    "score": {"shape": [50], "datatype": "FP64", "data": values["score"].tolist()}
                },
            }
        )
    headers = {"Authorization": f"Bearer {token}"}
    posted = httpx.post(
        f"{server.url}/api/v1/deployments/fraud-api/samples",
        json={"samples": samples},
        headers=headers,
        timeout=30,
    )
    assert posted.raise_for_status().json()["accepted"] == 10


def test_a_monitor_over_a_live_servers_sample_log(
    server: tuple[LiveServer, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    live, token = server
    monkeypatch.setenv("SHAMAL_URL", live.url)
    monkeypatch.setenv("SHAMAL_TOKEN", token)
    with ShamalClient(live.url, token) as api:
        _loop(api, live, token, tmp_path)


def _loop(api: ShamalClient, live: LiveServer, token: str, tmp_path: Path) -> None:
    deployed = api.deploy("fraud-api", {"primary": [{"model": "models:/fraud/1"}], "team": "red"})
    # The training job: sketches of its features (made by hand) and of its predictions on
    # them (sketched by the client from the arrays).
    builder = SketchBuilder({"amount": "numeric", "score": "numeric"})
    training = _sketches(0.0, 5000, 1)
    builder.update(training)
    sketches = {name: s.to_json() for name, s in builder.result().items()}
    api.upload_sketches("fraud", 1, {"amount": sketches["amount"]}, role="feature")
    uploaded = upload_predictions("fraud", 1, {"score": training["score"]})  # SHAMAL_URL, _TOKEN
    assert uploaded["columns"]["score"]["sketch"] == sketches["score"]
    cli = CliRunner()
    made = cli.invoke(app, ["monitor", "create", "fraud-api", "--schedule", "1h", "--json"])
    assert made.exit_code == 0, made.output
    assert json.loads(made.output)["name"] == "fraud-api-drift"
    _post_samples(live, token, deployed["revision"], 0.0, 100)
    calm = cli.invoke(app, ["monitor", "run", "fraud-api-drift", "--json"])
    assert calm.exit_code == 0, calm.output
    assert json.loads(calm.output)["result"]["drifted"] is False
    _post_samples(live, token, deployed["revision"], 30.0, 200)
    shifted = cli.invoke(app, ["monitor", "run", "fraud-api-drift"])
    assert shifted.exit_code == 0, shifted.output
    assert "DRIFT" in shifted.output
    plot = tmp_path / "drift.png"
    shown = cli.invoke(app, ["monitor", "show", "fraud-api-drift", "--plot", str(plot)])
    assert shown.exit_code == 0, shown.output
    assert "amount" in shown.output
    assert "score" in shown.output
    assert plot.read_bytes()[:4] == b"\x89PNG"
    events = api.request("GET", "/api/v1/events", params={"limit": 100})
    kinds = [e["kind"] for e in events["events"]]
    assert "drift_detected" in kinds
