"""Hostile tensors and payloads (hostile-inputs.md §8, §9): each a clean 4xx, fast, and the
server answers a good request afterwards."""

from __future__ import annotations

import contextlib
import gzip
import json
import socket
import struct
import time

import httpx
import numpy as np
import pytest

from tests.serving.conftest import ServerProcess

LIMIT = 4 * 1024 * 1024  # the oip_server body limit


def _post(server: ServerProcess, model: str, body: object, **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        f"{server.url}/v2/models/{model}/infer", content=content, headers=headers, timeout=30
    )


def _fp32(
    shape: list[int], data: object, name: str = "INPUT0", datatype: str = "FP32"
) -> dict[str, object]:
    return {"inputs": [{"name": name, "datatype": datatype, "shape": shape, "data": data}]}


def _raw_fp32_body(data: str) -> bytes:
    """A request whose ``data`` is the JSON text ``data``, written verbatim."""
    prefix = '{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,4],"data":'
    return (prefix + data + "}]}").encode()


def _assert_still_serving(server: ServerProcess) -> None:
    ok = _post(server, "identity_fp32", _fp32([1, 4], [1, 2, 3, 4]))
    assert ok.status_code == 200
    assert ok.json()["outputs"][0]["data"] == [1, 2, 3, 4]


def _error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert "Traceback" not in body["error"]
    assert "/work" not in body["error"]
    assert "/tmp" not in body["error"]
    return str(body["error"])


@pytest.mark.parametrize(
    ("case", "body"),
    [
        ("wrong rank", _fp32([4], [1, 2, 3, 4])),
        ("wrong fixed dim", _fp32([1, 3], [1, 2, 3])),
        ("batch of a million rows, four elements", _fp32([1_000_000, 4], [1, 2, 3, 4])),
        ("huge declared shape", _fp32([1 << 40, 1 << 40], [1])),
        ("shape overflowing uint64", _fp32([1 << 64], [1])),
        ("negative dim", _fp32([-1, 4], [1, 2, 3, 4])),
        ("zero dim", _fp32([0, 4], [])),
        ("strings for numbers", _fp32([1, 4], ["1", "2", "3", "4"])),
        ("booleans for numbers", _fp32([1, 4], [True, False, True, False])),
        ("ragged nesting", _fp32([2, 4], [[1, 2, 3, 4], [5, 6]])),
        ("nesting against shape", _fp32([2, 4], [[1, 2], [3, 4], [5, 6], [7, 8]])),
        ("element count", _fp32([1, 4], [1, 2, 3])),
        ("FP64 into an FP32 model", _fp32([1, 4], [1, 2, 3, 4], datatype="FP64")),
        ("unknown datatype", _fp32([1, 4], [1, 2, 3, 4], datatype="FP128")),
        ("BF16 as JSON", _fp32([1, 4], [1, 2, 3, 4], datatype="BF16")),
        ("shape not a list", _fp32("[1,4]", [1, 2, 3, 4])),  # type: ignore[arg-type]
        ("data not a list", _fp32([1, 1], 5)),
        ("inputs missing", {"outputs": []}),
        ("inputs empty", {"inputs": []}),
        ("duplicate input", {"inputs": _fp32([1, 4], [1, 2, 3, 4])["inputs"] * 2}),  # type: ignore[operator]
        ("id not a string", {"id": 5, **_fp32([1, 4], [1, 2, 3, 4])}),
        ("body not an object", [1, 2, 3]),
    ],
)
def test_malformed_tensors_are_400(oip_server: ServerProcess, case: str, body: object) -> None:
    _error(_post(oip_server, "identity_fp32", body), 400)
    _assert_still_serving(oip_server)


def test_integer_range_and_float_for_int(oip_server: ServerProcess) -> None:
    _error(
        _post(oip_server, "identity_uint8", _fp32([1, 4], [1, 2, 3, 256], datatype="UINT8")), 400
    )
    _error(_post(oip_server, "identity_int8", _fp32([1, 4], [1, 2, 3, -129], datatype="INT8")), 400)
    _error(
        _post(oip_server, "identity_int32", _fp32([1, 4], [1, 2, 3, 4.5], datatype="INT32")), 400
    )
    _error(
        _post(oip_server, "identity_uint64", _fp32([1, 4], [1, 2, 3, 1 << 64], datatype="UINT64")),
        400,
    )
    _error(_post(oip_server, "identity_bool", _fp32([1, 4], [1, 0, 1, 0], datatype="BOOL")), 400)
    _error(_post(oip_server, "identity_bytes", _fp32([1, 4], [1, 2, 3, 4], datatype="BYTES")), 400)


def test_fp64_into_fp16_model_is_400(oip_server: ServerProcess) -> None:
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "FP64",
                "shape": [1, 4],
                "parameters": {"binary_data_size": 32},
            }
        ]
    }
    text = json.dumps(header).encode()
    blob = np.ones(4, "<f8").tobytes()
    response = _post(
        oip_server,
        "identity_fp16",
        text + blob,
        **{"Inference-Header-Content-Length": str(len(text))},
    )
    assert "FP16" in _error(response, 400)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e309"])
def test_nan_inf_and_overflowing_literals_are_accepted_not_500(
    oip_server: ServerProcess, literal: str
) -> None:
    body = _raw_fp32_body(f"[1,2,3,{literal}]")
    response = _post(oip_server, "identity_fp32", body)
    assert response.status_code == 200
    # JSON cannot carry NaN/Inf, so that output comes back binary (tritonclient reads both).
    split = int(response.headers["inference-header-content-length"])
    value = np.frombuffer(response.content[split:], "<f4")[3]
    expected = {"NaN": np.nan, "Infinity": np.inf, "-Infinity": -np.inf, "1e309": np.inf}[literal]
    np.testing.assert_equal(value, np.float32(expected))


def test_ten_thousand_deep_nesting_is_400(oip_server: ServerProcess) -> None:
    deep = "[" * 10_000 + "1" + "]" * 10_000
    body = _raw_fp32_body(deep)
    assert "nested" in _error(_post(oip_server, "identity_fp32", body), 400)
    dict_deep = ('{"a":' * 10_000 + "1" + "}" * 10_000).encode()
    _error(_post(oip_server, "identity_fp32", dict_deep), 400)
    _assert_still_serving(oip_server)


def test_moderately_deep_nesting_is_400(oip_server: ServerProcess) -> None:
    deep = "[" * 500 + "1" + "]" * 500
    body = _raw_fp32_body(deep)
    _error(_post(oip_server, "identity_fp32", body), 400)


def _binary(
    header: dict[str, object], blobs: bytes, declared: int | None = None
) -> tuple[bytes, str]:
    text = json.dumps(header).encode()
    return text + blobs, str(len(text) if declared is None else declared)


def _binary_input(datatype: str, shape: list[int], size: int) -> dict[str, object]:
    return {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": datatype,
                "shape": shape,
                "parameters": {"binary_data_size": size},
            }
        ]
    }


@pytest.mark.parametrize(
    ("case", "model", "header", "blob", "declared"),
    [
        (
            "header length beyond body",
            "identity_fp32",
            _binary_input("FP32", [1, 4], 16),
            b"\0" * 16,
            10_000,
        ),
        (
            "header length not a number",
            "identity_fp32",
            _binary_input("FP32", [1, 4], 16),
            b"\0" * 16,
            -5,
        ),
        (
            "header length cuts the JSON",
            "identity_fp32",
            _binary_input("FP32", [1, 4], 16),
            b"\0" * 16,
            20,
        ),
        ("raw size mismatch", "identity_fp32", _binary_input("FP32", [1, 4], 12), b"\0" * 12, None),
        (
            "declared size beyond blobs",
            "identity_fp32",
            _binary_input("FP32", [1, 4], 16),
            b"\0" * 8,
            None,
        ),
        ("trailing bytes", "identity_fp32", _binary_input("FP32", [1, 4], 16), b"\0" * 20, None),
        ("negative binary size", "identity_fp32", _binary_input("FP32", [1, 4], -16), b"", None),
        (
            "BYTES prefix overruns",
            "identity_bytes",
            _binary_input("BYTES", [1, 1], 8),
            struct.pack("<I", 100) + b"abcd",
            None,
        ),
        (
            "BYTES truncated prefix",
            "identity_bytes",
            _binary_input("BYTES", [1, 2], 6),
            struct.pack("<I", 1) + b"a" + b"\0",
            None,
        ),
        ("BOOL byte not 0/1", "identity_bool", _binary_input("BOOL", [1, 4], 4), b"\0\1\2\0", None),
    ],
)
def test_binary_framing_lies_are_400(
    oip_server: ServerProcess,
    case: str,
    model: str,
    header: dict[str, object],
    blob: bytes,
    declared: int | None,
) -> None:
    body, length = _binary(header, blob, declared)
    response = _post(oip_server, model, body, **{"Inference-Header-Content-Length": length})
    _error(response, 400)
    _assert_still_serving(oip_server)


@pytest.mark.parametrize(
    ("case", "model", "body", "status", "says"),
    [
        ("a byte short of one row", "identity_fp32", b"\0" * 15, 400, "16"),
        ("two rows: a raw request is batch 1", "identity_fp32", b"\0" * 32, 400, "16"),
        ("empty body", "identity_fp32", b"", 400, "16"),
        ("BOOL byte other than 0/1", "identity_bool", b"\0\1\2\0", 400, "BOOL"),
        ("part of a variable-length row", "tokens", b"\0" * 12, 400, "whole number"),
        ("no element of a variable-length row", "tokens", b"", 400, "whole number"),
        ("two inputs", "add_sub", b"\0" * 16, 400, "binary_data_size"),
        ("four BYTES elements", "identity_bytes", b"abcd", 400, "more than one element"),
        ("no such model", "ghost", b"\0" * 16, 404, "ghost"),
    ],
)
def test_raw_binary_requests_that_do_not_fit_the_input(
    oip_server: ServerProcess, case: str, model: str, body: bytes, status: int, says: str
) -> None:
    response = _post(oip_server, model, body, **{"Inference-Header-Content-Length": "0"})
    assert says in _error(response, status)
    _assert_still_serving(oip_server)


@pytest.mark.parametrize(
    ("model", "output", "count"),
    [
        ("iris", "probabilities", 0),
        ("iris", "probabilities", -3),
        ("iris", "probabilities", "2"),
        ("iris", "probabilities", True),
        ("iris", "probabilities", 2.0),
        ("identity_bytes", "OUTPUT0", 1),
        ("identity_bool", "OUTPUT0", 1),
    ],
)
def test_classification_counts_and_outputs_that_cannot_be_ranked_are_400(
    oip_server: ServerProcess, model: str, output: str, count: object
) -> None:
    request = {
        "inputs": [{"name": "float_input", "datatype": "FP32", "shape": [1, 4], "data": [1] * 4}],
        "outputs": [{"name": output, "parameters": {"classification": count}}],
    }
    if model != "iris":
        datatype = model.removeprefix("identity_").upper()
        data = ["a"] * 4 if datatype == "BYTES" else [True] * 4
        request["inputs"] = _fp32([1, 4], data, datatype=datatype)["inputs"]
    assert "classif" in _error(_post(oip_server, model, request), 400)
    _assert_still_serving(oip_server)


@pytest.mark.parametrize("declared", ["-0", "0x0", "0.0", "zero", "1" * 40])
def test_raw_binary_header_lies_are_400(oip_server: ServerProcess, declared: str) -> None:
    response = _post(
        oip_server, "identity_fp32", b"\0" * 16, **{"Inference-Header-Content-Length": declared}
    )
    _error(response, 400)
    _assert_still_serving(oip_server)


@pytest.mark.parametrize(
    "content_type", ["application/vnd.bentoml+pickle", "application/python-pickle"]
)
def test_pickle_content_types_are_415(oip_server: ServerProcess, content_type: str) -> None:
    response = _post(
        oip_server, "identity_fp32", b"\x80\x04K\x01.", **{"Content-Type": content_type}
    )
    assert "ickle" in _error(response, 415)


def test_oversized_content_length_is_413_before_the_body(oip_server: ServerProcess) -> None:
    host, port = oip_server.host_port.split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(
            b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 10737418240\r\n\r\n{"
        )
        reply = b""
        while b'"}' not in reply:  # the server closes the connection after its answer
            chunk = conn.recv(4096)
            if not chunk:
                break
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 413")
    assert b'{"error"' in reply
    assert time.monotonic() - started < 5
    _assert_still_serving(oip_server)


def test_chunked_body_over_the_limit_is_413(oip_server: ServerProcess) -> None:
    def chunks() -> object:
        piece = b" " * (256 * 1024)
        for _ in range(LIMIT // len(piece) + 2):
            yield piece

    response = httpx.post(
        f"{oip_server.url}/v2/models/identity_fp32/infer", content=chunks(), timeout=30
    )
    _error(response, 413)
    _assert_still_serving(oip_server)


def test_gzip_bomb_is_413(oip_server: ServerProcess) -> None:
    bomb = gzip.compress(b" " * (LIMIT * 4))
    assert len(bomb) < LIMIT
    response = _post(oip_server, "identity_fp32", bomb, **{"Content-Encoding": "gzip"})
    _error(response, 413)
    _assert_still_serving(oip_server)


def test_corrupt_json_and_bad_utf8_are_400(oip_server: ServerProcess) -> None:
    _error(_post(oip_server, "identity_fp32", b'{"inputs": [}'), 400)
    _error(_post(oip_server, "identity_fp32", b'{"inputs": "\xff\xfe"}'), 400)
    _error(_post(oip_server, "identity_fp32", b""), 400)


def test_one_megabyte_header_is_400_and_the_server_lives(oip_server: ServerProcess) -> None:
    host, port = oip_server.host_port.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        head = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: "
        with contextlib.suppress(OSError):  # the server may close before taking it all
            conn.sendall(head + b"a" * (1 << 20) + b"\r\n\r\n")
        reply = conn.recv(4096)
    assert reply.startswith(b"HTTP/1.1 400")
    _assert_still_serving(oip_server)
