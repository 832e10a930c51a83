"""Smaller holes of `shamal serve` a hostile tenant showed (issue 18, point 6).

* A JSON infer request holding a lone UTF-16 surrogate (``"\\ud800"``) in any field: 400, and the
  connection stays usable.
* An infer request to a model not served here: 404 whatever its body holds (too large,
  malformed, pickled, compressed garbage): the model is looked up before the body is read.
"""

from __future__ import annotations

import gzip
import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.serving.conftest import ServerProcess

LONE = "\ud800"
LIMIT = 4 * 1024 * 1024  # the oip_server body limit


def _variants(body: Any) -> Iterator[tuple[str, Any]]:
    """(where, body with one string or key replaced by a lone surrogate) for every string
    leaf and key of ``body``."""
    if isinstance(body, str):
        yield "", LONE
    elif isinstance(body, dict):
        for key, value in body.items():
            for where, changed in _variants(value):
                yield f".{key}{where}", {**body, key: changed}
            yield f".<key {key}>", {(LONE if k == key else k): v for k, v in body.items()}
    elif isinstance(body, list):
        for i, value in enumerate(body):
            for where, changed in _variants(value):
                yield f"[{i}]{where}", [*body[:i], changed, *body[i + 1 :]]


GOOD = {
    "text": {
        "id": "r1",
        "parameters": {"tag": "x"},
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "BYTES",
                "shape": [1, 1],
                "data": ["hello"],
                "parameters": {"note": "n"},
            }
        ],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}],
    },
    "identity_fp32": {
        "id": "r2",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}],
    },
}


def _raw_request(host_port: str, path: str, body: bytes, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host_port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


def _exchange(sock: socket.socket, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """One request on ``sock``; (status, headers, body) of its Content-Length framed answer."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {
        k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])
    }
    length = int(headers["content-length"])
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        rest += chunk
    return int(lines[0].split()[1]), headers, rest


def test_a_lone_surrogate_in_any_field_is_a_400(oip_server: ServerProcess) -> None:
    host, port = oip_server.host_port.rsplit(":", 1)
    failures = []
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        for model, good in GOOD.items():
            path = f"/v2/models/{model}/infer"
            status, _, answer = _exchange(
                sock, _raw_request(oip_server.host_port, path, json.dumps(good).encode())
            )
            assert status == 200, answer
            for where, changed in _variants(good):
                body = json.dumps(changed).encode()  # the surrogate travels as \ud800
                status, headers, answer = _exchange(
                    sock, _raw_request(oip_server.host_port, path, body)
                )
                if status != 400 or "connection" in headers:
                    failures.append(f"{model} {where}: {status} {answer[:120]!r}")
        # The same connection still serves a good request.
        status, _, answer = _exchange(
            sock,
            _raw_request(
                oip_server.host_port,
                "/v2/models/identity_fp32/infer",
                json.dumps(GOOD["identity_fp32"]).encode(),
            ),
        )
        assert status == 200, answer
    assert not failures, "\n".join(failures)


def test_a_surrogate_pair_in_bytes_data_is_text(oip_server: ServerProcess) -> None:
    body = json.loads(json.dumps(GOOD["text"]))
    body["inputs"][0]["data"] = ["smile \U0001f600"]
    answer = httpx.post(
        f"{oip_server.url}/v2/models/text/infer", content=json.dumps(body), timeout=30
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == ["smile \U0001f600"]


@pytest.mark.parametrize(
    ("case", "body", "headers"),
    [
        ("malformed JSON", b"{not json", {}),
        ("not an object", b"[1, 2]", {}),
        ("lone surrogate", b'{"inputs": [{"name": "\\ud800"}]}', {}),
        ("pickle", b"\x80\x04K\x01.", {"Content-Type": "application/python-pickle"}),
        ("gzip garbage", b"\x1f\x8bnot gzip", {"Content-Encoding": "gzip"}),
        ("unknown encoding", b"{}", {"Content-Encoding": "br"}),
        ("raw binary", b"\x00" * 16, {"Inference-Header-Content-Length": "0"}),
        ("bad framing", b"{}", {"Inference-Header-Content-Length": "999"}),
        ("over the limit", b"x" * (LIMIT + 1), {}),
        ("empty", b"", {}),
    ],
)
def test_an_unknown_model_is_404_whatever_the_body(
    oip_server: ServerProcess, case: str, body: bytes, headers: dict[str, str]
) -> None:
    for path in (
        "/v2/models/no_such_model/infer",
        "/v2/models/no_such_model/versions/1/infer",
        "/v2/models/scale/versions/99/infer",
    ):
        answer = httpx.post(f"{oip_server.url}{path}", content=body, headers=headers, timeout=30)
        assert answer.status_code == 404, (case, path, answer.text)
        assert set(answer.json()) == {"error"}


def test_an_unknown_model_with_a_huge_declared_body_is_404_at_once(
    oip_server: ServerProcess,
) -> None:
    """Content-Length says 10 GB and no byte of it is sent: the answer comes anyway."""
    host, port = oip_server.host_port.rsplit(":", 1)
    head = (
        f"POST /v2/models/no_such_model/infer HTTP/1.1\r\nHost: {oip_server.host_port}\r\n"
        f"Content-Length: {10 * 1024**3}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head)
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 404 "), answer[:200]


def test_a_known_model_still_refuses_a_malformed_body_with_400(
    oip_server: ServerProcess,
) -> None:
    answer = httpx.post(
        f"{oip_server.url}/v2/models/identity_fp32/infer", content=b"{not json", timeout=30
    )
    assert answer.status_code == 400
    too_big = httpx.post(
        f"{oip_server.url}/v2/models/identity_fp32/infer", content=b"x" * (LIMIT + 1), timeout=30
    )
    assert too_big.status_code == 413
    body = gzip.compress(json.dumps(GOOD["identity_fp32"]).encode())
    ok = httpx.post(
        f"{oip_server.url}/v2/models/identity_fp32/infer",
        content=body,
        headers={"Content-Encoding": "gzip"},
        timeout=30,
    )
    assert ok.status_code == 200, ok.text
