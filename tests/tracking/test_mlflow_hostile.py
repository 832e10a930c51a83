"""Hostile input against the MLflow dialect: fuzzed bodies, traversal, foreign URIs."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.routing import APIRoute, iter_route_contexts
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shamal.errors import InvalidParameter, NotFound
from shamal.server import Platform
from tests.test_artifacts_api import HOSTILE_PATHS, raw_request

FIELDS = [
    "experiment_id",
    "name",
    "run_id",
    "run_uuid",
    "key",
    "value",
    "timestamp",
    "step",
    "metrics",
    "params",
    "tags",
    "filter",
    "order_by",
    "max_results",
    "page_token",
    "experiment_ids",
    "status",
    "end_time",
    "run_name",
    "new_name",
    "datasets",
    "models",
    "metric_key",
    "view_type",
    "run_view_type",
    "path",
    "experiment_name",
    "model_id",
]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=30),
    st.sampled_from(
        ["0", "NaN", "Infinity", "' OR 1=1 --", "../../etc", "metrics.x > 1", "a" * 300]
    ),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(FIELDS), inner, max_size=4)
    ),
    max_leaves=12,
)
bodies = st.dictionaries(
    st.one_of(st.sampled_from(FIELDS), st.text(max_size=8)), values, max_size=8
)


def _mlflow_routes(app: Any) -> list[tuple[str, str]]:
    routes = []
    for rc in iter_route_contexts(app.routes):
        if isinstance(rc.original_route, APIRoute) and rc.path.startswith("/api/2.0/mlflow/"):
            routes += [(m, rc.path) for m in sorted(rc.methods)]
    return routes


@pytest.fixture
def mlflow_api(platform: Platform, api: TestClient) -> TestClient:
    return api


def test_fuzzed_bodies_never_cause_a_server_error(
    mlflow_api: TestClient, platform: Platform
) -> None:
    routes = _mlflow_routes(mlflow_api.app)
    assert len(routes) > 30

    @given(route=st.sampled_from(routes), body=bodies)
    @settings(
        max_examples=400,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def check(route: tuple[str, str], body: dict[str, Any]) -> None:
        method, path = route
        path = path.replace("{model_id}", "m-0").replace("{tag_key}", "k")
        if method == "GET":
            params = {k: str(v) for k, v in body.items() if v is not None}
            r = mlflow_api.request(method, path, params=params)
        else:
            # json.dumps writes bare NaN/Infinity (invalid JSON): the server must cope.
            r = mlflow_api.request(
                method, path, content=json.dumps(body), headers={"Content-Type": "application/json"}
            )
        assert r.status_code < 500, (method, path, body, r.text)
        assert r.json().get("error_code") != "INTERNAL_ERROR"

    check()
    assert platform.audit.verify().ok


@pytest.mark.parametrize("raw", HOSTILE_PATHS, ids=lambda p: p[:40])
def test_artifact_proxy_rejects_hostile_paths(
    mlflow_api: TestClient, platform: Platform, raw: str
) -> None:
    token = mlflow_api.headers["Authorization"].removeprefix("Bearer ")
    for method in ("PUT", "GET", "DELETE"):
        status, body = raw_request(
            mlflow_api.app,
            method,
            f"/api/2.0/mlflow-artifacts/artifacts/0/{raw}",
            b"evil" if method == "PUT" else b"",
            token,
        )
        assert status in (400, 404), (method, status, body)
    status, _ = raw_request(
        mlflow_api.app, "GET", f"/api/2.0/mlflow-artifacts/artifacts?path=0/{raw}", b"", token
    )
    assert status in (200, 400, 404)
    assert platform.artifacts.files_under("mlflow/0") == []


STORED_URIS = [
    "file:///etc",
    "file:/etc/passwd",
    "/etc",
    "//proc/self/root/etc",
    "http:///#/../../../../etc/",
    "http://x/base?../../../etc",
    "mlflow-artifacts://h:1/../../../../",
    "mlflow-artifacts:/../../etc",
    "mlflow-artifacts:/0/..%2f..%2fetc",
    "mlflow-artifacts:/%2e%2e/x",
    "s3:/bucket/models/../../other",
    "s3://other-tenant-bucket/x",
    "dbfs:/x",
    "ftp://x/y",
    "gopher://127.0.0.1:6379/_SET",
    "jar:file:///x!/",
    "netdoc:///etc/passwd",
    "http://x/artifacts%00",
    "HTTP://X/../../",
    "runs:/../../etc",
    "runs:/nope/model",
    "models:/m-doesnotexist",
    "models:/other-model/1",
    "",
]


@pytest.mark.parametrize("uri", STORED_URIS)
def test_model_sources_accept_only_uris_we_minted(
    platform: Platform, admin_token: str, uri: str
) -> None:
    principal = platform.security.authenticate(admin_token)
    with pytest.raises((InvalidParameter, NotFound)):
        platform.tracking.resolve_model_source(principal, uri)


def test_malformed_model_references_are_400_not_500(mlflow_api: TestClient) -> None:
    """Found by the fuzzer: a non-numeric step reached int() and answered 500."""
    for path, body in (
        ("runs/outputs", {"run_id": "x", "models": {"step": ":"}}),
        ("runs/outputs", {"run_id": "x", "models": [{"model_id": "m", "step": "a"}]}),
        ("runs/log-inputs", {"run_id": "x", "models": [{"model_id": 5}]}),
    ):
        r = mlflow_api.post(f"/api/2.0/mlflow/{path}", json=body)
        assert r.status_code == 400, (path, body, r.text)
