"""``shamal serve --model NAME=models:/...`` downloads a registered version from a real platform
server and serves it under the registry's version number; ``--deployment NAME`` loads the
deployment's versions (a refused canary is reported, a refused primary stops start-up)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shamal.client import ShamalClient
from tests.live import LiveServer
from tests.polling import wait_until
from tests.serving.conftest import ServerProcess
from tests.serving.models import pickle_bomb, scale_model, write_manifest


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("platform")) as server:
        yield server


def _auth(platform: LiveServer) -> dict[str, str]:
    """A platform-served model asks for a Shamal token (the serve process checks it)."""
    return {"Authorization": f"Bearer {platform.token}"}


def _register(platform: LiveServer, folder: Path, name: str) -> int:
    with ShamalClient(platform.url, platform.token) as client:
        experiment = client.experiment_for_variants(None, "serving-tests")
        run = client.create_run(experiment, "export", {})
        source = client.upload_run_folder(run, folder, "model")
        client.finish_run(run)
        client.ensure_registered_model(name)
        return client.create_model_version(name, source, run, {}).version


def test_serves_a_registered_version(
    platform: LiveServer, tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    folder = tmp_path / "scale"
    scale_model(folder / "model.onnx", 5.0)
    write_manifest(folder, fmt="onnx", path="model.onnx")
    first = _register(platform, folder, "scaler")
    second = _register(platform, folder, "scaler")
    assert second == first + 1
    env = {"SHAMAL_URL": platform.url, "SHAMAL_TOKEN": platform.token}
    server = start_server(
        "--model", f"scaler=models:/scaler/{first}",
        "--model", "latest=models:/scaler/latest",
        env=env,
    )  # fmt: skip
    meta = httpx.get(f"{server.url}/v2/models/scaler", headers=_auth(platform)).json()
    assert meta["versions"] == [str(first)]
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
    answer = httpx.post(
        f"{server.url}/v2/models/scaler/infer", headers=_auth(platform), json=body
    ).json()
    assert answer["model_version"] == str(first)
    assert answer["outputs"][0]["data"] == [5.0, 10.0]
    latest = httpx.post(
        f"{server.url}/v2/models/latest/infer", headers=_auth(platform), json=body
    ).json()
    assert latest["model_version"] == str(second)


def test_unknown_registered_model_stops_start_up(platform: LiveServer, tmp_path: Path) -> None:
    env = {"SHAMAL_URL": platform.url, "SHAMAL_TOKEN": platform.token}
    with pytest.raises(AssertionError, match="error:"):
        ServerProcess(["--model", "ghost=models:/ghost/1"], env)


def test_serves_a_deployment_with_a_shadow(
    platform: LiveServer, tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    versions = []
    for factor in (2.0, 3.0):
        folder = tmp_path / f"scale{factor}"
        scale_model(folder / "model.onnx", factor)
        versions.append(_register(platform, folder, "shadowed"))
    with ShamalClient(platform.url, platform.token) as client:
        client.deploy(
            "web",
            {
                "primary": [{"model": f"models:/shadowed/{versions[0]}"}],
                "shadows": [{"model": f"models:/shadowed/{versions[1]}"}],
            },
        )
    env = {"SHAMAL_URL": platform.url, "SHAMAL_TOKEN": platform.token}
    server = start_server("--deployment", "web", env=env)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
    for _ in range(3):
        answer = httpx.post(
            f"{server.url}/v2/models/web/infer", headers=_auth(platform), json=body
        ).json()
        assert answer["model_version"] == str(versions[0])
        assert answer["outputs"][0]["data"] == [2.0, 4.0]  # never the shadow's answer
    shadow_batches = f'shamal_inference_batch_size_count{{model="web",version="{versions[1]}"}} 3.0'
    wait_until(
        lambda: shadow_batches in httpx.get(f"{server.url}/metrics").text,
        "the shadow version to run",
        10,
    )


def _deploy(platform: LiveServer, name: str, spec: dict[str, Any]) -> None:
    with ShamalClient(platform.url, platform.token) as client:
        client.deploy(name, spec)


def test_deployment_without_a_loadable_primary_stops_start_up(
    platform: LiveServer, tmp_path: Path
) -> None:
    sentinel = tmp_path / "pickle-ran"
    pickle_bomb(tmp_path / "pickled" / "model.onnx", sentinel)
    version = _register(platform, tmp_path / "pickled", "pickled")
    _deploy(platform, "pickled-web", {"primary": [{"model": f"models:/pickled/{version}"}]})
    env = {"SHAMAL_URL": platform.url, "SHAMAL_TOKEN": platform.token}
    with pytest.raises(AssertionError, match="No primary version of deployment 'pickled-web'"):
        ServerProcess(["--deployment", "pickled-web"], env)
    assert not sentinel.exists()


def test_canary_refused_at_start_up_is_reported_and_rolled_back(
    platform: LiveServer, tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    folder = tmp_path / "good"
    scale_model(folder / "model.onnx", 2.0)
    good = _register(platform, folder, "mixed")
    pickle_bomb(tmp_path / "bad" / "model.onnx", tmp_path / "pickle-ran")
    bad = _register(platform, tmp_path / "bad", "mixed")
    _deploy(
        platform,
        "mixed-web",
        {
            "primary": [{"model": f"models:/mixed/{good}"}],
            "canary": {"model": f"models:/mixed/{bad}", "percent": 50},
        },
    )
    env = {"SHAMAL_URL": platform.url, "SHAMAL_TOKEN": platform.token}
    server = start_server("--deployment", "mixed-web", "--report-interval", "0.1", env=env)
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
    answer = httpx.post(
        f"{server.url}/v2/models/mixed-web/infer", headers=_auth(platform), json=body
    ).json()
    assert answer["model_version"] == str(good)
    with ShamalClient(platform.url, platform.token) as client:
        wait_until(
            lambda: client.get_deployment("mixed-web")["state"]["phase"] == "rolled_back",
            "the refused canary to be rolled back",
        )
        last = client.deployment_events("mixed-web")[-1]
    assert last["reason"].startswith(f"canary v{bad} failed to load: Model 'mixed-web': ")
    assert not (tmp_path / "pickle-ran").exists()
    assert server.stop() == 0
