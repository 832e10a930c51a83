"""OIP REST conformance of ``shamal serve``, judged by the stock ``tritonclient.http``.

One real server process serves an identity model per datatype, a two-input/two-output FP32
model, an iris classifier converted with skl2onnx, and two versions of a scale model.
"""

from __future__ import annotations

import gzip
import json

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from sklearn.datasets import load_iris
from tritonclient.utils import InferenceServerException

from tests.serving.conftest import DATATYPES, STORE_MODELS, ServerProcess
from tests.serving.models import iris_model


@pytest.fixture(scope="module")
def client(oip_server: ServerProcess) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(oip_server.host_port, network_timeout=30)


def _sample(datatype: str, rows: int = 3) -> np.ndarray:
    rng = np.random.default_rng(7)
    if datatype == "BOOL":
        return rng.integers(0, 2, size=(rows, 4)).astype(bool)
    if datatype == "BYTES":
        words = [b"", b"a", "\u00e9t\u00e9".encode(), b"x" * 300]
        return np.array([[words[(r + c) % 4] for c in range(4)] for r in range(rows)], dtype=object)
    dtype = triton.triton_to_np_dtype(datatype)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        edges = np.array([info.min, info.max, 0, 1], dtype=dtype)
        return np.stack([edges] + [rng.integers(0, 100, size=4).astype(dtype)] * (rows - 1))
    return (rng.standard_normal((rows, 4)) * 1000).astype(dtype)


def test_health_and_server_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "shamal"
    assert "binary_tensor_data" in meta["extensions"]


def test_model_listing_and_readiness(
    oip_server: ServerProcess, client: triton.InferenceServerClient
) -> None:
    listed = httpx.get(f"{oip_server.url}/v2/models").json()["models"]
    assert sorted(listed) == sorted({name.split(":")[0] for name in STORE_MODELS})
    assert client.is_model_ready("add_sub")
    assert client.is_model_ready("scale", "2")
    assert not client.is_model_ready("scale", "9")
    assert not client.is_model_ready("nope")


def test_model_metadata(client: triton.InferenceServerClient) -> None:
    meta = client.get_model_metadata("add_sub")
    assert meta["name"] == "add_sub"
    assert meta["platform"] == "onnxruntime_onnx"
    assert [t["name"] for t in meta["inputs"]] == ["INPUT0", "INPUT1"]
    assert meta["inputs"][0] == {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}
    assert [t["name"] for t in meta["outputs"]] == ["OUTPUT0", "OUTPUT1"]
    with pytest.raises(InferenceServerException) as caught:
        client.get_model_metadata("nope")
    assert caught.value.status() == "404"


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("datatype", DATATYPES)
def test_identity_round_trip_every_datatype(
    client: triton.InferenceServerClient, datatype: str, binary: bool
) -> None:
    data = _sample(datatype)
    tensor = triton.InferInput("INPUT0", list(data.shape), datatype)
    if datatype == "FP16" and not binary:
        tensor.set_data_from_numpy(data, binary_data=False)
        with pytest.raises(InferenceServerException) as caught:
            client.infer("identity_fp16", [tensor])
        assert caught.value.status() == "400"
        assert "binary" in caught.value.message()
        return
    tensor.set_data_from_numpy(data, binary_data=binary)
    wanted = [triton.InferRequestedOutput("OUTPUT0", binary_data=binary)]
    result = client.infer(f"identity_{datatype.lower()}", [tensor], outputs=wanted)
    got = result.as_numpy("OUTPUT0")
    assert got.shape == data.shape
    if datatype == "BYTES":
        as_bytes = [[v if isinstance(v, bytes) else v.encode() for v in row] for row in got]
        assert as_bytes == data.tolist()
    else:
        assert got.dtype == data.dtype
        np.testing.assert_array_equal(got, data)
    assert result.get_response()["model_version"] == "1"


@pytest.mark.parametrize("binary_in", [True, False])
def test_requested_outputs_and_defaults(
    client: triton.InferenceServerClient, binary_in: bool
) -> None:
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.full((2, 4), 0.5, dtype=np.float32)
    inputs = [
        triton.InferInput("INPUT0", [2, 4], "FP32"),
        triton.InferInput("INPUT1", [2, 4], "FP32"),
    ]
    inputs[0].set_data_from_numpy(a, binary_data=binary_in)
    inputs[1].set_data_from_numpy(b, binary_data=binary_in)
    only_diff = client.infer(
        "add_sub", inputs, outputs=[triton.InferRequestedOutput("OUTPUT1", binary_data=False)]
    )
    np.testing.assert_allclose(only_diff.as_numpy("OUTPUT1"), a - b)
    assert only_diff.as_numpy("OUTPUT0") is None
    everything = client.infer("add_sub", inputs, request_id="req-7")
    np.testing.assert_allclose(everything.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_allclose(everything.as_numpy("OUTPUT1"), a - b)
    assert everything.get_response()["id"] == "req-7"


def test_unknown_output_and_input_are_400(client: triton.InferenceServerClient) -> None:
    tensor = triton.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 4), np.float32))
    with pytest.raises(InferenceServerException) as caught:
        client.infer("identity_fp32", [tensor], outputs=[triton.InferRequestedOutput("NOPE")])
    assert caught.value.status() == "400"
    wrong = triton.InferInput("WRONG", [1, 4], "FP32")
    wrong.set_data_from_numpy(np.zeros((1, 4), np.float32))
    with pytest.raises(InferenceServerException) as caught:
        client.infer("identity_fp32", [wrong])
    assert caught.value.status() == "400"
    with pytest.raises(InferenceServerException) as caught:
        client.infer("add_sub", [tensor])  # INPUT1 missing
    assert caught.value.status() == "400"
    assert "INPUT1" in caught.value.message()


def test_sklearn_classifier_matches_scikit_learn(
    client: triton.InferenceServerClient, tmp_path_factory: pytest.TempPathFactory
) -> None:
    _, estimator, features = iris_model(tmp_path_factory.mktemp("iris-again"))
    batch = features[::10]
    tensor = triton.InferInput("float_input", list(batch.shape), "FP32")
    tensor.set_data_from_numpy(batch)
    result = client.infer("iris", [tensor])
    np.testing.assert_array_equal(result.as_numpy("label"), estimator.predict(batch))
    np.testing.assert_allclose(
        result.as_numpy("probabilities"), estimator.predict_proba(batch), atol=1e-4
    )


def test_classification_extension_gives_top_classes_with_labels(
    oip_server: ServerProcess,
    client: triton.InferenceServerClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    _, estimator, features = iris_model(tmp_path_factory.mktemp("iris-classes"))
    batch = features[[0, 60, 120, 75]]
    tensor = triton.InferInput("float_input", list(batch.shape), "FP32")
    tensor.set_data_from_numpy(batch)
    wanted = [
        triton.InferRequestedOutput("probabilities", class_count=2),
        triton.InferRequestedOutput("label", binary_data=False),
    ]
    result = client.infer("iris", [tensor], outputs=wanted)
    top = result.as_numpy("probabilities")
    assert top.shape == (4, 2)
    names = load_iris().target_names
    for row, proba in zip(top, estimator.predict_proba(batch), strict=True):
        value, index, label = zip(*(entry.decode().split(":") for entry in row), strict=True)
        expected = np.argsort(-proba, kind="stable")[:2]
        assert [int(i) for i in index] == expected.tolist()
        assert list(label) == [names[i] for i in expected]
        np.testing.assert_allclose([float(v) for v in value], proba[expected], atol=1e-4)
    np.testing.assert_array_equal(result.as_numpy("label"), estimator.predict(batch))
    # JSON answers carry the same strings; a count past the classes gives every class.
    body = {
        "inputs": [{"name": "float_input", "datatype": "FP32", "shape": [1, 4]}],
        "outputs": [{"name": "probabilities", "parameters": {"classification": 9}}],
    }
    body["inputs"][0]["data"] = features[0].tolist()
    answer = httpx.post(f"{oip_server.url}/v2/models/iris/infer", json=body).json()["outputs"][0]
    assert (answer["datatype"], answer["shape"]) == ("BYTES", [1, 3])
    assert [entry.rsplit(":", 1)[1] for entry in answer["data"]][0] == "setosa"


def test_versions_latest_by_default(client: triton.InferenceServerClient) -> None:
    x = np.array([[1.0, 2.0]], dtype=np.float32)
    tensor = triton.InferInput("x", [1, 2], "FP32")
    tensor.set_data_from_numpy(x)
    assert client.infer("scale", [tensor], model_version="1").as_numpy("y").tolist() == [[2.0, 4.0]]
    v2 = client.infer("scale", [tensor], model_version="2")
    assert v2.as_numpy("y").tolist() == [[3.0, 6.0]]
    latest = client.infer("scale", [tensor])
    assert latest.as_numpy("y").tolist() == [[3.0, 6.0]]
    assert latest.get_response()["model_version"] == "2"
    assert client.get_model_metadata("scale", "1")["versions"] == ["1", "2"]
    with pytest.raises(InferenceServerException) as caught:
        client.infer("scale", [tensor], model_version="7")
    assert caught.value.status() == "404"


def test_json_nested_and_flat_data_and_id_echo(oip_server: ServerProcess) -> None:
    url = f"{oip_server.url}/v2/models/add_sub/infer"
    body = {
        "id": "42",
        "parameters": {"custom": 1.5, "whatever": "ignored"},
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "FP32",
                "shape": [2, 4],
                "data": [[1, 2, 3, 4], [5, 6, 7, 8]],
            },
            {
                "name": "INPUT1",
                "datatype": "FP32",
                "shape": [2, 4],
                "data": [1, 1, 1, 1, 1, 1, 1, 1],
            },
        ],
        "outputs": [{"name": "OUTPUT0"}],
    }
    response = httpx.post(url, content=json.dumps(body))  # no content type: still JSON
    assert response.status_code == 200
    answer = response.json()
    assert answer["id"] == "42"
    assert answer["model_name"] == "add_sub"
    assert answer["outputs"] == [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [2, 4], "data": [2, 3, 4, 5, 6, 7, 8, 9]}
    ]
    assert "inference-header-content-length" not in response.headers


def test_binary_data_output_precedence(oip_server: ServerProcess) -> None:
    """``binary_data_output`` makes every output binary unless the output's own flag says no."""
    url = f"{oip_server.url}/v2/models/add_sub/infer"
    body = {
        "parameters": {"binary_data_output": True},
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]},
            {"name": "INPUT1", "datatype": "FP32", "shape": [1, 4], "data": [0, 0, 0, 0]},
        ],
        "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT1", "parameters": {"binary_data": False}}],
    }
    response = httpx.post(url, json=body)
    assert response.status_code == 200
    split = int(response.headers["inference-header-content-length"])
    header = json.loads(response.content[:split])
    first, second = header["outputs"]
    assert first["parameters"] == {"binary_data_size": 16}
    assert "data" not in first
    assert second["data"] == [1, 2, 3, 4]
    blob = response.content[split:]
    assert np.frombuffer(blob, "<f4").tolist() == [1, 2, 3, 4]


def _raw(server: ServerProcess, path: str, body: bytes) -> httpx.Response:
    """A raw binary request: no JSON header, the body is the input's bytes."""
    headers = {"Inference-Header-Content-Length": "0", "Content-Type": "application/octet-stream"}
    return httpx.post(f"{server.url}/v2/models/{path}/infer", content=body, headers=headers)


def _raw_result(response: httpx.Response) -> triton.InferResult:
    """The answer read by tritonclient's own response parser: every output is binary."""
    assert response.status_code == 200, response.text
    split = int(response.headers["inference-header-content-length"])
    assert all("data" not in out for out in json.loads(response.content[:split])["outputs"])
    return triton.InferResult.from_response_body(response.content, header_length=split)


@pytest.mark.parametrize("datatype", [d for d in DATATYPES if d != "BYTES"])
def test_raw_binary_request_is_one_row_of_the_single_input(
    oip_server: ServerProcess, datatype: str
) -> None:
    row = _sample(datatype, rows=2)[1:]
    result = _raw_result(_raw(oip_server, f"identity_{datatype.lower()}", row.tobytes()))
    assert result.get_response()["model_name"] == f"identity_{datatype.lower()}"
    answered = result.as_numpy("OUTPUT0")
    assert answered.shape == (1, 4)
    np.testing.assert_array_equal(answered, row)


def test_raw_binary_request_infers_the_one_variable_dimension(oip_server: ServerProcess) -> None:
    tokens = np.array([[101, 7592, -3, 2**40, 0, 102, 9]], dtype=np.int64)
    answered = _raw_result(_raw(oip_server, "tokens", tokens.tobytes())).as_numpy("OUTPUT0")
    assert answered.shape == (1, 7)
    np.testing.assert_array_equal(answered, tokens)


def test_raw_binary_bytes_input_is_the_whole_body(oip_server: ServerProcess) -> None:
    text = "\u00e9t\u00e9 \u2713\n raw".encode()
    answered = _raw_result(_raw(oip_server, "text", text)).as_numpy("OUTPUT0")
    assert answered.shape == (1, 1)
    assert answered[0, 0] == text


def test_raw_binary_request_may_be_gzipped(oip_server: ServerProcess) -> None:
    row = np.array([[0.5, -1.0, 3.25, 8.0]], dtype=np.float32)
    headers = {"Inference-Header-Content-Length": "0", "Content-Encoding": "gzip"}
    response = httpx.post(
        f"{oip_server.url}/v2/models/identity_fp32/infer",
        content=gzip.compress(row.tobytes()),
        headers=headers,
    )
    np.testing.assert_array_equal(_raw_result(response).as_numpy("OUTPUT0"), row)


def test_raw_binary_request_routes_to_versions(oip_server: ServerProcess) -> None:
    x = np.array([[1.5, -2.0]], dtype=np.float32)
    pinned = _raw_result(_raw(oip_server, "scale/versions/1", x.tobytes()))
    assert pinned.get_response()["model_version"] == "1"
    np.testing.assert_array_equal(pinned.as_numpy("y"), x * 2)
    latest = _raw_result(_raw(oip_server, "scale", x.tobytes()))
    assert latest.get_response()["model_version"] == "2"
    np.testing.assert_array_equal(latest.as_numpy("y"), x * 3)


def test_large_json_tensors_in_and_out(oip_server: ServerProcess) -> None:
    """Bodies and answers past the off-loop size are decoded and encoded like small ones."""
    tokens = np.random.default_rng(3).integers(-(2**62), 2**62, size=(1, 120_000))
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT64", "shape": [1, 120_000]}]}
    body["inputs"][0]["data"] = tokens.ravel().tolist()
    content = json.dumps(body).encode()
    assert len(content) > 1024 * 1024
    response = httpx.post(f"{oip_server.url}/v2/models/tokens/infer", content=content)
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    assert output["shape"] == [1, 120_000]
    assert output["data"] == tokens.ravel().tolist()


def test_gzip_request_body(client: triton.InferenceServerClient) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    tensor = triton.InferInput("INPUT0", [2, 4], "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("identity_fp32", [tensor], request_compression_algorithm="gzip")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)


def test_errors_are_json_with_error_key(oip_server: ServerProcess) -> None:
    missing = httpx.get(f"{oip_server.url}/v2/models/nope")
    assert missing.status_code == 404
    assert set(missing.json()) == {"error"}
    unknown_route = httpx.get(f"{oip_server.url}/v3/whatever")
    assert unknown_route.status_code == 404
    assert "error" in unknown_route.json()
    no_version = httpx.get(f"{oip_server.url}/v2/models/scale/versions/9/ready")
    assert no_version.status_code == 404
    assert "error" in no_version.json()
    wrong_method = httpx.get(f"{oip_server.url}/v2/models/add_sub/infer")
    assert wrong_method.status_code == 405
    assert "error" in wrong_method.json()


def test_metrics_count_requests_by_model_and_status(oip_server: ServerProcess) -> None:
    url = f"{oip_server.url}/v2/models/identity_int32/infer"
    good = {
        "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 4], "data": [1, 2, 3, 4]}]
    }
    bad = {
        "inputs": [{"name": "INPUT0", "datatype": "INT64", "shape": [1, 4], "data": [1, 2, 3, 4]}]
    }
    assert httpx.post(url, json=good).status_code == 200
    assert httpx.post(url, json=bad).status_code == 400
    text = httpx.get(f"{oip_server.url}/metrics").text
    ok_line = (
        'shamal_inference_requests_total{model="identity_int32",protocol="rest",status="200",'
        'version="1"}'
    )
    bad_line = ok_line.replace('"200"', '"400"')
    assert _value(text, ok_line) >= 1
    assert _value(text, bad_line) >= 1
    assert "shamal_inference_request_duration_seconds_bucket" in text
    assert 'shamal_inference_queue_depth{model="identity_int32",version="1"} 0.0' in text


def _value(exposition: str, series: str) -> float:
    for line in exposition.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{series} not in the exposition")
