"""Safe rollout on a running server: a real control plane (``shamal server``) and a real
``shamal serve --deployment`` process; versions added to the deployment while it serves are
loaded without a restart, and the rollout controller judges what the serve process reports.

Every wait polls with a deadline; the traffic is driven from the test.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from onnx import TensorProto, helper

from shamal.client import ShamalClient
from tests.live import LiveServer
from tests.polling import wait_until
from tests.serving.conftest import ServerProcess
from tests.serving.models import _save, pickle_bomb, scale_model

pytestmark = pytest.mark.slow

STICKY = "x-shamal-route-key"
BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
DEADLINE_S = 30.0
#: Fast enough for a test: judged after 5 requests, 0.2 s healthy per step.
FAST = {
    "rollout": {"steps": [50, 100], "interval_s": 0.2},
    "slo": {"max_error_rate": 0.2, "max_p99_ms": 5000, "min_requests": 5},
}


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("platform")) as server:
        yield server


def _client(platform: LiveServer) -> ShamalClient:
    return ShamalClient(platform.url, platform.token)


def _register(platform: LiveServer, folder: Path, name: str) -> int:
    with _client(platform) as client:
        experiment = client.experiment_for_variants(None, "rollout-tests")
        run = client.create_run(experiment, "export", {})
        source = client.upload_run_folder(run, folder, "model")
        client.finish_run(run)
        client.ensure_registered_model(name)
        return client.create_model_version(name, source, run, {}).version


def _scale(platform: LiveServer, tmp: Path, name: str, factor: float) -> int:
    folder = tmp / f"{name}-x{factor}"
    scale_model(folder / "model.onnx", factor)
    return _register(platform, folder, name)


def _failing(platform: LiveServer, tmp: Path, name: str) -> int:
    """A version with the scale model's tensors whose every inference fails in the runtime
    (a Gather past the end of the row)."""
    index = helper.make_tensor("index", TensorProto.INT64, [2], [7, 9])
    graph = helper.make_graph(
        [helper.make_node("Gather", ["x", "index"], ["y"], axis=1)],
        "broken",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        initializer=[index],
    )
    folder = tmp / f"{name}-broken"
    _save(graph, folder / "model.onnx")
    return _register(platform, folder, name)


def _serve(
    platform: LiveServer, start_server: Callable[..., ServerProcess], name: str
) -> ServerProcess:
    env = {"SHAMAL_URL": platform.url, "SHAMAL_TOKEN": platform.token}
    # Callers' tokens are tests/serving/test_auth.py's concern; the rollout is this file's.
    return start_server("--deployment", name, "--report-interval", "0.1", "--no-auth", env=env)


class Traffic:
    """Requests to one served name, with sticky keys; remembers every answer."""

    def __init__(self, server: ServerProcess, name: str) -> None:
        self.http = httpx.Client(base_url=server.url, timeout=30)
        self.name = name
        self.answers: list[tuple[str, int, str, list[float]]] = []  # key, status, version, data
        self._sent = 0

    def send(self, key: str | None = None) -> tuple[int, str, list[float]]:
        key = key if key is not None else f"user-{self._sent % 40}"
        self._sent += 1
        answer = self.http.post(f"/v2/models/{self.name}/infer", json=BODY, headers={STICKY: key})
        body = answer.json()
        version = str(body.get("model_version", ""))
        data = body["outputs"][0]["data"] if answer.status_code == 200 else []
        self.answers.append((key, answer.status_code, version, data))
        return answer.status_code, version, data

    def until(self, done: Callable[[], bool], what: str, *, deadline_s: float = DEADLINE_S) -> None:
        """Send requests (five between two checks) until ``done()`` holds."""
        end = time.monotonic() + deadline_s
        while not done():
            assert time.monotonic() < end, f"timed out waiting until {what}"
            for _ in range(5):
                self.send()

    def close(self) -> None:
        self.http.close()


@pytest.fixture
def open_traffic() -> Iterator[Callable[[ServerProcess, str], Traffic]]:
    """Traffic to a served name; its connections close when the test ends, failed or not."""
    opened: list[Traffic] = []

    def open_(server: ServerProcess, name: str) -> Traffic:
        opened.append(Traffic(server, name))
        return opened[-1]

    yield open_
    for traffic in opened:
        traffic.close()


def _state(platform: LiveServer, name: str) -> dict[str, Any]:
    with _client(platform) as client:
        return client.get_deployment(name)


def _phase_is(platform: LiveServer, name: str, phase: str) -> Callable[[], bool]:
    return lambda: _state(platform, name)["state"]["phase"] == phase


def _events(platform: LiveServer, name: str) -> list[dict[str, Any]]:
    with _client(platform) as client:
        return client.deployment_events(name)


def _metric(server: ServerProcess, metric: str, **labels: str) -> float:
    """The sum of a metric's samples with these labels (0 when there is none)."""
    total = 0.0
    text = httpx.get(f"{server.url}/metrics").text
    for line in text.splitlines():
        if not line.startswith(metric + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line[: line.index("}")]))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_canary_added_while_serving_is_loaded_split_stepped_and_promoted(
    platform: LiveServer,
    tmp_path: Path,
    start_server: Callable[..., ServerProcess],
    open_traffic: Callable[[ServerProcess, str], Traffic],
) -> None:
    name = "roll-a"
    v1, v2 = _scale(platform, tmp_path, name, 2.0), _scale(platform, tmp_path, name, 3.0)
    with _client(platform) as client:
        client.deploy(name, {"primary": [{"model": f"models:/{name}/{v1}"}], **FAST})
    server = _serve(platform, start_server, name)
    traffic = open_traffic(server, name)
    assert traffic.send() == (200, str(v1), [2.0, 4.0])
    with _client(platform) as client:
        client.deploy(
            name,
            {
                "primary": [{"model": f"models:/{name}/{v1}"}],
                "canary": {"model": f"models:/{name}/{v2}", "percent": 50},
                **FAST,
            },
        )
    ready_while_loading: list[int] = []

    def canary_answered() -> bool:
        ready_while_loading.append(httpx.get(f"{server.url}/v2/health/ready").status_code)
        return any(version == str(v2) for _, _, version, _ in traffic.answers)

    traffic.until(canary_answered, "the canary, loaded while serving, answered")
    assert set(ready_while_loading) == {200}
    meta = httpx.get(f"{server.url}/v2/models/{name}/versions/{v2}").json()
    assert meta["versions"] == [str(v1), str(v2)]
    assert httpx.get(f"{server.url}/v2/models/{name}/versions/{v2}/ready").status_code == 200
    # Sticky: a key keeps its version while the split stays, and answers match the version.
    by_key = {}
    for i in range(40):
        _, version, data = traffic.send(f"key-{i}")
        by_key[f"key-{i}"] = version
        assert data == ([3.0, 6.0] if version == str(v2) else [2.0, 4.0])
    assert set(by_key.values()) == {str(v1), str(v2)}
    again = {key: traffic.send(key)[1] for key in by_key}
    moved = [k for k in by_key if by_key[k] != again[k]]
    assert all(by_key[k] == str(v1) and again[k] == str(v2) for k in moved)  # only onto v2
    traffic.until(_phase_is(platform, name, "promoted"), "the controller promoted the canary")
    traffic.until(lambda: traffic.send()[1] == str(v2), "the promotion reached the server")
    assert all(traffic.send(f"key-{i}") == (200, str(v2), [3.0, 6.0]) for i in range(20))
    assert all(status == 200 for _, status, _, _ in traffic.answers)
    kinds = [(e["kind"], e["actor"]) for e in _events(platform, name)]
    assert kinds[-2:] == [("step", "rollout-controller"), ("promote", "rollout-controller")]
    assert _metric(server, "shamal_inference_requests_total", version=str(v2)) > 0
    wait_until(
        lambda: httpx.get(f"{server.url}/v2/models/{name}").json()["versions"] == [str(v2)],
        "version 1 was unloaded",
        timeout=DEADLINE_S,
    )
    assert httpx.get(f"{server.url}/v2/models/{name}/versions/{v1}/ready").status_code == 404
    assert server.stop() == 0


def test_canary_failing_at_inference_is_rolled_back_and_v1_serves_on(
    platform: LiveServer,
    tmp_path: Path,
    start_server: Callable[..., ServerProcess],
    open_traffic: Callable[[ServerProcess, str], Traffic],
) -> None:
    name = "roll-b"
    v1, v2 = _scale(platform, tmp_path, name, 2.0), _failing(platform, tmp_path, name)
    with _client(platform) as client:
        client.deploy(name, {"primary": [{"model": f"models:/{name}/{v1}"}], **FAST})
    server = _serve(platform, start_server, name)
    traffic = open_traffic(server, name)
    with _client(platform) as client:
        client.set_canary(name, f"models:/{name}/{v2}", 50)
    traffic.until(_phase_is(platform, name, "rolled_back"), "the controller rolled back")
    last = _events(platform, name)[-1]
    assert (last["kind"], last["actor"]) == ("rollback", "rollout-controller")
    assert "error rate" in last["reason"]

    def canary_unloaded() -> bool:
        answered = httpx.get(f"{server.url}/v2/models/{name}/versions/{v2}/ready")
        return answered.status_code == 404

    wait_until(canary_unloaded, "the rolled-back canary was unloaded", timeout=DEADLINE_S)
    after = [traffic.send() for _ in range(60)]
    assert after == [(200, str(v1), [2.0, 4.0])] * 60
    failed = [a for a in traffic.answers if a[1] != 200]
    assert failed, "the canary never answered"
    assert all(status == 500 for _, status, _, _ in failed)
    # Every failure a caller saw is one the canary answered; every success came from v1.
    canary_500 = _metric(server, "shamal_inference_requests_total", version=str(v2), status="500")
    assert canary_500 == len(failed)
    assert {version for _, status, version, _ in traffic.answers if status == 200} == {str(v1)}
    assert server.stop() == 0


def test_canary_whose_files_are_refused_is_rolled_back_while_v1_serves(
    platform: LiveServer,
    tmp_path: Path,
    start_server: Callable[..., ServerProcess],
    open_traffic: Callable[[ServerProcess, str], Traffic],
) -> None:
    name = "roll-c"
    v1 = _scale(platform, tmp_path, name, 2.0)
    sentinel = tmp_path / "pickle-ran"
    folder = tmp_path / "pickled"
    pickle_bomb(folder / "model.onnx", sentinel)
    v2 = _register(platform, folder, name)
    with _client(platform) as client:
        client.deploy(name, {"primary": [{"model": f"models:/{name}/{v1}"}], **FAST})
    server = _serve(platform, start_server, name)
    traffic = open_traffic(server, name)
    with _client(platform) as client:
        client.set_canary(name, f"models:/{name}/{v2}", 50)
    traffic.until(_phase_is(platform, name, "rolled_back"), "the controller rolled back")
    traffic.until(lambda: len(traffic.answers) >= 50, "50 requests were answered")
    assert {(status, version) for _, status, version, _ in traffic.answers} == {(200, str(v1))}
    last = _events(platform, name)[-1]
    assert (last["kind"], last["actor"]) == ("rollback", "rollout-controller")
    assert last["reason"].startswith(f"canary v{v2} failed to load: ")
    assert "pickle" in last["reason"]
    assert not sentinel.exists()
    assert httpx.get(f"{server.url}/v2/models/{name}").json()["versions"] == [str(v1)]
    assert server.stop() == 0


def test_shadow_added_while_serving_is_mirrored_and_never_answers(
    platform: LiveServer,
    tmp_path: Path,
    start_server: Callable[..., ServerProcess],
    open_traffic: Callable[[ServerProcess, str], Traffic],
) -> None:
    name = "roll-d"
    v1, v2 = _scale(platform, tmp_path, name, 2.0), _scale(platform, tmp_path, name, 3.0)
    with _client(platform) as client:
        client.deploy(name, {"primary": [{"model": f"models:/{name}/{v1}"}], **FAST})
    server = _serve(platform, start_server, name)
    traffic = open_traffic(server, name)
    traffic.send()
    with _client(platform) as client:
        client.set_shadows(name, [{"model": f"models:/{name}/{v2}", "percent": 100}])

    def mirrored() -> bool:
        return _metric(server, "shamal_inference_batch_size_count", version=str(v2)) >= 5

    traffic.until(mirrored, "the shadow, loaded while serving, ran mirrored requests")
    answers = Counter((status, version) for _, status, version, _ in traffic.answers)
    assert answers == Counter({(200, str(v1)): len(traffic.answers)})
    assert all(data == [2.0, 4.0] for _, _, _, data in traffic.answers)
    stats = _metric(server, "shamal_inference_requests_total", version=str(v2))
    assert stats == 0  # mirrored calls are never answered to a caller
    assert server.stop() == 0
