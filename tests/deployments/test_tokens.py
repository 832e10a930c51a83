"""Deployment tokens: what a deployment's callers hold. It calls that deployment's models
through ``shamal serve`` (whose check is a read of the deployment) and nothing else."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi.testclient import TestClient

from shamal.errors import PermissionDenied
from shamal.serving._access import PlatformAccess, deployment_path
from tests.serving.test_auth import _account


def _as(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def _deploy(api: TestClient, owner: str, name: str) -> None:
    made = api.post(
        "/api/2.0/mlflow/registered-models/create",
        json={"name": name, "tags": [{"key": "shamal.team", "value": "vision"}]},
        headers=_as(owner),
    )
    assert made.status_code == 200, made.text
    experiment = api.post(
        "/api/2.0/mlflow/experiments/create",
        json={"name": f"{name}-training", "tags": [{"key": "shamal.team", "value": "vision"}]},
        headers=_as(owner),
    ).json()["experiment_id"]
    run = api.post(
        "/api/2.0/mlflow/runs/create", json={"experiment_id": experiment}, headers=_as(owner)
    ).json()["run"]["info"]["run_id"]
    version = api.post(
        "/api/2.0/mlflow/model-versions/create",
        json={"name": name, "source": f"runs:/{run}/model", "run_id": run},
        headers=_as(owner),
    )
    assert version.status_code == 200, version.text
    deployed = api.put(
        f"/api/v1/deployments/{name}",
        json={"primary": [{"model": f"models:/{name}/1"}], "team": "vision"},
        headers=_as(owner),
    )
    assert deployed.status_code < 300, deployed.text


@pytest.fixture
def scoped(api: TestClient) -> tuple[str, str]:
    """Alice's deployment ``cat`` and a token scoped to it; her own token too."""
    alice = _account(api, "alice", "vision")
    _deploy(api, alice, "cat")
    _deploy(api, alice, "dog")
    issued = api.post(
        "/api/v1/deployments/cat/tokens", json={"name": "callers"}, headers=_as(alice)
    )
    assert issued.status_code == 201, issued.text
    assert issued.json()["scope"] == "deployment:cat"
    return str(issued.json()["secret"]), alice


def test_a_deployment_token_reads_its_deployment_and_nothing_else(
    api: TestClient, scoped: tuple[str, str]
) -> None:
    token, _ = scoped
    assert api.get("/api/v1/deployments/cat", headers=_as(token)).status_code == 200
    assert api.get("/api/v1/whoami", headers=_as(token)).json()["scope"] == "deployment:cat"
    refused = [
        ("GET", "/api/v1/deployments/dog", None),
        ("GET", "/api/v1/deployments", None),
        ("PUT", "/api/v1/deployments/cat", {"primary": [{"model": "models:/cat/1"}]}),
        ("POST", "/api/v1/deployments/cat/rollback", {}),
        ("POST", "/api/v1/deployments/cat/tokens", {"name": "more"}),
        ("POST", "/api/v1/tokens", {"name": "more"}),
        ("GET", "/api/v1/jobs", None),
        ("GET", "/api/2.0/mlflow/experiments/search", None),
        ("GET", "/api/2.0/mlflow/registered-models/get?name=cat", None),
    ]
    for method, path, body in refused:
        answer = api.request(method, path, json=body, headers=_as(token))
        assert answer.status_code == 403, (method, path, answer.status_code, answer.text)


def test_only_someone_who_can_read_the_deployment_gets_a_token_for_it(
    api: TestClient, scoped: tuple[str, str]
) -> None:
    bob = _account(api, "bob", "speech")
    answer = api.post("/api/v1/deployments/cat/tokens", json={"name": "x"}, headers=_as(bob))
    assert answer.status_code == 404


def test_serve_lets_a_deployment_token_call_its_deployment_only(
    api: TestClient, scoped: tuple[str, str]
) -> None:
    token, alice = scoped

    def access_for(name: str) -> PlatformAccess:
        return PlatformAccess(
            "http://control-plane",
            {name: deployment_path(name)},
            ttl_s=30.0,
            transport=httpx.ASGITransport(app=api.app),
        )

    async def scenario() -> None:
        cat, dog = access_for("cat"), access_for("dog")
        await cat.check(token, "cat")
        await cat.check(alice, "cat")
        with pytest.raises(PermissionDenied):
            await dog.check(token, "dog")
        await dog.check(alice, "dog")
        await cat.close()
        await dog.close()

    asyncio.run(scenario())
