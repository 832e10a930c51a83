"""Who may call `shamal serve` (issue 18): the Host allow-list, bearer tokens on every route
but the probes (REST and gRPC, through the stock tritonclient), and the control plane's
answer for platform tokens."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from shamal.errors import PermissionDenied, Unauthenticated
from shamal.executors._procfs import free_port
from shamal.serving._access import PlatformAccess, registered_model_path
from tests.serving.conftest import REPO, ServerProcess

TOKEN = "serve-token-for-tests-0123456789"
GOOD = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}


@pytest.fixture
def guarded(
    start_server: Callable[..., ServerProcess], model_store: dict[str, Path]
) -> tuple[ServerProcess, int]:
    grpc_port = free_port()
    model = f"identity_fp32={model_store['identity_fp32']}"
    env = {"SHAMAL_SERVE_TOKEN": TOKEN}
    server = start_server("--model", model, "--auth", "--grpc-port", str(grpc_port), env=env)
    return server, grpc_port


def test_rest_routes_but_the_probes_need_the_token(guarded: tuple[ServerProcess, int]) -> None:
    server, _ = guarded
    for path in ("/v2/health/live", "/v2/health/ready", "/metrics"):
        assert httpx.get(server.url + path, timeout=30).status_code == 200, path
    infer = "/v2/models/identity_fp32/infer"
    for method, path in [
        ("GET", "/v2"),
        ("GET", "/v2/models"),
        ("GET", "/v2/models/identity_fp32"),
        ("GET", "/v2/models/identity_fp32/ready"),
        ("POST", infer),
        ("POST", "/v2/models/no_such_model/infer"),
    ]:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            answer = httpx.request(method, server.url + path, json=GOOD, headers=headers)
            assert answer.status_code == 401, (path, headers, answer.text)
            assert answer.headers["www-authenticate"].startswith("Bearer")
    ok = httpx.post(server.url + infer, json=GOOD, headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200, ok.text


def test_tritonclient_sends_the_token_over_rest_and_grpc(
    guarded: tuple[ServerProcess, int],
) -> None:
    import tritonclient.grpc as triton_grpc
    import tritonclient.http as triton_http
    from tritonclient.utils import InferenceServerException

    server, grpc_port = guarded
    row = np.arange(4, dtype=np.float32).reshape(1, 4)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    rest = triton_http.InferenceServerClient(server.host_port)
    tensor = triton_http.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(row)
    with pytest.raises(InferenceServerException):
        rest.infer("identity_fp32", [tensor])
    got = rest.infer("identity_fp32", [tensor], headers=auth).as_numpy("OUTPUT0")
    assert np.array_equal(got, row)
    assert rest.is_server_live()
    rest.close()
    rpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    assert rpc.is_server_live()
    assert rpc.is_server_ready()
    grpc_tensor = triton_grpc.InferInput("INPUT0", [1, 4], "FP32")
    grpc_tensor.set_data_from_numpy(row)
    with pytest.raises(InferenceServerException, match="UNAUTHENTICATED"):
        rpc.infer("identity_fp32", [grpc_tensor])
    with pytest.raises(InferenceServerException, match="UNAUTHENTICATED"):
        rpc.get_model_metadata("identity_fp32")
    meta = rpc.get_model_metadata("identity_fp32", headers={"authorization": f"Bearer {TOKEN}"})
    assert meta.name == "identity_fp32"
    got = rpc.infer("identity_fp32", [grpc_tensor], headers={"authorization": f"Bearer {TOKEN}"})
    assert np.array_equal(got.as_numpy("OUTPUT0"), row)
    rpc.close()


def test_a_foreign_host_name_is_refused(oip_server: ServerProcess) -> None:
    url = f"{oip_server.url}/v2/models"
    assert httpx.get(url, headers={"Host": "attacker.example"}).status_code == 400
    assert httpx.get(url, headers={"Host": "attacker.example:80"}).status_code == 400
    assert httpx.get(url, headers={"Host": "localhost"}).status_code == 200
    assert httpx.get(url).status_code == 200  # 127.0.0.1:PORT


def test_local_files_on_a_public_address_need_a_choice(model_store: dict[str, Path]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHAMAL_")}
    done = subprocess.run(
        [sys.executable, "-m", "shamal", "serve", "--host", "0.0.0.0", "--http-port", "0"]
        + ["--model", f"m={model_store['identity_fp32']}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert "--auth" in done.stderr + done.stdout
    assert "Serving OIP REST" not in done.stdout


def _account(api: TestClient, name: str, team: str) -> str:
    assert api.post("/api/v1/users", json={"name": name}).status_code < 300
    assert api.post("/api/v1/teams", json={"name": team}).status_code < 300
    joined = api.put(f"/api/v1/teams/{team}/members/{name}", json={"role": "member"})
    assert joined.status_code < 300, joined.text
    secret: str = api.post("/api/v1/tokens", json={"name": "t", "user": name}).json()["secret"]
    return secret


def test_platform_tokens_are_checked_by_the_control_plane(api: TestClient) -> None:
    alice = _account(api, "alice", "vision")
    bob = _account(api, "bob", "speech")
    made = api.post(
        "/api/2.0/mlflow/registered-models/create",
        json={"name": "cat", "tags": [{"key": "shamal.team", "value": "vision"}]},
        headers={"Authorization": f"Bearer {alice}"},
    )
    assert made.status_code == 200, made.text
    now = [0.0]
    access = PlatformAccess(
        "http://control-plane",
        {"cat": registered_model_path("cat")},
        ttl_s=30.0,
        transport=httpx.ASGITransport(app=api.app),
        clock=lambda: now[0],
    )

    async def scenario() -> None:
        await access.check(alice, "cat")
        await access.check(alice, None)
        await access.check(alice, "not-served")  # a 404 comes after, from the server
        with pytest.raises(PermissionDenied):
            await access.check(bob, "cat")
        with pytest.raises(Unauthenticated):
            await access.check("shm_" + "x" * 43, "cat")
        with pytest.raises(Unauthenticated):
            await access.check(None, "cat")
        # Revoked: trusted until the cached answer expires, refused after.
        as_alice = {"Authorization": f"Bearer {alice}"}
        tokens = api.get("/api/v1/tokens", headers=as_alice).json()
        assert tokens
        for token in tokens:
            assert api.delete(f"/api/v1/tokens/{token['id']}").status_code < 300
        await access.check(alice, "cat")
        now[0] += 31.0
        with pytest.raises(Unauthenticated):
            await access.check(alice, "cat")
        await access.close()

    asyncio.run(scenario())
