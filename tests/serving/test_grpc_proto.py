"""Shamal's ``inference`` proto against the one the stock ``tritonclient`` ships, and the error map.

The wire contract is field numbers and types, so messages are built with one set of generated
classes, serialised, and parsed with the other; every field must survive both ways. Both sets
live in one process here, which only works because Shamal's messages sit in a private
descriptor pool (see ``src/shamal/serving/_proto/README.md``).
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as triton_pb

from shamal.errors import (
    AlreadyExists,
    Conflict,
    InternalError,
    InvalidParameter,
    NotFound,
    NotImplementedFeature,
    PayloadTooLarge,
    PermissionDenied,
    ServiceUnavailable,
    TooManyRequests,
    Unauthenticated,
)
from shamal.serving._grpc import status_for
from shamal.serving._proto import grpc_predict_v2_pb2 as pb
from shamal.serving._types import DeadlineExceeded


def _full_infer_request(module: Any) -> Any:
    request = module.ModelInferRequest(
        model_name="m", model_version="3", id="req-1", raw_input_contents=[b"\x01\x02", b"\x03"]
    )
    request.parameters["flag"].bool_param = True
    request.parameters["count"].int64_param = -5
    request.parameters["tag"].string_param = "blue"
    request.parameters["alpha"].double_param = 0.25
    request.parameters["priority"].uint64_param = (1 << 64) - 1
    tensor = request.inputs.add(name="a", datatype="FP32", shape=[2, -1])
    tensor.parameters["p"].int64_param = 1
    contents = tensor.contents
    contents.bool_contents.extend([True, False])
    contents.int_contents.extend([-(1 << 31), 7])
    contents.int64_contents.extend([-(1 << 63)])
    contents.uint_contents.extend([(1 << 32) - 1])
    contents.uint64_contents.extend([(1 << 64) - 1])
    contents.fp32_contents.extend([1.5])
    contents.fp64_contents.extend([2.25])
    contents.bytes_contents.extend([b"", b"\x00x"])
    output = request.outputs.add(name="out")
    output.parameters["classification"].int64_param = 3
    return request


def _full_infer_response(module: Any) -> Any:
    response = module.ModelInferResponse(
        model_name="m", model_version="3", id="req-1", raw_output_contents=[b"\xff" * 8]
    )
    response.parameters["sequence_end"].bool_param = True
    tensor = response.outputs.add(name="out", datatype="BYTES", shape=[1])
    tensor.parameters["binary_data_size"].int64_param = 8
    tensor.contents.bytes_contents.append(b"abc")
    return response


def _full_model_metadata(module: Any) -> Any:
    meta = module.ModelMetadataResponse(name="m", versions=["1", "2"], platform="onnx_onnxv1")
    meta.inputs.add(name="x", datatype="INT64", shape=[-1, 3])
    meta.outputs.add(name="y", datatype="FP16", shape=[-1])
    return meta


@pytest.mark.parametrize("build", [_full_infer_request, _full_infer_response, _full_model_metadata])
@pytest.mark.parametrize(("writer", "reader"), [(pb, triton_pb), (triton_pb, pb)])
def test_messages_cross_parse_with_tritonclient(build: Any, writer: Any, reader: Any) -> None:
    sent = build(writer)
    received = getattr(reader, type(sent).__name__).FromString(sent.SerializeToString())
    assert json_format.MessageToDict(received) == json_format.MessageToDict(sent)
    assert received.SerializeToString(deterministic=True) == sent.SerializeToString(
        deterministic=True
    )


def test_health_and_metadata_messages_cross_parse() -> None:
    pairs = [
        pb.ServerLiveResponse(live=True),
        pb.ServerReadyResponse(ready=True),
        pb.ModelReadyRequest(name="m", version="2"),
        pb.ModelReadyResponse(ready=True),
        pb.ServerMetadataResponse(name="s", version="1", extensions=["binary_tensor_data"]),
        pb.ModelMetadataRequest(name="m", version="2"),
    ]
    for ours in pairs:
        theirs = getattr(triton_pb, type(ours).__name__).FromString(ours.SerializeToString())
        assert json_format.MessageToDict(theirs) == json_format.MessageToDict(ours)


def test_every_rpc_matches_tritonclients_service() -> None:
    ours = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    theirs = triton_pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert ours.full_name == theirs.full_name == "inference.GRPCInferenceService"
    for method in ours.methods:
        peer = theirs.methods_by_name[method.name]
        assert method.input_type.full_name == peer.input_type.full_name
        assert method.output_type.full_name == peer.output_type.full_name
    assert {m.name for m in ours.methods} == {
        "ServerLive",
        "ServerReady",
        "ModelReady",
        "ServerMetadata",
        "ModelMetadata",
        "ModelInfer",
    }


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (InvalidParameter("bad shape"), grpc.StatusCode.INVALID_ARGUMENT),
        (NotFound("no model"), grpc.StatusCode.NOT_FOUND),
        (PayloadTooLarge("too big"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (TooManyRequests("queue full"), grpc.StatusCode.UNAVAILABLE),
        (ServiceUnavailable("draining"), grpc.StatusCode.UNAVAILABLE),
        (DeadlineExceeded("late"), grpc.StatusCode.DEADLINE_EXCEEDED),
        (NotImplementedFeature("shm"), grpc.StatusCode.UNIMPLEMENTED),
        (Unauthenticated("who"), grpc.StatusCode.UNAUTHENTICATED),
        (PermissionDenied("no"), grpc.StatusCode.PERMISSION_DENIED),
        (AlreadyExists("twice"), grpc.StatusCode.ALREADY_EXISTS),
        (Conflict("state"), grpc.StatusCode.FAILED_PRECONDITION),
        (InternalError("oops"), grpc.StatusCode.INTERNAL),
    ],
)
def test_shamal_errors_keep_their_message(error: Any, code: Any) -> None:
    assert status_for(error) == (code, error.message, ())


def test_unknown_exceptions_are_internal_and_generic() -> None:
    code, message, trailers = status_for(KeyError("/srv/models/secret.onnx"))
    assert code == grpc.StatusCode.INTERNAL
    assert "secret" not in message
    assert trailers == ()


@pytest.mark.parametrize(
    ("retry_after", "trailer"),
    [(2.5, ("retry-after", "3")), (0.01, ("retry-after", "1")), (7, ("retry-after", "7"))],
)
def test_retry_after_becomes_a_trailer(retry_after: float, trailer: tuple[str, str]) -> None:
    error = TooManyRequests("queue full")
    error.retry_after_s = retry_after  # type: ignore[attr-defined]
    assert status_for(error)[2] == (trailer,)


@pytest.mark.parametrize("bogus", [float("nan"), float("inf"), -1.0, "soon"])
def test_unusable_retry_after_is_not_sent(bogus: object) -> None:
    error = ServiceUnavailable("draining")
    error.retry_after_s = bogus  # type: ignore[attr-defined]
    assert status_for(error)[2] == ()
