"""Malformed tracking requests are refused in a stock server's words (issue 26, point 1).

MLflow's own REST suite (``bench/mlflow_suite.py``) sends raw requests with fields of the
wrong type and matches on the stock server's message: ``Invalid value 31 for parameter
'run_id' supplied``, ``Missing value for required parameter 'metrics[0].timestamp'``, fields
checked in the stock server's order. The same requests here, against a live Shamal on SQLite
and PostgreSQL, with the stock client's transport where the client sends them itself; and the
one logged-model route of the suite Shamal lacked (a model's file, as the UI reads it).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from mlflow import MlflowClient

from tests.live import LiveServer

pytestmark = pytest.mark.slow


def _post(server: LiveServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{server.url}/api/2.0/mlflow/{path}",
        json=body,
        headers={"Authorization": f"Bearer {server.token}"},
    )


def _refused(server: LiveServer, path: str, body: dict[str, Any], words: str) -> None:
    answer = _post(server, path, body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    assert words in answer.json()["message"], answer.text


@pytest.fixture
def run_id(mlflow_env: LiveServer) -> str:
    client = MlflowClient(tracking_uri=mlflow_env.url, registry_uri=mlflow_env.url)
    experiment = client.create_experiment(f"refusals-{uuid.uuid4().hex[:8]}")
    return client.create_run(experiment).info.run_id


def test_fields_of_the_wrong_type_are_named_with_their_value(
    mlflow_env: LiveServer, run_id: str
) -> None:
    s = mlflow_env
    _refused(s, "experiments/create", {"name": 123}, "Invalid value 123 for parameter 'name'")
    _refused(
        s,
        "experiments/create",
        {"name": "x", "artifact_location": 9.0, "tags": [{"key": "k", "value": "v"}]},
        "Invalid value 9.0 for parameter 'artifact_location'",
    )
    _refused(
        s,
        "experiments/create",
        {"name": "x", "tags": "5"},
        "Invalid value \"5\" for parameter 'tags'",
    )
    metric = {"key": "m", "value": 1.0, "timestamp": 1, "step": 0}
    _refused(
        s,
        "runs/log-metric",
        {**metric, "run_id": 31, "key": 32},
        "Invalid value 31 for parameter 'run_id' supplied",
    )
    _refused(
        s,
        "runs/log-metric",
        {**metric, "run_id": run_id, "key": 31},
        "Invalid value 31 for parameter 'key' supplied",
    )
    _refused(
        s,
        "runs/log-metric",
        {**metric, "run_id": run_id, "step": "foo"},
        "Invalid value \"foo\" for parameter 'step' supplied",
    )
    _refused(
        s,
        "runs/log-metric",
        {**metric, "run_id": run_id, "timestamp": "foo"},
        "Invalid value \"foo\" for parameter 'timestamp' supplied",
    )
    _refused(
        s,
        "runs/log-parameter",
        {"run_id": 31, "key": 32, "value": "v"},
        "Invalid value 31 for parameter 'run_id' supplied",
    )
    _refused(
        s,
        "runs/set-tag",
        {"run_id": run_id, "key": "t", "value": 41},
        "Invalid value 41 for parameter 'value' supplied",
    )
    for field in ("metrics", "params", "tags"):
        _refused(
            s,
            "runs/log-batch",
            {"run_id": run_id, field: "foo"},
            f"Invalid value \"foo\" for parameter '{field}' supplied",
        )
    # Nothing of the refused requests was logged.
    run = MlflowClient(tracking_uri=s.url).get_run(run_id)
    assert (run.data.metrics, run.data.params, run.data.tags.get("t")) == ({}, {}, None)


def test_a_batch_metric_needs_its_timestamp(mlflow_env: LiveServer, run_id: str) -> None:
    _refused(
        mlflow_env,
        "runs/log-batch",
        {"run_id": run_id, "metrics": [{"key": "mae", "value": 2.5}]},
        "Missing value for required parameter 'metrics[0].timestamp'",
    )
    ok = _post(
        mlflow_env,
        "runs/log-batch",
        {"run_id": run_id, "metrics": [{"key": "mae", "value": 2.5, "timestamp": 7}]},
    )
    assert ok.status_code == 200, ok.text
    client = MlflowClient(tracking_uri=mlflow_env.url)
    assert [(m.value, m.timestamp, m.step) for m in client.get_metric_history(run_id, "mae")] == [
        (2.5, 7, 0)
    ]
    # log-metric alone still takes an absent timestamp as the server's time.
    assert _post(
        mlflow_env, "runs/log-metric", {"run_id": run_id, "key": "t", "value": 1.0}
    ).is_success


def test_an_artifact_path_that_climbs_out_is_an_invalid_path(
    mlflow_env: LiveServer, run_id: str
) -> None:
    answer = httpx.get(
        f"{mlflow_env.url}/api/2.0/mlflow/artifacts/list",
        params={"run_id": run_id, "path": "../path"},
        headers={"Authorization": f"Bearer {mlflow_env.token}"},
    )
    assert answer.status_code == 400
    assert answer.json() == {"error_code": "INVALID_PARAMETER_VALUE", "message": "Invalid path"}


def test_a_logged_models_file_is_served_to_the_ui(mlflow_env: LiveServer, tmp_path: Path) -> None:
    client = MlflowClient(tracking_uri=mlflow_env.url)
    experiment = client.create_experiment(f"files-{uuid.uuid4().hex[:8]}")
    model = client.create_logged_model(experiment)
    (tmp_path / "MLmodel").write_text(f"model_id: {model.model_id}\n")
    client.log_model_artifacts(model.model_id, str(tmp_path))
    headers = {"Authorization": f"Bearer {mlflow_env.token}"}
    url = f"{mlflow_env.url}/ajax-api/2.0/mlflow/logged-models/{model.model_id}/artifacts/files"
    answer = httpx.get(url, params={"artifact_file_path": "MLmodel"}, headers=headers)
    assert answer.status_code == 200, answer.text
    assert answer.text == f"model_id: {model.model_id}\n"
    climbing = httpx.get(url, params={"artifact_file_path": "../x"}, headers=headers)
    assert climbing.status_code == 400
    missing = httpx.get(
        url.replace(model.model_id, "m-" + "0" * 32),
        params={"artifact_file_path": "MLmodel"},
        headers=headers,
    )
    assert missing.status_code == 404
    assert httpx.get(url, params={"artifact_file_path": "MLmodel"}).status_code == 401


def test_repeated_slashes_redirect_to_the_route_as_on_a_stock_server(
    mlflow_env: LiveServer, run_id: str
) -> None:
    """A stock server's router merges repeated slashes with a 308 (MLflow's suite asks for
    ``//model-versions/get-artifact``); the route then refuses a path that climbs out."""
    auth = {"Authorization": f"Bearer {mlflow_env.token}"}
    climbing = {"name": "model", "version": "1", "path": "../path"}
    first = httpx.get(
        f"{mlflow_env.url}//model-versions/get-artifact", params=climbing, headers=auth
    )
    assert first.status_code == 308
    assert first.headers["location"] == (
        "/model-versions/get-artifact?name=model&version=1&path=..%2Fpath"
    )
    for path, params in (
        ("//model-versions/get-artifact", climbing),
        ("//get-artifact", {"run_id": run_id, "path": "../path"}),
    ):
        answer = httpx.get(
            f"{mlflow_env.url}{path}", params=params, headers=auth, follow_redirects=True
        )
        assert answer.status_code == 400, (path, answer.text)
        assert answer.json() == {"error_code": "INVALID_PARAMETER_VALUE", "message": "Invalid path"}
    found = httpx.get(
        f"{mlflow_env.url}/api/2.0/mlflow//runs///get",
        params={"run_id": run_id},
        headers=auth,
        follow_redirects=True,
    )
    assert found.status_code == 200, found.text
    assert found.json()["run"]["info"]["run_id"] == run_id
    # No route either way: a 404, never a redirect (and never one to another host).
    for nowhere in ("//nowhere//at-all", "//\\evil.example/get-artifact", "//evil.example/"):
        missing = httpx.get(f"{mlflow_env.url}{nowhere}", headers=auth)
        assert missing.status_code == 404, (nowhere, missing.text)
        assert "location" not in missing.headers
