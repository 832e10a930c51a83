"""Spans of one new trace sent at once by many exporters (a batch processor per worker
process does this): the trace is made once, every span is kept, no request fails. On a live
server, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.live import LiveServer
from tests.traces.otlp import HEADER, SpanSpec, mlflow_id, new_trace_id, protobuf_of

pytestmark = pytest.mark.slow

SENDERS = 8


def test_concurrent_spans_of_one_new_trace_all_land(mlflow_server: LiveServer) -> None:
    auth = {"Authorization": f"Bearer {mlflow_server.token}"}
    made = httpx.post(
        f"{mlflow_server.url}/api/2.0/mlflow/experiments/create",
        json={"name": f"concurrent-{uuid.uuid4().hex[:8]}"},
        headers=auth,
    )
    assert made.status_code == 200, made.text
    experiment = made.json()["experiment_id"]
    trace = new_trace_id()
    root = SpanSpec("root", trace)
    spans = [root] + [
        SpanSpec(f"child-{i}", trace, parent=root.span_id) for i in range(SENDERS - 1)
    ]
    start = threading.Barrier(SENDERS)

    def send(span: SpanSpec) -> int:
        with httpx.Client(timeout=60) as client:
            start.wait(30)
            answer = client.post(
                f"{mlflow_server.url}/v1/traces",
                content=protobuf_of(span),
                headers={**auth, HEADER: experiment, "Content-Type": "application/x-protobuf"},
            )
            return answer.status_code

    with ThreadPoolExecutor(SENDERS) as pool:
        statuses = list(pool.map(send, spans))
    assert statuses == [200] * SENDERS
    got = httpx.get(
        f"{mlflow_server.url}/api/3.0/mlflow/traces/get",
        params={"trace_id": mlflow_id(trace)},
        headers=auth,
    )
    assert got.status_code == 200, got.text
    names = [s["name"] for s in got.json()["trace"]["spans"]]
    assert names[0] == "root"
    assert sorted(names[1:]) == sorted(f"child-{i}" for i in range(SENDERS - 1))
    assert got.json()["trace"]["trace_info"]["state"] == "OK"
