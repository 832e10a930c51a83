"""Reads of sensitive objects are audited where the operator turns it on
(``SHAMAL_AUDIT_READS=true``): artifact downloads through the Shamal API and the
MLflow-artifacts proxy, and so the files of registered models, which the stock client
downloads through that proxy. Off by default."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from shamal.config import Settings
from shamal.security import AuditEntry
from shamal.server import Platform, create_app, start_platform
from tests.live import LiveServer


@pytest.fixture(params=[True, False], ids=["on", "off"])
def reads_api(request: pytest.FixtureRequest, settings: Settings) -> Iterator[TestClient]:
    platform = start_platform(settings.model_copy(update={"audit_reads": request.param}))
    try:
        with TestClient(create_app(platform.settings, platform)) as client:
            client.headers["Authorization"] = f"Bearer {platform.admin_secret}"
            client.app_state = platform  # type: ignore[attr-defined]
            yield client
    finally:
        platform.close()


def _reads(api: TestClient) -> list[AuditEntry]:
    platform: Platform = api.app_state  # type: ignore[attr-defined]
    return list(reversed(platform.audit.entries(limit=100, action="artifact.read")))


def _member(api: TestClient, team: str, name: str) -> dict[str, str]:
    api.post("/api/v1/users", json={"name": name})
    assert api.put(f"/api/v1/teams/{team}/members/{name}", json={"role": "viewer"}).is_success
    secret = api.post("/api/v1/tokens", json={"name": "t", "user": name}).json()["secret"]
    return {"Authorization": f"Bearer {secret}"}


def test_artifact_downloads_are_audited_only_when_turned_on(reads_api: TestClient) -> None:
    api = reads_api
    on = bool(api.app_state.settings.audit_reads)  # type: ignore[attr-defined]
    for team in ("vision", "speech"):
        assert api.post("/api/v1/teams", json={"name": team}).status_code == 201
    vic = _member(api, "vision", "vic")
    sam = _member(api, "speech", "sam")
    assert api.put("/api/v1/artifacts/vision/w/model.bin", content=b"weights").status_code == 201
    got = api.get("/api/v1/artifacts/vision/w/model.bin", headers=vic)
    assert (got.status_code, got.content) == (200, b"weights")
    assert api.get("/api/v1/artifacts/vision/w/model.bin", headers=sam).status_code == 404
    # The same through the MLflow-artifacts proxy: a run's file.
    experiment = api.post(
        "/api/2.0/mlflow/experiments/create", json={"name": "e", "tags": []}
    ).json()["experiment_id"]
    run = api.post("/api/2.0/mlflow/runs/create", json={"experiment_id": experiment}).json()
    root = run["run"]["info"]["artifact_uri"].removeprefix("mlflow-artifacts:/")
    proxy = f"/api/2.0/mlflow-artifacts/artifacts/{root}/notes.txt"
    assert api.put(proxy, content=b"notes").is_success
    assert api.get(proxy).content == b"notes"

    reads = [(e.actor, e.target, e.outcome) for e in _reads(api)]
    if not on:
        assert reads == []
        return
    assert reads[0] == ("vic", "artifact:vision/w/model.bin", "ok")
    assert reads[1][0] == "sam"
    assert reads[1][2] == "resource_does_not_exist"
    assert reads[2] == ("admin", f"mlflow-artifacts:{root}/notes.txt", "ok")
    assert len(reads) == 3
    entry = _reads(api)[0]
    assert entry.detail["size"] == len(b"weights")
    assert api.get("/api/v1/audit/verify").json()["ok"] is True


def test_the_stock_client_s_model_downloads_are_audited(tmp_path: Path) -> None:
    import mlflow
    from mlflow import MlflowClient

    env = {"SHAMAL_AUDIT_READS": "true"}
    with LiveServer(tmp_path / "home", env) as server:
        os.environ["MLFLOW_TRACKING_TOKEN"] = server.token
        try:
            mlflow.set_tracking_uri(server.url)
            mlflow.set_registry_uri(server.url)
            client = MlflowClient()
            mlflow.set_experiment("audited-reads")
            folder = tmp_path / "model"
            folder.mkdir()
            (folder / "weights.bin").write_bytes(b"\x00" * 64)
            with mlflow.start_run() as run:
                mlflow.log_artifacts(str(folder), artifact_path="model")
            client.create_registered_model("reads")
            client.create_model_version(
                "reads", f"{run.info.artifact_uri}/model", run_id=run.info.run_id
            )
            local = mlflow.artifacts.download_artifacts(
                artifact_uri="models:/reads/1", dst_path=str(tmp_path / "dl")
            )
            assert (Path(local) / "weights.bin").read_bytes() == b"\x00" * 64
        finally:
            os.environ.pop("MLFLOW_TRACKING_TOKEN", None)
        headers = {"Authorization": f"Bearer {server.token}"}
        entries: list[dict[str, Any]] = httpx.get(
            f"{server.url}/api/v1/audit",
            params={"action": "artifact.read"},
            headers=headers,
        ).json()
    targets = [(e["actor"], e["target"], e["outcome"]) for e in entries]
    assert len(targets) == 1, targets
    actor, target, outcome = targets[0]
    assert (actor, outcome) == ("admin", "ok")
    assert target.startswith("mlflow-artifacts:")
    assert target.endswith("/model/weights.bin")
