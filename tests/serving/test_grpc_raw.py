"""The OIP gRPC front end, driven with Shamal's own generated stubs.

These are the requests the stock ``tritonclient`` cannot produce: typed ``contents`` (what KServe
and MLServer clients send), raw and typed mixed, blob counts and sizes that disagree with the
declared shapes, broken BYTES framing, hostile shapes. Each must be refused with a clear
INVALID_ARGUMENT (or UNIMPLEMENTED), and the server must keep answering good requests.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest

from shamal.serving._datatypes import DATATYPES, to_raw
from shamal.serving._proto import grpc_predict_v2_pb2 as pb
from shamal.serving._proto import grpc_predict_v2_pb2_grpc as pb_grpc
from tests.serving.test_grpc_support import (
    RETRY_AFTER_S,
    ArrayService,
    BackgroundServer,
    identity_model_name,
    sample_array,
    standard_models,
)

Tensor = pb.ModelInferRequest.InferInputTensor
TYPED_FIELD = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


@pytest.fixture(scope="module")
def service() -> ArrayService:
    return ArrayService(standard_models())


@pytest.fixture(scope="module")
def stub(service: ArrayService) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with (
        BackgroundServer(service, max_message_bytes=1 << 20) as server,
        grpc.insecure_channel(server.url) as channel,
    ):
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def _raw_request(model: str, tensors: list[tuple[str, str, list[int], bytes]]) -> Any:
    return pb.ModelInferRequest(
        model_name=model,
        inputs=[Tensor(name=name, datatype=dt, shape=shape) for name, dt, shape, _ in tensors],
        raw_input_contents=[blob for *_, blob in tensors],
    )


def _fp32_request(values: np.ndarray) -> Any:
    return _raw_request(
        "identity_fp32", [("INPUT0", "FP32", list(values.shape), to_raw(values, "FP32"))]
    )


def _refused(stub: Any, request: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request, timeout=10)
    error = caught.value
    assert isinstance(error, grpc.RpcError)
    return error


def _assert_still_serving(stub: Any) -> None:
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    response = stub.ModelInfer(_fp32_request(values), timeout=10)
    answer = np.frombuffer(response.raw_output_contents[0], dtype="<f4").reshape(2, 3)
    np.testing.assert_array_equal(answer, values)


def _decode_output(response: Any, index: int) -> np.ndarray:
    """Decode raw_output_contents[index] the way a client must (BYTES: length-prefixed)."""
    tensor = response.outputs[index]
    blob = response.raw_output_contents[index]
    shape = tuple(tensor.shape)
    if tensor.datatype != "BYTES":
        return np.frombuffer(blob, dtype=DATATYPES[tensor.datatype]).reshape(shape)
    items, offset = [], 0
    while offset < len(blob):
        (length,) = struct.unpack_from("<I", blob, offset)
        items.append(blob[offset + 4 : offset + 4 + length])
        offset += 4 + length
    return np.array(items + [None], dtype=object)[:-1].reshape(shape)


@pytest.mark.parametrize("datatype", list(TYPED_FIELD))
def test_typed_contents_are_accepted_and_answered_raw(stub: Any, datatype: str) -> None:
    values = sample_array(datatype, (2, 3), seed=7)
    contents = pb.InferTensorContents()
    getattr(contents, TYPED_FIELD[datatype]).extend(values.reshape(-1).tolist())
    request = pb.ModelInferRequest(
        model_name=identity_model_name(datatype),
        id="typed",
        inputs=[Tensor(name="INPUT0", datatype=datatype, shape=[2, 3], contents=contents)],
    )
    response = stub.ModelInfer(request, timeout=10)
    assert response.id == "typed"
    assert len(response.raw_output_contents) == 1
    assert not response.outputs[0].HasField("contents")
    answer = _decode_output(response, 0)
    assert answer.tolist() == values.tolist()


def _typed(datatype: str, shape: list[int], **values: list[Any]) -> Any:
    return Tensor(
        name="INPUT0",
        datatype=datatype,
        shape=shape,
        contents=pb.InferTensorContents(**values),
    )


BAD_REQUESTS: dict[str, Callable[[], Any]] = {
    "raw-and-typed-mixed": lambda: pb.ModelInferRequest(
        model_name="add_sub",
        inputs=[
            Tensor(name="INPUT0", datatype="FP32", shape=[1, 4]),
            Tensor(
                name="INPUT1",
                datatype="FP32",
                shape=[1, 4],
                contents=pb.InferTensorContents(fp32_contents=[1, 2, 3, 4]),
            ),
        ],
        raw_input_contents=[b"\0" * 16, b"\0" * 16],
    ),
    "more-raw-blobs-than-inputs": lambda: pb.ModelInferRequest(
        model_name="identity_fp32",
        inputs=[Tensor(name="INPUT0", datatype="FP32", shape=[1, 1])],
        raw_input_contents=[b"\0" * 4, b"\0" * 4],
    ),
    "raw-size-short": lambda: _raw_request(
        "identity_fp32", [("INPUT0", "FP32", [2, 2], b"\0" * 12)]
    ),
    "raw-size-long": lambda: _raw_request(
        "identity_fp32", [("INPUT0", "FP32", [2, 2], b"\0" * 20)]
    ),
    "bytes-length-overruns-blob": lambda: _raw_request(
        "identity_bytes", [("INPUT0", "BYTES", [1, 1], struct.pack("<I", 100) + b"abc")]
    ),
    "bytes-trailing-garbage": lambda: _raw_request(
        "identity_bytes", [("INPUT0", "BYTES", [1, 1], struct.pack("<I", 1) + b"ab")]
    ),
    "bytes-cut-inside-prefix": lambda: _raw_request(
        "identity_bytes", [("INPUT0", "BYTES", [1, 2], struct.pack("<I", 1) + b"a\0\0")]
    ),
    "huge-shape-tiny-payload": lambda: _raw_request(
        "identity_fp32", [("INPUT0", "FP32", [1 << 40, 1], b"\0" * 4)]
    ),
    "huge-bytes-shape-tiny-payload": lambda: _raw_request(
        "identity_bytes", [("INPUT0", "BYTES", [1 << 25, 1], struct.pack("<I", 0))]
    ),
    "product-overflows-int64": lambda: _raw_request(
        "identity_fp32", [("INPUT0", "FP32", [1 << 40, 1 << 40], b"\0" * 4)]
    ),
    "negative-dim": lambda: _raw_request("identity_fp32", [("INPUT0", "FP32", [-1, 1], b"\0" * 4)]),
    "too-many-dims": lambda: _raw_request("identity_fp32", [("INPUT0", "FP32", [1] * 40, b"")]),
    "bool-byte-not-0-or-1": lambda: _raw_request(
        "identity_bool", [("INPUT0", "BOOL", [1, 2], b"\x01\x02")]
    ),
    "unknown-datatype": lambda: _raw_request(
        "identity_fp32", [("INPUT0", "FLOAT", [1, 1], b"\0" * 4)]
    ),
    "bf16-not-supported": lambda: _raw_request(
        "identity_fp32", [("INPUT0", "BF16", [1, 2], b"\0" * 4)]
    ),
    "duplicate-input-names": lambda: _raw_request(
        "add_sub",
        [("INPUT0", "FP32", [1, 4], b"\0" * 16), ("INPUT0", "FP32", [1, 4], b"\0" * 16)],
    ),
    "empty-model-name": lambda: _raw_request("", [("INPUT0", "FP32", [1, 1], b"\0" * 4)]),
    "typed-count-short": lambda: pb.ModelInferRequest(
        model_name="identity_fp32", inputs=[_typed("FP32", [2, 2], fp32_contents=[1, 2, 3])]
    ),
    "typed-count-with-huge-shape": lambda: pb.ModelInferRequest(
        model_name="identity_fp32",
        inputs=[_typed("FP32", [1 << 30, 1 << 30], fp32_contents=[1])],
    ),
    "typed-wrong-field": lambda: pb.ModelInferRequest(
        model_name="identity_int32", inputs=[_typed("INT32", [1, 2], fp32_contents=[1, 2])]
    ),
    "typed-two-fields": lambda: pb.ModelInferRequest(
        model_name="identity_int32",
        inputs=[_typed("INT32", [1, 2], int_contents=[1, 2], int64_contents=[1, 2])],
    ),
    "typed-int8-out-of-range": lambda: pb.ModelInferRequest(
        model_name="identity_int8", inputs=[_typed("INT8", [1, 2], int_contents=[1, 300])]
    ),
    "typed-uint16-out-of-range": lambda: pb.ModelInferRequest(
        model_name="identity_uint16",
        inputs=[_typed("UINT16", [1, 1], uint_contents=[70_000])],
    ),
    "typed-fp16-has-no-field": lambda: pb.ModelInferRequest(
        model_name="identity_fp16", inputs=[_typed("FP16", [1, 1], fp32_contents=[1.0])]
    ),
    "no-data-at-all": lambda: pb.ModelInferRequest(
        model_name="identity_fp32", inputs=[Tensor(name="INPUT0", datatype="FP32", shape=[1, 2])]
    ),
    "duplicate-requested-output": lambda: pb.ModelInferRequest(
        model_name="identity_fp32",
        inputs=[_typed("FP32", [1, 1], fp32_contents=[1])],
        outputs=[
            pb.ModelInferRequest.InferRequestedOutputTensor(name="OUTPUT0"),
            pb.ModelInferRequest.InferRequestedOutputTensor(name="OUTPUT0"),
        ],
    ),
}


#: What each refusal must say: the check that caught it, not some other one.
EXPECTED_DETAIL = {
    "raw-and-typed-mixed": "typed contents in a request that uses raw_input_contents",
    "more-raw-blobs-than-inputs": "2 blobs for 1 inputs",
    "raw-size-short": "holds 12 bytes; shape [2, 2] of FP32 needs 16",
    "raw-size-long": "holds 20 bytes; shape [2, 2] of FP32 needs 16",
    "bytes-length-overruns-blob": "shorter than an element's declared length",
    "bytes-trailing-garbage": "more bytes than its shape declares",
    "bytes-cut-inside-prefix": "too few for 2 BYTES elements",
    "huge-shape-tiny-payload": "at most 67,108,864 elements",
    "huge-bytes-shape-tiny-payload": "too few for 33554432 BYTES elements",
    "product-overflows-int64": "at most 67,108,864 elements",
    "negative-dim": "non-negative",
    "too-many-dims": "more than 16 dimensions",
    "bool-byte-not-0-or-1": "only the bytes 0 and 1",
    "unknown-datatype": "Unsupported datatype 'FLOAT'",
    "bf16-not-supported": "Unsupported datatype 'BF16'",
    "duplicate-input-names": "duplicate name 'INPUT0'",
    "empty-model-name": "model name is required",
    "typed-count-short": "holds 3 values; shape [2, 2] needs 4",
    "typed-count-with-huge-shape": "at most 67,108,864 elements",
    "typed-wrong-field": "has values in fp32_contents; use int_contents",
    "typed-two-fields": "has values in int64_contents; use int_contents",
    "typed-int8-out-of-range": "outside the range of INT8",
    "typed-uint16-out-of-range": "outside the range of UINT16",
    "typed-fp16-has-no-field": "FP16, which has no typed contents field",
    "no-data-at-all": "holds 0 values; shape [1, 2] needs 2",
    "duplicate-requested-output": "requested twice",
}


def test_every_bad_request_has_an_expected_detail() -> None:
    assert set(EXPECTED_DETAIL) == set(BAD_REQUESTS)


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_malformed_requests_are_invalid_argument(
    service: ArrayService, stub: Any, case: str
) -> None:
    request = BAD_REQUESTS[case]()
    started = time.monotonic()
    error = _refused(stub, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert EXPECTED_DETAIL[case] in error.details()
    # Refused while decoding, so never seen by infer, but counted for the metrics.
    assert service.refused[-1] == (request.model_name, "", "grpc", 400)
    # Refused on the sizes alone, long before anything the shape promises is allocated.
    assert time.monotonic() - started < 5
    _assert_still_serving(stub)


def test_empty_typed_contents_next_to_raw_data_are_accepted(stub: Any) -> None:
    values = np.arange(4, dtype=np.float32).reshape(1, 4)
    request = _fp32_request(values)
    request.inputs[0].contents.SetInParent()  # present but empty: holds no values
    response = stub.ModelInfer(request, timeout=10)
    np.testing.assert_array_equal(_decode_output(response, 0), values)


def test_unknown_parameters_are_ignored(stub: Any) -> None:
    values = np.ones((1, 2), dtype=np.float32)
    request = _fp32_request(values)
    request.parameters["binary_data_output"].bool_param = True
    request.parameters["mystery"].string_param = "?"
    request.parameters["unset"].SetInParent()
    request.inputs[0].parameters["binary_data_size"].int64_param = 8
    response = stub.ModelInfer(request, timeout=10)
    np.testing.assert_array_equal(_decode_output(response, 0), values)


def test_shared_memory_is_unimplemented(stub: Any) -> None:
    request = pb.ModelInferRequest(
        model_name="identity_fp32",
        inputs=[Tensor(name="INPUT0", datatype="FP32", shape=[1, 1])],
    )
    request.inputs[0].parameters["shared_memory_region"].string_param = "region0"
    request.inputs[0].parameters["shared_memory_byte_size"].int64_param = 4
    error = _refused(stub, request)
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED
    _assert_still_serving(stub)


def test_busy_model_sends_retry_after(stub: Any) -> None:
    request = _raw_request("busy", [("INPUT0", "FP32", [1], b"\0" * 4)])
    error = _refused(stub, request)
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    trailers = dict(error.trailing_metadata())
    assert trailers["retry-after"] == str(int(np.ceil(RETRY_AFTER_S)))


def test_metadata_calls(stub: Any) -> None:
    assert stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live
    assert stub.ModelReady(pb.ModelReadyRequest(name="add_sub"), timeout=10).ready
    assert not stub.ModelReady(pb.ModelReadyRequest(name="loading"), timeout=10).ready
    meta = stub.ModelMetadata(pb.ModelMetadataRequest(name="repeat4", version="1"), timeout=10)
    assert (meta.name, list(meta.versions), list(meta.inputs[0].shape)) == ("repeat4", ["1"], [-1])
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelMetadata(pb.ModelMetadataRequest(name=""), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
