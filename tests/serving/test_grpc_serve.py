"""End to end: the real ``shamal serve`` with ``--grpc-port``, judged by ``tritonclient.grpc``.

The processes are started with the serving tests' own helpers (``conftest.ServerProcess``,
``model_store``): the real inference core and ONNX Runtime / torch backends answer over gRPC.
"""

from __future__ import annotations

import queue
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from sklearn.datasets import load_iris
from tritonclient.utils import InferenceServerException

from tests.live import free_port
from tests.polling import wait_until
from tests.serving import models
from tests.serving.conftest import ServerProcess
from tests.serving.test_grpc_support import sample_array

MAX_REQUEST_BYTES = 1 << 20
WAIT_S = 30.0


@pytest.fixture(scope="module")
def grpc_url(model_store: dict[str, Path]) -> Iterator[str]:
    """One serve process for every store model, with gRPC on a free port."""
    port = free_port()
    args = ["--threads", "1", "--max-request-bytes", str(MAX_REQUEST_BYTES)]
    args += ["--grpc-port", str(port)]
    for name, path in model_store.items():
        args += ["--model", f"{name}={path}"]
    server = ServerProcess(args)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        assert server.stop() == 0


@pytest.fixture
def client(grpc_url: str) -> Iterator[grpcclient.InferenceServerClient]:
    triton = grpcclient.InferenceServerClient(grpc_url)
    yield triton
    triton.close()


def _input(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def test_health_and_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("add_sub")
    assert client.is_model_ready("scale", "2")
    assert not client.is_model_ready("scale", "7")
    meta = client.get_model_metadata("add_sub", as_json=True)
    assert meta["name"] == "add_sub"
    assert [(t["name"], t["datatype"]) for t in meta["inputs"]] == [
        ("INPUT0", "FP32"),
        ("INPUT1", "FP32"),
    ]
    assert meta["inputs"][0]["shape"] == ["-1", "4"]
    assert sorted(client.get_model_metadata("scale").versions) == ["1", "2"]
    server = client.get_server_metadata(as_json=True)
    assert server["name"]
    assert "binary_tensor_data" in server["extensions"]


@pytest.mark.parametrize("datatype", list(models.ONNX_TYPES))
def test_every_datatype_through_onnx_runtime(
    client: grpcclient.InferenceServerClient, datatype: str
) -> None:
    values = sample_array(datatype, (3, 4), seed=3)
    if datatype == "BYTES":
        # ONNX Runtime holds strings as UTF-8 text: send valid UTF-8.
        values = np.array([[f"w{i}{j}\u00e9".encode() for j in range(4)] for i in range(3)])
        values = values.astype(object)
    name = f"identity_{datatype.lower()}"
    result = client.infer(name, [_input("INPUT0", values, datatype)])
    answer = result.as_numpy("OUTPUT0")
    assert answer.shape == (3, 4)
    assert answer.tolist() == values.tolist()
    assert result.get_response().outputs[0].datatype == datatype


def test_requested_outputs_id_and_versions(client: grpcclient.InferenceServerClient) -> None:
    left = np.arange(8, dtype=np.float32).reshape(2, 4)
    right = np.full((2, 4), 3, dtype=np.float32)
    result = client.infer(
        "add_sub",
        [_input("INPUT0", left, "FP32"), _input("INPUT1", right, "FP32")],
        outputs=[grpcclient.InferRequestedOutput("OUTPUT1")],
        request_id="e2e-7",
    )
    assert [output.name for output in result.get_response().outputs] == ["OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), left - right)
    assert result.get_response().id == "e2e-7"

    x = np.array([[1.0, -2.0]], dtype=np.float32)
    latest = client.infer("scale", [_input("x", x, "FP32")])
    assert latest.get_response().model_version == "2"
    np.testing.assert_array_equal(latest.as_numpy("y"), x * 3)
    first = client.infer("scale", [_input("x", x, "FP32")], model_version="1")
    np.testing.assert_array_equal(first.as_numpy("y"), x * 2)


def test_scikit_learn_classifier(client: grpcclient.InferenceServerClient) -> None:
    features, target = load_iris(return_X_y=True)
    features = features.astype(np.float32)
    labels_parts, probability_parts = [], []
    for rows in np.array_split(features, 5):  # the server takes at most 32 rows per request
        result = client.infer("iris", [_input("float_input", rows, "FP32")], client_timeout=30)
        labels_parts.append(result.as_numpy("label"))
        probability_parts.append(result.as_numpy("probabilities"))
    labels = np.concatenate(labels_parts)
    probabilities = np.concatenate(probability_parts)
    assert probabilities.shape == (150, 3)
    np.testing.assert_array_equal(labels, probabilities.argmax(axis=1))
    assert (labels == target).mean() > 0.9


def test_classification_extension_over_grpc(client: grpcclient.InferenceServerClient) -> None:
    features = load_iris().data.astype(np.float32)[::25]
    wanted = [
        grpcclient.InferRequestedOutput("probabilities", class_count=1),
        grpcclient.InferRequestedOutput("label"),
    ]
    result = client.infer("iris", [_input("float_input", features, "FP32")], outputs=wanted)
    top = result.as_numpy("probabilities")
    assert top.shape == (len(features), 1)
    names = load_iris().target_names
    predicted = result.as_numpy("label")
    assert [entry.decode().split(":")[1:] for entry in top[:, 0]] == [
        [str(label), str(names[label])] for label in predicted
    ]


def test_bad_requests_get_grpc_status_codes(client: grpcclient.InferenceServerClient) -> None:
    ok = np.ones((1, 4), dtype=np.float32)
    huge = _input("INPUT0", ok, "FP32")
    huge.set_shape([1 << 40, 4])
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: client.infer("nope", [_input("INPUT0", ok, "FP32")]), "NOT_FOUND"),
        (lambda: client.infer("identity_fp32", [_input("INPUT0", ok, "FP32")], "9"), "NOT_FOUND"),
        (
            lambda: client.infer(
                "identity_fp32", [_input("INPUT0", ok.astype(np.float64), "FP64")]
            ),
            "INVALID_ARGUMENT",
        ),
        (
            lambda: client.infer(
                "identity_fp32", [_input("INPUT0", np.ones((1, 3), "f4"), "FP32")]
            ),
            "INVALID_ARGUMENT",
        ),
        (lambda: client.infer("identity_fp32", [_input("WRONG", ok, "FP32")]), "INVALID_ARGUMENT"),
        (lambda: client.infer("identity_fp32", [huge]), "INVALID_ARGUMENT"),
        (
            lambda: client.infer(
                "identity_fp32", [_input("INPUT0", np.ones((1 << 16, 4), "f4"), "FP32")]
            ),
            "RESOURCE_EXHAUSTED",
        ),
    ]
    for call, status in cases:
        with pytest.raises(InferenceServerException) as caught:
            call()
        assert caught.value.status() == f"StatusCode.{status}", caught.value.message()
    result = client.infer("identity_fp32", [_input("INPUT0", ok, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ok)


def test_deadline_and_sigterm_drain_over_grpc(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    folder = models.gated_model(tmp_path / "gated")
    port = free_port()
    server = start_server(
        "--model",
        f"gated={folder}",
        "--torch-factory",
        "gated=tests.serving.factories:gated",
        "--max-batch-size",
        "0",
        "--grpc-port",
        str(port),
        env={models.GATE_ENV: str(gate)},
    )
    triton = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        answers: queue.Queue[tuple[object, object]] = queue.Queue()
        x = np.array([[1.5, -2.0]], dtype=np.float32)
        triton.async_infer(
            "gated",
            [_input("x", x, "FP32")],
            callback=lambda result, error: answers.put((result, error)),
            client_timeout=WAIT_S,
        )
        entered = gate / "entered-0"  # the request is inside the model once this exists
        wait_until(entered.exists, "the request to enter the model", WAIT_S)
        # A second request cannot finish before its gRPC deadline: the client gives up and the
        # server cancels it, which must not wedge the model or the drain below.
        with pytest.raises(InferenceServerException) as late:
            triton.infer("gated", [_input("x", x, "FP32")], client_timeout=0.5)
        assert late.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        server.signal(signal.SIGTERM)
        wait_until(lambda: not triton.is_server_ready(), "readiness to turn false", WAIT_S)
        with pytest.raises(InferenceServerException) as refused:
            triton.infer("gated", [_input("x", x, "FP32")])
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
        (gate / "open").touch()
        result, error = answers.get(timeout=WAIT_S)
        assert error is None
        assert isinstance(result, grpcclient.InferResult)
        np.testing.assert_array_equal(result.as_numpy("y"), x * 2)
        assert server.wait(WAIT_S) == 0
    finally:
        (gate / "open").touch()
        triton.close()
