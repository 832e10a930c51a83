"""Eight processes logging to one experiment at once: nothing lost, nothing failed."""

from __future__ import annotations

import multiprocessing
import os
import time
import uuid
from typing import Any

import pytest
from mlflow import MlflowClient

from tests.live import LiveServer

pytestmark = pytest.mark.slow

WORKERS = 8
BATCHES = 20
PER_BATCH = 50


def _logger(
    url: str, token: str, experiment_name: str, worker: int, start: Any, results: Any
) -> None:
    os.environ.update(
        {
            "MLFLOW_TRACKING_URI": url,
            "MLFLOW_TRACKING_TOKEN": token,
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
        }
    )
    from mlflow.entities import Metric

    client = MlflowClient(url)
    start.wait(60)
    try:
        # Everybody asks for the same experiment name at once: exactly one must exist.
        found = client.get_experiment_by_name(experiment_name)
        if found is None:
            try:
                exp_id = client.create_experiment(experiment_name)
            except Exception:  # noqa: BLE001 - lost the race: RESOURCE_ALREADY_EXISTS
                exp_id = client.get_experiment_by_name(experiment_name).experiment_id
        else:
            exp_id = found.experiment_id
        run = client.create_run(exp_id, run_name=f"w{worker}")
        ts = int(time.time() * 1000)
        for b in range(BATCHES):
            metrics = [
                Metric("loss", float(b * PER_BATCH + i), ts, b * PER_BATCH + i)
                for i in range(PER_BATCH)
            ]
            client.log_batch(run.info.run_id, metrics=metrics)
            client.log_metric(run.info.run_id, "single", float(b), step=b)
        client.set_terminated(run.info.run_id)
        results.put((worker, exp_id, run.info.run_id, None))
    except Exception as exc:  # noqa: BLE001 - reported to the parent and asserted there
        results.put((worker, None, None, f"{type(exc).__name__}: {exc}"))


def test_eight_processes_log_to_one_experiment(mlflow_server: LiveServer) -> None:
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    name = f"concurrent-{uuid.uuid4().hex[:8]}"
    procs = [
        ctx.Process(
            target=_logger, args=(mlflow_server.url, mlflow_server.token, name, w, start, results)
        )
        for w in range(WORKERS)
    ]
    for p in procs:
        p.start()
    start.set()
    outcomes = [results.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    errors = [o[3] for o in outcomes if o[3]]
    assert errors == []
    assert len({o[1] for o in outcomes}) == 1  # one experiment for the shared name
    client = MlflowClient(mlflow_server.url)
    os.environ["MLFLOW_TRACKING_TOKEN"] = mlflow_server.token
    try:
        for _, _, run_id, _ in outcomes:
            loss = client.get_metric_history(run_id, "loss")
            assert [m.step for m in loss] == list(range(BATCHES * PER_BATCH))
            assert len(client.get_metric_history(run_id, "single")) == BATCHES
            run = client.get_run(run_id)
            assert run.info.status == "FINISHED"
            assert run.data.metrics["loss"] == float(BATCHES * PER_BATCH - 1)
    finally:
        del os.environ["MLFLOW_TRACKING_TOKEN"]
    log = mlflow_server.log.read_text()
    assert " 500 " not in log
    assert "Traceback" not in log
