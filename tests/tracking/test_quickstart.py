"""The quickstart `make run` shows, run against a live server."""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path
from typing import Any

import mlflow
import pytest
from mlflow import MlflowClient
from rich.console import Console

from shamal import data as shamal_data
from shamal.cli._quickstart import run_quickstart, stop_model_servers
from shamal.client import ShamalClient
from tests.live import LiveServer

pytestmark = pytest.mark.slow


def wait_for_job(api: ShamalClient, job_id: str, deadline_s: float = 180.0) -> dict[str, Any]:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        job = api.get_job(job_id)
        if job["state"] not in ("queued", "admitted", "running"):
            return job
        time.sleep(0.2)  # polling with a deadline, not synchronising on a sleep
    raise AssertionError("the quickstart job did not finish in time")


def _assert_trained_from_the_dataset(api: ShamalClient, run: Any, text: str) -> None:
    """The model was trained from a validated dataset version, and the run says which."""
    wine = api.dataset_version("wine/1")  # version 2 came later, for the pipeline
    assert (wine["status"], wine["row_count"], wine["uri"]) == ("valid", 178, "data:/wine/1")
    assert wine["validation"]["ok"]
    assert len(wine["validation"]["results"]) == 6
    assert f"ingested the training data as {wine['uri']}" in text
    # Pseudonymized before storage: the tasters are keyed tokens, never their addresses.
    assert [(t["column"], t["action"]) for t in wine["transformations"]] == [("taster", "hmac")]
    assert "pseudonymized: taster (hmac)" in text
    table = shamal_data.load(wine["uri"], client=api)
    tokens = set(table["taster"].to_pylist())
    assert len(tokens) == 7
    assert not any("@" in token for token in tokens)
    # The model trained on the point-in-time join of the labels with the feature view over
    # the wine data: the training set's version names both, and the run read it.
    training = api.dataset_version("wine-training")
    assert training["row_count"] == 178
    (used,) = training["source"]["feature_views"]
    assert (used["view"], used["dataset"]) == (
        "features:/feature_view/wine_measurements/1",
        wine["uri"],
    )
    assert f"saved as {training['uri']}" in text
    assert "defined feature view wine_measurements" in text
    assert run.data.params["dataset"] == training["uri"]
    (read,) = run.inputs.dataset_inputs
    assert json.loads(read.dataset.source) == {"uri": training["uri"]}
    assert read.dataset.digest == training["digest"]


def _assert_the_pipeline_retrained(text: str) -> None:
    """A new version of the wine data started the retraining pipeline by itself, and each of
    its steps ran as a job (the gate decides whether @champion moves)."""
    retrained = re.search(
        r"ingested data:/wine/2: it started run (\w+), succeeded \(validate succeeded, "
        r"train succeeded, evaluate succeeded, register succeeded, gate succeeded, "
        r"canary succeeded\)",
        text,
    )
    assert retrained is not None, text
    # The new version went on the served deployment as its canary.
    assert re.search(r"models:/quickstart-wine/\d+ is now wine's canary at 10% of traffic", text), (
        text
    )


def _assert_the_job_trained(api: ShamalClient, text: str) -> None:
    (job,) = [j for j in api.list_jobs() if j["name"] == "quickstart-pytorch"]
    assert (job["name"], job["team"]) == ("quickstart-pytorch", "quickstart")
    assert f"submitted job {job['id'][:12]}" in text
    done = wait_for_job(api, job["id"])
    assert done["state"] == "succeeded", api.job_log(job["id"])[0].decode()[-2000:]
    log = api.job_log(job["id"])[0].decode()
    printed = [line for line in log.splitlines() if not line.startswith("[shamal]")]
    assert printed[-1].startswith("weights sha256 ")  # the job's own last line


def test_quickstart_tracks_registers_and_is_repeatable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHAMAL_HOME", str(tmp_path / "home"))
    with LiveServer(tmp_path / "home") as server, ShamalClient(server.url, server.token) as api:
        out = io.StringIO()
        try:
            run_quickstart(api, Console(file=out, width=2000))
        finally:
            stop_model_servers()
        text = out.getvalue()
        assert "registered quickstart-wine version 1 as @champion" in text
        # The champion is served over OIP and answered both tritonclient and curl.
        # ... tritonclient sent the sample's id only: its features were read online.
        triton = re.search(
            r"tritonclient: wine sample 0 -> class (\d) \(true class (\d)\), sent its id only",
            text,
        )
        assert triton is not None, text
        assert triton.group(1) == triton.group(2) == "0"
        assert "materialized wine_measurements into the online store (178 samples)" in text
        curl = re.search(r"-> (\{.*\})", text)
        assert curl is not None, text
        answer = json.loads(curl.group(1))
        assert answer["model_name"] == "wine"
        assert answer["outputs"][0]["name"] == "label"
        assert answer["outputs"][0]["data"] == [0]
        assert "audit chain verified" in text
        _assert_the_job_trained(api, text)
        _assert_the_pipeline_retrained(text)
        monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", server.token)
        client = MlflowClient(server.url)
        champion = client.get_model_version("quickstart-wine", "1")
        run = client.get_run(champion.run_id)
        assert run.data.params["model"] == "SGDClassifier"
        _assert_trained_from_the_dataset(api, run, text)
        curve = client.get_metric_history(run.info.run_id, "test_accuracy")
        assert [m.step for m in curve] == list(range(20))
        assert run.data.metrics["test_accuracy"] > 0.8
        # The server sends model_id; this client's alias lookup drops it, `source` keeps it.
        assert champion.source.startswith("models:/m-")
        logged = client.get_logged_model(champion.source.removeprefix("models:/"))
        assert logged.status == "READY"
        assert logged.source_run_id == run.info.run_id
        # The model is an artifact: MLflow 3 keeps it under the logged model's location.
        listed = mlflow.artifacts.list_artifacts(artifact_uri=logged.artifact_location)
        assert {"MLmodel", "requirements.txt"} <= {f.path.rsplit("/", 1)[-1] for f in listed}
        # The pipeline registered version 2 and pointed @candidate at it.
        candidate = client.get_model_version_by_alias("quickstart-wine", "candidate")
        assert int(candidate.version) == 2
        # A second `make run` finds what the first made and carries on.
        second = io.StringIO()
        try:
            run_quickstart(api, Console(file=second, width=2000))
        finally:
            stop_model_servers()
        assert "registered quickstart-wine version 3 as @champion" in second.getvalue()
        assert "ingested data:/wine/4: it started run" in second.getvalue()
        # Each ingestion writes a new version of the same rows (overwrite), not twice the rows.
        latest = api.dataset_version("wine")
        assert (latest["uri"], latest["row_count"]) == ("data:/wine/4", 178)
