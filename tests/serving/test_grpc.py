"""The OIP gRPC front end, judged by the stock ``tritonclient.grpc`` client.

A real ``grpc.aio`` server (``start_grpc_server``) runs a small numpy InferenceService
(``test_grpc_support.ArrayService``) on a background loop; every call goes over loopback TCP.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcclient_aio
from tritonclient.utils import InferenceServerException

from shamal.errors import ServiceUnavailable
from shamal.serving._datatypes import DATATYPES
from shamal.serving._grpc import start_grpc_server
from tests.serving.test_grpc_support import (
    ArrayService,
    BackgroundServer,
    identity_model_name,
    sample_array,
    standard_models,
)

MAX_MESSAGE_BYTES = 1 << 20


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    with BackgroundServer(
        ArrayService(standard_models()), max_message_bytes=MAX_MESSAGE_BYTES
    ) as running:
        yield running


@pytest.fixture
def client(server: BackgroundServer) -> Iterator[grpcclient.InferenceServerClient]:
    triton = grpcclient.InferenceServerClient(server.url)
    yield triton
    triton.close()


def _input(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _assert_still_serving(client: grpcclient.InferenceServerClient) -> None:
    """After a refused request, the server must still answer a good one."""
    values = np.arange(8, dtype=np.float32).reshape(2, 4)
    result = client.infer(
        "add_sub", [_input("INPUT0", values, "FP32"), _input("INPUT1", values, "FP32")]
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values * 2)


def _refused(call: object) -> InferenceServerException:
    assert callable(call)
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def test_health(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    # One model of the service is still loading, so the server as a whole is not ready.
    assert not client.is_server_ready()
    assert client.is_model_ready("add_sub")
    assert client.is_model_ready("add_sub", "1")
    assert not client.is_model_ready("add_sub", "2")
    assert not client.is_model_ready("loading")
    assert not client.is_model_ready("no_such_model")


def test_server_metadata(client: grpcclient.InferenceServerClient) -> None:
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "shamal-test"
    assert meta["version"] == "0.0.1"


def test_model_metadata(client: grpcclient.InferenceServerClient) -> None:
    meta = client.get_model_metadata("add_sub", as_json=True)
    assert meta["name"] == "add_sub"
    assert meta["versions"] == ["1"]
    assert meta["platform"] == "numpy_test"
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("INPUT0", "FP32", ["-1", "4"]),
        ("INPUT1", "FP32", ["-1", "4"]),
    ]
    assert [t["name"] for t in meta["outputs"]] == ["OUTPUT0", "OUTPUT1"]
    versioned = client.get_model_metadata("add_sub", "1")
    assert list(versioned.inputs[0].shape) == [-1, 4]


def test_model_metadata_unknown_model_is_not_found(
    client: grpcclient.InferenceServerClient,
) -> None:
    error = _refused(lambda: client.get_model_metadata("no_such_model"))
    assert error.status() == "StatusCode.NOT_FOUND"
    assert "no_such_model" in error.message()


@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_infer_round_trips_every_datatype(
    client: grpcclient.InferenceServerClient, datatype: str
) -> None:
    values = sample_array(datatype, (3, 5), seed=len(datatype))
    result = client.infer(identity_model_name(datatype), [_input("INPUT0", values, datatype)])
    answer = result.as_numpy("OUTPUT0")
    assert answer.shape == (3, 5)
    if datatype == "BYTES":
        assert answer.dtype == np.object_
        assert answer.tolist() == values.tolist()
    else:
        assert answer.dtype == DATATYPES[datatype]
        np.testing.assert_array_equal(answer, values)
    response = result.get_response()
    assert response.model_name == identity_model_name(datatype)
    assert response.model_version == "1"
    assert [output.datatype for output in response.outputs] == [datatype]


def test_infer_empty_tensor(client: grpcclient.InferenceServerClient) -> None:
    values = np.zeros((0, 4), dtype=np.float32)
    result = client.infer("identity_fp32", [_input("INPUT0", values, "FP32")])
    assert result.as_numpy("OUTPUT0").shape == (0, 4)


def test_requested_outputs_and_request_id(
    client: grpcclient.InferenceServerClient,
) -> None:
    left = np.arange(8, dtype=np.float32).reshape(2, 4)
    right = np.full((2, 4), 0.5, dtype=np.float32)
    inputs = [_input("INPUT0", left, "FP32"), _input("INPUT1", right, "FP32")]
    only_difference = client.infer(
        "add_sub",
        inputs,
        model_version="1",
        outputs=[grpcclient.InferRequestedOutput("OUTPUT1")],
        request_id="req-42",
    )
    assert [output.name for output in only_difference.get_response().outputs] == ["OUTPUT1"]
    np.testing.assert_array_equal(only_difference.as_numpy("OUTPUT1"), left - right)
    assert only_difference.as_numpy("OUTPUT0") is None
    assert only_difference.get_response().id == "req-42"

    both = client.infer("add_sub", inputs)
    np.testing.assert_array_equal(both.as_numpy("OUTPUT0"), left + right)
    np.testing.assert_array_equal(both.as_numpy("OUTPUT1"), left - right)
    assert both.get_response().id == ""


def test_parameters_headers_and_deadline_reach_the_service(
    server: BackgroundServer, client: grpcclient.InferenceServerClient
) -> None:
    values = np.ones((1, 2), dtype=np.int64)
    before = time.monotonic()
    client.infer(
        "identity_int64",
        [_input("INPUT0", values, "INT64")],
        priority=7,
        headers={"x-request-key": "customer-9"},
        client_timeout=30.0,
        parameters={"alpha": 0.25, "tag": "blue", "flag": True, "count": -3},
    )
    seen = server.service.received[-1]
    assert seen.model == "identity_int64"
    assert seen.version is None
    assert seen.id is None
    # priority travels as uint64_param and floats as double_param (fields 5 and 4).
    assert seen.parameters == {
        "priority": 7,
        "alpha": 0.25,
        "tag": "blue",
        "flag": True,
        "count": -3,
    }
    assert seen.headers["x-request-key"] == "customer-9"
    assert seen.deadline is not None
    # grpc rounds the timeout it puts on the wire up to a coarse unit: allow a second of slack.
    assert before + 29.0 < seen.deadline <= time.monotonic() + 31.0


def test_no_client_deadline_means_no_deadline(
    server: BackgroundServer, client: grpcclient.InferenceServerClient
) -> None:
    client.infer("identity_int8", [_input("INPUT0", np.ones((1, 1), np.int8), "INT8")])
    assert server.service.received[-1].deadline is None


def test_unknown_model_is_not_found(client: grpcclient.InferenceServerClient) -> None:
    values = np.ones((1, 4), dtype=np.float32)
    error = _refused(lambda: client.infer("no_such_model", [_input("INPUT0", values, "FP32")]))
    assert error.status() == "StatusCode.NOT_FOUND"
    error = _refused(lambda: client.infer("identity_fp32", [_input("INPUT0", values, "FP32")], "9"))
    assert error.status() == "StatusCode.NOT_FOUND"
    _assert_still_serving(client)


@pytest.mark.parametrize(
    ("model", "inputs"),
    [
        # wrong datatype
        ("identity_fp32", [("INPUT0", np.ones((1, 4), np.int32), "INT32")]),
        # wrong shape: add_sub takes [-1, 4]
        (
            "add_sub",
            [
                ("INPUT0", np.ones((2, 3), np.float32), "FP32"),
                ("INPUT1", np.ones((2, 3), np.float32), "FP32"),
            ],
        ),
        # wrong rank
        ("identity_fp32", [("INPUT0", np.ones(4, np.float32), "FP32")]),
        # missing input
        ("add_sub", [("INPUT0", np.ones((2, 4), np.float32), "FP32")]),
        # unknown input
        ("identity_fp32", [("WRONG", np.ones((1, 4), np.float32), "FP32")]),
    ],
    ids=["datatype", "shape", "rank", "missing-input", "unknown-input"],
)
def test_inputs_that_do_not_fit_the_model_are_invalid(
    client: grpcclient.InferenceServerClient,
    model: str,
    inputs: list[tuple[str, np.ndarray, str]],
) -> None:
    tensors = [_input(name, values, datatype) for name, values, datatype in inputs]
    error = _refused(lambda: client.infer(model, tensors))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    _assert_still_serving(client)


def test_unknown_requested_output_is_invalid(client: grpcclient.InferenceServerClient) -> None:
    values = np.ones((1, 4), dtype=np.float32)
    error = _refused(
        lambda: client.infer(
            "identity_fp32",
            [_input("INPUT0", values, "FP32")],
            outputs=[grpcclient.InferRequestedOutput("NOPE")],
        )
    )
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "NOPE" in error.message()


def test_shape_that_disagrees_with_the_data_is_invalid(
    client: grpcclient.InferenceServerClient,
) -> None:
    tensor = grpcclient.InferInput("INPUT0", [2, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((2, 4), dtype=np.float32))
    tensor.set_shape([4, 4])  # declares 16 elements over 8 elements of data
    error = _refused(lambda: client.infer("identity_fp32", [tensor]))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "needs 64" in error.message()
    _assert_still_serving(client)


def test_huge_declared_shape_with_tiny_payload_is_refused(
    client: grpcclient.InferenceServerClient,
) -> None:
    tensor = grpcclient.InferInput("INPUT0", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"x"]], dtype=object))
    tensor.set_shape([1 << 20, 1 << 20])
    started = time.monotonic()
    error = _refused(lambda: client.infer("identity_bytes", [tensor]))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert time.monotonic() - started < 5
    _assert_still_serving(client)


def test_oversized_request_is_resource_exhausted(
    client: grpcclient.InferenceServerClient,
) -> None:
    values = np.zeros(MAX_MESSAGE_BYTES // 4 + 1024, dtype=np.float32)
    error = _refused(lambda: client.infer("repeat4", [_input("INPUT0", values, "FP32")]))
    assert error.status() == "StatusCode.RESOURCE_EXHAUSTED"
    _assert_still_serving(client)


def test_compressed_request_over_the_limit_is_resource_exhausted(
    client: grpcclient.InferenceServerClient,
) -> None:
    # 4 MiB of zeros gzip to a few KiB: the limit must hold for the decompressed message.
    bomb = np.zeros((1, 1 << 20), dtype=np.float32)
    error = _refused(
        lambda: client.infer(
            "identity_fp32", [_input("INPUT0", bomb, "FP32")], compression_algorithm="gzip"
        )
    )
    assert error.status() == "StatusCode.RESOURCE_EXHAUSTED"
    small = np.arange(6, dtype=np.float32).reshape(2, 3)
    result = client.infer(
        "identity_fp32", [_input("INPUT0", small, "FP32")], compression_algorithm="gzip"
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), small)


def test_oversized_response_is_resource_exhausted(
    client: grpcclient.InferenceServerClient,
) -> None:
    # 400 KB in, 1.6 MB out: the request fits the limit, the answer does not.
    values = np.ones(100_000, dtype=np.float32)
    error = _refused(lambda: client.infer("repeat4", [_input("INPUT0", values, "FP32")]))
    assert error.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert "message limit" in error.message()
    small = np.arange(3, dtype=np.float32)
    result = client.infer("repeat4", [_input("INPUT0", small, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.tile(small, 4))


def test_model_not_ready_and_busy_model_are_unavailable(
    client: grpcclient.InferenceServerClient,
) -> None:
    values = np.ones(2, dtype=np.float32)
    for model in ("loading", "busy"):
        error = _refused(
            lambda model=model: client.infer(model, [_input("INPUT0", values, "FP32")])
        )
        assert error.status() == "StatusCode.UNAVAILABLE"
    _assert_still_serving(client)


def test_model_failure_is_internal_without_details(
    client: grpcclient.InferenceServerClient,
) -> None:
    values = np.ones(2, dtype=np.float32)
    error = _refused(lambda: client.infer("faulty", [_input("INPUT0", values, "FP32")]))
    assert error.status() == "StatusCode.INTERNAL"
    assert "secret" not in error.message()
    assert "exploded" not in error.message()
    _assert_still_serving(client)


def test_triton_only_rpcs_are_unimplemented(client: grpcclient.InferenceServerClient) -> None:
    for call in (
        lambda: client.get_model_config("add_sub"),
        lambda: client.get_inference_statistics("add_sub"),
        lambda: client.get_model_repository_index(),
    ):
        assert _refused(call).status() == "StatusCode.UNIMPLEMENTED"
    _assert_still_serving(client)


def test_concurrent_requests_are_all_answered(
    client: grpcclient.InferenceServerClient,
) -> None:
    answers: queue.Queue[tuple[int, object, object]] = queue.Queue()
    values = [np.full((1, 3), index, dtype=np.int32) for index in range(16)]
    for index, array in enumerate(values):
        client.async_infer(
            "identity_int32",
            [_input("INPUT0", array, "INT32")],
            callback=lambda result, error, index=index: answers.put((index, result, error)),
            request_id=str(index),
        )
    seen = set()
    for _ in values:
        index, result, error = answers.get(timeout=20)
        assert error is None
        assert isinstance(result, grpcclient.InferResult)
        assert result.get_response().id == str(index)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values[index])
        seen.add(index)
    assert seen == set(range(len(values)))


def test_a_taken_port_is_refused_not_shared(server: BackgroundServer) -> None:
    second = start_grpc_server(
        server.service, host="127.0.0.1", port=server.port, max_message_bytes=1024
    )
    with pytest.raises(ServiceUnavailable) as caught:
        server.run(second)
    assert str(server.port) in caught.value.message


def test_streaming_is_unimplemented(client: grpcclient.InferenceServerClient) -> None:
    errors: queue.Queue[object] = queue.Queue()
    client.start_stream(callback=lambda result, error: errors.put(error))
    try:
        values = np.ones((1, 2), dtype=np.float32)
        # The refusal may close the stream before this send: the callback has the status.
        with contextlib.suppress(InferenceServerException):
            client.async_stream_infer("identity_fp32", [_input("INPUT0", values, "FP32")])
        error = errors.get(timeout=20)
    finally:
        client.stop_stream()
    assert isinstance(error, InferenceServerException)
    assert error.status() == "StatusCode.UNIMPLEMENTED"
    _assert_still_serving(client)


def test_asyncio_client(server: BackgroundServer) -> None:
    async def call() -> np.ndarray:
        async with grpcclient_aio.InferenceServerClient(server.url) as triton:
            assert await triton.is_model_ready("add_sub")
            tensor = grpcclient_aio.InferInput("INPUT0", [2, 2], "UINT16")
            tensor.set_data_from_numpy(np.array([[1, 2], [3, 65535]], dtype=np.uint16))
            result = await triton.infer("identity_uint16", [tensor], request_id="aio")
            assert result.get_response().id == "aio"
            answer: np.ndarray = result.as_numpy("OUTPUT0")
            return answer

    answer = asyncio.run(call())
    np.testing.assert_array_equal(answer, [[1, 2], [3, 65535]])
