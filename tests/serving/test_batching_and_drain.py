"""Dynamic batching, bounded queues, deadlines and the SIGTERM drain, on a real server.

The model is a torch model (``tests.serving.factories:gated``) whose forward waits for a gate file
the test creates: the test decides exactly when a batch may finish, and polls the server's own
metrics (queue depth) to know when requests are waiting. No test sleeps to synchronise.
"""

from __future__ import annotations

import http.client
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton

from tests.polling import wait_until
from tests.serving.conftest import ServerProcess
from tests.serving.models import GATE_ENV, gated_model, scale_model

module_timeout = 20.0


def _body(rows: int = 1, **extra: object) -> dict[str, object]:
    data = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)
    body: dict[str, object] = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 2], "data": data.tolist()}]
    }
    body.update(extra)
    return body


def _metric(server: ServerProcess, series: str) -> float:
    for line in httpx.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


_DEPTH = 'shamal_inference_queue_depth{model="gated",version="1"}'


class Gate:
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def entered(self) -> int:
        return len(list(self.folder.glob("entered-*")))

    def open(self) -> None:
        (self.folder / "open").touch()

    def close(self) -> None:
        (self.folder / "open").unlink(missing_ok=True)


@pytest.fixture
def gated(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> Iterator[tuple[ServerProcess, Gate]]:
    gate_dir = tmp_path / "gate"
    gate_dir.mkdir()
    folder = gated_model(tmp_path / "gated")
    server = start_server(
        "--model", f"gated={folder}",
        "--torch-factory", "gated=tests.serving.factories:gated",
        "--queue-size", "4",
        "--threads", "1",
        "--drain-timeout", "20",
        env={GATE_ENV: str(gate_dir)},
    )  # fmt: skip
    gate = Gate(gate_dir)
    yield server, gate
    gate.open()


def test_waiting_requests_run_as_one_batch(gated: tuple[ServerProcess, Gate]) -> None:
    server, gate = gated
    url = f"{server.url}/v2/models/gated/infer"
    with ThreadPoolExecutor(8) as pool, httpx.Client(timeout=30) as http:
        first = pool.submit(http.post, url, json=_body())
        wait_until(lambda: gate.entered() == 1, "the first batch to start", module_timeout)
        later = [pool.submit(http.post, url, json=_body(rows=2)) for _ in range(4)]
        wait_until(lambda: _metric(server, _DEPTH) == 4, "four queued requests", module_timeout)
        gate.open()
        answers = [first.result(30), *(f.result(30) for f in later)]
    assert [a.status_code for a in answers] == [200] * 5
    assert answers[1].json()["outputs"][0]["data"] == [0.0, 2.0, 4.0, 6.0]
    assert gate.entered() == 2  # one batch for the first request, one for the other four
    rows_of = {p.read_text() for p in gate.folder.glob("entered-*")}
    assert rows_of == {"1", "8"}
    count = 'shamal_inference_batch_size_count{model="gated",version="1"}'
    total = 'shamal_inference_batch_size_sum{model="gated",version="1"}'
    assert _metric(server, count) == 2
    assert _metric(server, total) == 9


def test_full_queue_answers_429_with_retry_after(gated: tuple[ServerProcess, Gate]) -> None:
    server, gate = gated
    url = f"{server.url}/v2/models/gated/infer"
    with ThreadPoolExecutor(8) as pool, httpx.Client(timeout=30) as http:
        first = pool.submit(http.post, url, json=_body())
        wait_until(lambda: gate.entered() == 1, "the first batch to start", module_timeout)
        queued = [pool.submit(http.post, url, json=_body()) for _ in range(4)]
        wait_until(lambda: _metric(server, _DEPTH) == 4, "a full queue", module_timeout)
        refused = http.post(url, json=_body())
        assert refused.status_code == 429
        assert int(refused.headers["retry-after"]) >= 1
        assert "full" in refused.json()["error"]
        gate.open()
        assert [f.result(30).status_code for f in [first, *queued]] == [200] * 5
    assert http_ok(server)


def http_ok(server: ServerProcess) -> bool:
    return httpx.post(f"{server.url}/v2/models/gated/infer", json=_body()).status_code == 200


def test_deadline_passed_in_queue_is_504(gated: tuple[ServerProcess, Gate]) -> None:
    server, gate = gated
    url = f"{server.url}/v2/models/gated/infer"
    with ThreadPoolExecutor(4) as pool, httpx.Client(timeout=30) as http:
        first = pool.submit(http.post, url, json=_body())
        wait_until(lambda: gate.entered() == 1, "the first batch to start", module_timeout)
        by_header = http.post(url, json=_body(), headers={"x-request-timeout-ms": "150"})
        assert by_header.status_code == 504
        assert "deadline" in by_header.json()["error"]
        by_parameter = http.post(url, json=_body(parameters={"timeout": 100_000}))  # µs
        assert by_parameter.status_code == 504
        assert _metric(server, _DEPTH) == 0  # the expired requests left the queue
        gate.open()
        assert first.result(30).status_code == 200
    assert gate.entered() == 1  # the expired requests never ran
    # A binary (read-only) input buffer reaches torch without a copy warning.
    client = triton.InferenceServerClient(server.host_port)
    tensor = triton.InferInput("x", [2, 2], "FP32")
    tensor.set_data_from_numpy(np.ones((2, 2), np.float32), binary_data=True)
    assert client.infer("gated", [tensor]).as_numpy("y").tolist() == [[2.0, 2.0]] * 2
    client.close()
    assert not any("not writable" in line for line in server.stderr_lines)


def test_sigterm_drains_in_flight_requests(gated: tuple[ServerProcess, Gate]) -> None:
    server, gate = gated
    url = f"{server.url}/v2/models/gated/infer"
    with ThreadPoolExecutor(2) as pool, httpx.Client(timeout=30) as http:
        in_flight: Future[httpx.Response] = pool.submit(http.post, url, json=_body())
        wait_until(lambda: gate.entered() == 1, "the request to start", module_timeout)
        server.signal()
        wait_until(
            lambda: httpx.get(f"{server.url}/v2/health/ready").status_code == 503,
            "readiness to turn 503",
        )
        assert httpx.get(f"{server.url}/v2/health/live").status_code == 200
        refused = httpx.post(url, json=_body())
        assert refused.status_code == 503
        assert "retry-after" in refused.headers
        assert not in_flight.done()
        gate.open()
        assert in_flight.result(30).status_code == 200
    assert server.wait(30) == 0


def test_keep_alive_requests_are_fast(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    """TCP_NODELAY on accepted sockets: no 40 ms delayed-ACK stall per keep-alive request."""
    server = start_server("--model", f"scale={scale_model(tmp_path / 'm.onnx', 2.0)}")
    host, port = server.host_port.split(":")
    body = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,2],"data":[1,2]}]}'
    connection = http.client.HTTPConnection(host, int(port))
    timings = []
    try:
        for _ in range(40):
            started = time.perf_counter()
            connection.request("POST", "/v2/models/scale/infer", body=body)
            response = connection.getresponse()
            assert response.status == 200
            response.read()
            timings.append(time.perf_counter() - started)
    finally:
        connection.close()
    assert statistics.median(timings) < 0.02


def test_a_model_keeps_its_own_batch_limit(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    """``--batching NAME=MAX`` caps that model's batches below the server-wide default."""
    gate_dir = tmp_path / "gate"
    gate_dir.mkdir()
    server = start_server(
        "--model", f"gated={gated_model(tmp_path / 'gated')}",
        "--torch-factory", "gated=tests.serving.factories:gated",
        "--max-batch-size", "32",
        "--batching", "gated=3",
        "--threads", "1",
        env={GATE_ENV: str(gate_dir)},
    )  # fmt: skip
    gate = Gate(gate_dir)
    url = f"{server.url}/v2/models/gated/infer"
    try:
        with ThreadPoolExecutor(8) as pool, httpx.Client(timeout=30) as http:
            first = pool.submit(http.post, url, json=_body())
            wait_until(lambda: gate.entered() == 1, "the first batch to start", module_timeout)
            later = [pool.submit(http.post, url, json=_body()) for _ in range(5)]
            wait_until(lambda: _metric(server, _DEPTH) == 5, "five queued requests", module_timeout)
            gate.open()
            answers = [first.result(30), *(f.result(30) for f in later)]
    finally:
        gate.open()
    assert [a.status_code for a in answers] == [200] * 6
    rows = sorted(int(p.read_text()) for p in gate_dir.glob("entered-*"))
    assert rows == [1, 2, 3]  # the five waiting rows went in batches of at most three


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("other=4", "not served here"),
        ("gated=-1", "NAME=MAX_BATCH[:DELAY_US]"),
        ("gated=4:x", "NAME=MAX_BATCH[:DELAY_US]"),
    ],
)
def test_bad_batching_options_are_refused(tmp_path: Path, option: str, message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "shamal", "serve", "--http-port", "0",
         "--model", f"gated={scale_model(tmp_path / 'm.onnx', 2.0)}", "--batching", option],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert message in done.stderr + done.stdout
    assert "Traceback" not in done.stderr
