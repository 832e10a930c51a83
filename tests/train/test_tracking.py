"""Tracker against the real tracking API (in-process app, real database)."""

from __future__ import annotations

import time
from typing import Any, cast

import httpx
import pytest
from starlette.testclient import TestClient

from shamal.train import Tracker


def _run(api: TestClient, run_id: str) -> dict[str, Any]:
    response = api.get("/api/2.0/mlflow/runs/get", params={"run_id": run_id})
    assert response.status_code == 200, response.text
    run: dict[str, Any] = response.json()["run"]
    return run


def _history(api: TestClient, run_id: str, key: str) -> list[tuple[int, float]]:
    response = api.get(
        "/api/2.0/mlflow/metrics/get-history", params={"run_id": run_id, "metric_key": key}
    )
    assert response.status_code == 200, response.text
    return sorted((int(m["step"]), float(m["value"])) for m in response.json().get("metrics", []))


# The tracking store (another package, being edited) calls SQLAlchemy 2.1's deprecated
# Result.tuples() when logging params; under -W error that is a 500. Not this package's.
@pytest.mark.filterwarnings("ignore:The Result.tuples:DeprecationWarning")
def test_tracker_creates_the_run_logs_params_and_metrics_and_ends_it(api: TestClient) -> None:
    tracker = Tracker(
        "train-tests",
        params={"lr": 0.1, "layers": 2},
        http=cast(httpx.Client, api),
        flush_every_s=60,
    )
    for step in range(7):
        tracker.log_metric("loss", 1.0 / (step + 1), step)
    assert _run(api, tracker.run_id)["info"]["status"] == "RUNNING"
    tracker.close()
    run = _run(api, tracker.run_id)
    assert run["info"]["status"] == "FINISHED"
    params = {p["key"]: p["value"] for p in run["data"]["params"]}
    assert params == {"lr": "0.1", "layers": "2"}
    assert _history(api, tracker.run_id, "loss") == [(s, 1.0 / (s + 1)) for s in range(7)]
    again = Tracker(
        "train-tests", http=cast(httpx.Client, api), run_id=tracker.run_id
    )  # a resumed job
    assert again.experiment_id == tracker.experiment_id
    again.close(status="KILLED")
    assert _run(api, tracker.run_id)["info"]["status"] == "KILLED"


def test_a_full_batch_is_sent_without_waiting_for_the_timer(api: TestClient) -> None:
    http = cast(httpx.Client, api)
    tracker = Tracker("train-tests", http=http, flush_every_s=600, max_batch=3)
    try:
        tracker.log_metrics({"a": 1.0, "b": 2.0, "c": 3.0}, step=1)
        end = time.monotonic() + 30
        while not _history(api, tracker.run_id, "c"):
            assert time.monotonic() < end, "the background thread did not send the batch"
            time.sleep(0.05)  # polling with a deadline
        assert _history(api, tracker.run_id, "a") == [(1, 1.0)]
    finally:
        tracker.close()
