"""The logging hot path and the history read, over HTTP, on both backends.

``log-batch`` reads the stock client's shape of a metric directly and every other spelling
through the general parser; both must store the same points. History pages answer each
point the way the stock server does: key, value, timestamp, step.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from fastapi.testclient import TestClient

from shamal.server import Platform

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


def _post(api: TestClient, path: str, body: dict[str, Any]) -> Any:
    return api.post(f"/api/2.0/mlflow/{path}", json=body)


@pytest.fixture
def run_id(api: TestClient) -> str:
    exp = _post(api, "experiments/create", {"name": "hot-path"}).json()["experiment_id"]
    run = _post(api, "runs/create", {"experiment_id": exp}).json()
    return str(run["run"]["info"]["run_id"])


def _history(api: TestClient, run_id: str, key: str, page: int | None = None) -> list[Any]:
    points: list[Any] = []
    token = None
    while True:
        params: dict[str, Any] = {"run_id": run_id, "metric_key": key}
        if page:
            params["max_results"] = page
        if token:
            params["page_token"] = token
        answer = api.get("/api/2.0/mlflow/metrics/get-history", params=params)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        points += body.get("metrics", [])
        token = body.get("next_page_token")
        if not token:
            return points


def test_every_spelling_of_a_metric_stores_the_same_point(api: TestClient, run_id: str) -> None:
    stock = [{"key": "m", "value": 0.5, "timestamp": 1000 + i, "step": i} for i in range(3)]
    other = [
        {"key": "m", "value": 0.5, "timestamp": "1003", "step": "3"},  # int64 as strings
        {"key": "m", "value": 1, "timestamp": 1004, "step": 4},  # an int value
        {"key": "m", "value": "0.5", "timestamp": 1005.0, "step": 5},  # a float step
        {"key": "m", "value": "NaN", "timestamp": 1006, "step": 6},
        {"key": "m", "value": "Infinity", "timestamp": 1007, "step": 7},
        {"key": "m", "value": "-Infinity", "timestamp": 1008, "step": 8},
        {"key": "m", "value": 0.25, "timestamp": 1009, "step": 9, "model_id": "m-1"},
        {"key": "m", "value": 0.25, "timestamp": 1010},  # no step: 0
    ]
    answer = _post(api, "runs/log-batch", {"run_id": run_id, "metrics": stock + other})
    assert answer.status_code == 200, answer.text
    history = _history(api, run_id, "m")
    assert history == [
        {"key": "m", "value": 0.5, "timestamp": 1000, "step": 0},
        {"key": "m", "value": 0.25, "timestamp": 1010, "step": 0},
        {"key": "m", "value": 0.5, "timestamp": 1001, "step": 1},
        {"key": "m", "value": 0.5, "timestamp": 1002, "step": 2},
        {"key": "m", "value": 0.5, "timestamp": 1003, "step": 3},
        {"key": "m", "value": 1.0, "timestamp": 1004, "step": 4},
        {"key": "m", "value": 0.5, "timestamp": 1005, "step": 5},
        {"key": "m", "value": "NaN", "timestamp": 1006, "step": 6},
        {"key": "m", "value": "Infinity", "timestamp": 1007, "step": 7},
        {"key": "m", "value": "-Infinity", "timestamp": 1008, "step": 8},
        {"key": "m", "value": 0.25, "timestamp": 1009, "step": 9},
    ]
    run = api.get("/api/2.0/mlflow/runs/get", params={"run_id": run_id}).json()["run"]
    latest = {m["key"]: m for m in run["data"]["metrics"]}
    assert (latest["m"]["step"], latest["m"]["value"]) == (9, 0.25)


def test_a_batch_links_only_the_points_that_name_a_model(api: TestClient, run_id: str) -> None:
    # Batches naming no model or dataset take a shorter insert than those that name one.
    run = api.get("/api/2.0/mlflow/runs/get", params={"run_id": run_id}).json()["run"]
    exp = run["info"]["experiment_id"]
    created = _post(api, "logged-models", {"experiment_id": exp, "name": "m"})
    model_id = created.json()["model"]["info"]["model_id"]
    plain = [{"key": "acc", "value": 0.1 * i, "timestamp": 1000 + i, "step": i} for i in range(3)]
    linked = {"key": "acc", "value": 0.9, "timestamp": 2000, "step": 5, "model_id": model_id}
    linked |= {"dataset_name": "eval", "dataset_digest": "d1"}
    for batch in (plain[:2], [plain[2], linked]):
        answer = _post(api, "runs/log-batch", {"run_id": run_id, "metrics": batch})
        assert answer.status_code == 200, answer.text

    assert [p["step"] for p in _history(api, run_id, "acc")] == [0, 1, 2, 5]
    model = api.get(f"/api/2.0/mlflow/logged-models/{model_id}").json()["model"]
    assert [
        (m["key"], m["value"], m["step"], m["dataset_name"], m["dataset_digest"])
        for m in model["data"]["metrics"]
    ] == [("acc", 0.9, 5, "eval", "d1")]


def test_a_point_without_timestamp_gets_the_server_time(api: TestClient, run_id: str) -> None:
    assert _post(api, "runs/log-metric", {"run_id": run_id, "key": "t", "value": 1.0}).is_success
    (point,) = _history(api, run_id, "t")
    assert point["timestamp"] > 1_600_000_000_000
    assert point["step"] == 0


def test_history_pages_hold_every_point_once_in_order(api: TestClient, run_id: str) -> None:
    for first in range(0, 2500, 1000):
        batch = [
            {"key": "loss", "value": 1 / (1 + s), "timestamp": 5 + s, "step": s}
            for s in range(first, min(first + 1000, 2500))
        ]
        assert _post(api, "runs/log-batch", {"run_id": run_id, "metrics": batch}).is_success
    paged = _history(api, run_id, "loss", page=700)
    assert [p["step"] for p in paged] == list(range(2500))
    assert all(set(p) == {"key", "value", "timestamp", "step"} for p in paged)
    assert paged[10] == {"key": "loss", "value": 1 / 11, "timestamp": 15, "step": 10}
    assert _history(api, run_id, "loss") == paged
    assert _history(api, run_id, "nothing") == []


def test_history_of_a_resumed_run_is_in_step_order(api: TestClient, run_id: str) -> None:
    """A job resumed from its step-3 checkpoint logs steps 3 and 4 again, later: the history is
    the curve by step (the README's one stated difference from a stock server, which sorts by
    timestamp first), each step's points oldest first, on every page size."""
    first = [
        {"key": "loss", "value": 1.0 - s / 10, "timestamp": 100 + s, "step": s} for s in range(5)
    ]
    again = [
        {"key": "loss", "value": 0.5 - s / 10, "timestamp": 200 + s, "step": s} for s in (3, 4)
    ]
    for batch in (first, again):
        assert _post(api, "runs/log-batch", {"run_id": run_id, "metrics": batch}).is_success
    expected = [(0, 100), (1, 101), (2, 102), (3, 103), (3, 203), (4, 104), (4, 204)]
    for page in (None, 1, 3):
        history = _history(api, run_id, "loss", page=page)
        assert [(p["step"], p["timestamp"]) for p in history] == expected


def test_history_pages_split_points_that_share_step_and_time(api: TestClient, run_id: str) -> None:
    """Keyset pages: points equal in step and timestamp, NaN (stored as 0.0) beside a real
    0.0, and the infinities, each come back exactly once whatever the page size."""
    values = [0.0, "NaN", "-Infinity", "Infinity", -1.5, 2.5]
    points = [
        {"key": "k", "value": v, "timestamp": 9, "step": step} for step in (0, 1) for v in values
    ]
    assert _post(api, "runs/log-batch", {"run_id": run_id, "metrics": points}).is_success
    whole = _history(api, run_id, "k")
    assert len(whole) == len(points)
    for page in (1, 2, 5):
        assert _history(api, run_id, "k", page=page) == whole
    spelled = sorted((p["step"], str(p["value"])) for p in whole)
    assert spelled == sorted((p["step"], str(p["value"])) for p in points)


@pytest.mark.parametrize(
    "token",
    [
        "not-a-token",
        "A" * 34,  # right length, but not a point this server wrote: still only a start key
        "eyJvZmZzZXQiOiAxMH0",  # an offset token of the searches
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAPh_AA",  # a NaN value
        "%%%%",
        "A" * 5000,
    ],
)
def test_history_page_tokens_that_this_server_did_not_make(
    api: TestClient, run_id: str, token: str
) -> None:
    params = {"run_id": run_id, "metric_key": "loss", "page_token": token}
    answer = api.get("/api/2.0/mlflow/metrics/get-history", params=params)
    if token == "A" * 34:  # decodes to a point: the page after it, here empty
        assert answer.status_code == 200
        assert answer.json() == {"metrics": []}
    else:
        assert answer.status_code == 400, answer.text
        assert answer.json()["error_code"] == "INVALID_PARAMETER_VALUE"
        assert "page_token" in answer.json()["message"]


def test_history_of_a_key_that_json_must_escape(api: TestClient, run_id: str) -> None:
    key = 'λ "quoted" \\ back/slash'
    points = [
        {"key": key, "value": v, "timestamp": 7, "step": i}
        for i, v in enumerate([1e-300, 1e300, -0.0, 3.0])
    ]
    assert _post(api, "runs/log-batch", {"run_id": run_id, "metrics": points}).is_success
    assert _history(api, run_id, key) == points


def test_int64_extremes_are_kept_and_bigger_integers_refused(api: TestClient, run_id: str) -> None:
    """Found while reworking the hot path: a step or time beyond int64 reached the
    database and answered 500, which the stock client retries."""
    edge = {"key": "e", "value": 2.0, "timestamp": INT64_MAX, "step": INT64_MIN}
    assert _post(api, "runs/log-batch", {"run_id": run_id, "metrics": [edge]}).is_success
    assert _history(api, run_id, "e") == [edge]
    for path, body in (
        ("runs/log-metric", {"key": "e", "value": 1.0, "timestamp": 1, "step": 2**63}),
        ("runs/log-metric", {"key": "e", "value": 1.0, "timestamp": -(2**63) - 1}),
        # Past 64 bits a JSON integer is read as a float, and this one rounds to -2**63.
        ("runs/log-metric", {"key": "e", "value": 1.0, "timestamp": 1, "step": -(2**63) - 1}),
        ("runs/log-batch", {"metrics": [{"key": "e", "value": 1.0, "step": 2**64}]}),
        ("runs/log-batch", {"metrics": [{"key": "e", "value": 1.0, "step": str(2**64)}]}),
        ("runs/update", {"end_time": 2**70}),
        ("runs/outputs", {"models": [{"model_id": "m-1", "step": 2**70}]}),
    ):
        answer = _post(api, path, {"run_id": run_id, **body})
        assert answer.status_code == 400, (path, answer.text)
        assert answer.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    exp = _post(api, "experiments/create", {"name": "int64"}).json()["experiment_id"]
    answer = _post(api, "runs/create", {"experiment_id": exp, "start_time": 2**70})
    assert answer.status_code == 400, answer.text
    assert _history(api, run_id, "e") == [edge]


def test_bodies_only_pythons_json_writes_are_read(api: TestClient, run_id: str) -> None:
    # Bare NaN and Infinity (json.dumps writes them), and a body in UTF-16 with its BOM.
    values = [1e308, math.nan, -math.inf]
    points = [{"key": "p", "value": v, "timestamp": 1, "step": i} for i, v in enumerate(values)]
    body = json.dumps({"run_id": run_id, "metrics": points})
    assert "NaN" in body
    for encoded in (body.encode(), body.replace('"p"', '"q"').encode("utf-16")):
        answer = api.post(
            "/api/2.0/mlflow/runs/log-batch",
            content=encoded,
            headers={"Content-Type": "application/json"},
        )
        assert answer.status_code == 200, answer.text
    expected = [1e308, "NaN", "-Infinity"]
    assert [p["value"] for p in _history(api, run_id, "p")] == expected
    assert [p["value"] for p in _history(api, run_id, "q")] == expected


@pytest.mark.parametrize(
    "metric",
    [
        {"value": 1.0, "timestamp": 1, "step": 1},  # no key
        {"key": "", "value": 1.0, "timestamp": 1, "step": 1},
        {"key": "k" * 251, "value": 1.0, "timestamp": 1, "step": 1},
        {"key": "k", "timestamp": 1, "step": 1},  # no value
        {"key": "k", "value": "high", "timestamp": 1, "step": 1},
        {"key": "k", "value": True, "timestamp": 1, "step": 1},
        {"key": "k", "value": 1.0, "timestamp": 1, "step": "--1"},
        {"key": "k", "value": 1.0, "timestamp": 1, "step": 1.5},
        {"key": "../k", "value": 1.0, "timestamp": 1, "step": 1},
        {"key": 5, "value": 1.0, "timestamp": 1, "step": 1},
    ],
)
def test_malformed_metrics_are_refused_whole(
    api: TestClient, run_id: str, metric: dict[str, Any]
) -> None:
    good = {"key": "k", "value": 1.0, "timestamp": 1, "step": 0}
    answer = _post(api, "runs/log-batch", {"run_id": run_id, "metrics": [good, metric]})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    assert _history(api, run_id, "k") == []  # nothing of the batch was stored


def test_logging_to_a_missing_or_deleted_run(api: TestClient, run_id: str) -> None:
    point = {"key": "k", "value": 1.0, "timestamp": 1, "step": 0}
    missing = _post(api, "runs/log-metric", {"run_id": "0" * 32, **point})
    assert (missing.status_code, missing.json()["error_code"]) == (404, "RESOURCE_DOES_NOT_EXIST")
    assert _post(api, "runs/delete", {"run_id": run_id}).is_success
    deleted = _post(api, "runs/log-batch", {"run_id": run_id, "metrics": [point]})
    assert (deleted.status_code, deleted.json()["error_code"]) == (400, "INVALID_PARAMETER_VALUE")


def test_a_rename_through_the_run_name_tag_is_audited_like_runs_update(
    api: TestClient, run_id: str, platform: Platform
) -> None:
    """Renaming a run is a change of the run, however the client spells it: runs/update,
    set-tag of mlflow.runName or log-batch carrying it, done or refused; the other tags are
    not audited."""
    tag = {"run_id": run_id, "key": "mlflow.runName"}
    calls = [
        ("runs/update", {"run_id": run_id, "run_name": "by-update"}),
        ("runs/set-tag", {**tag, "value": "by-tag"}),
        ("runs/log-batch", {"run_id": run_id, "tags": [{**tag, "value": "by-batch"}]}),
        ("runs/set-tag", {"run_id": run_id, "key": "team", "value": "x"}),
        ("runs/set-tag", {**tag, "value": ""}),  # an empty name changes nothing
    ]
    for path, body in calls:
        assert _post(api, path, body).status_code == 200, path
    assert _post(api, "runs/delete", {"run_id": run_id}).status_code == 200
    refused = _post(api, "runs/set-tag", {**tag, "value": "after-delete"})
    assert refused.status_code == 400  # a deleted run takes no tags
    renames = platform.audit.entries(action="run.update")
    assert [(e.target, e.detail.get("name"), e.outcome) for e in reversed(renames)] == [
        *[(f"run:{run_id}", name, "ok") for name in ("by-update", "by-tag", "by-batch")],
        (f"run:{run_id}", "after-delete", "invalid_parameter_value"),
    ]
    assert platform.audit.verify().ok
