"""The quickstart `make run` shows, run against a live server."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import mlflow
import pytest
from mlflow import MlflowClient
from rich.console import Console

from shamal.cli._quickstart import run_quickstart
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


def test_quickstart_tracks_registers_and_is_repeatable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with LiveServer(tmp_path / "home") as server, ShamalClient(server.url, server.token) as api:
        out = io.StringIO()
        run_quickstart(api, Console(file=out, width=200))
        text = out.getvalue()
        assert "registered quickstart-wine version 1 as @champion" in text
        assert "audit chain verified" in text
        (job,) = api.list_jobs()
        assert (job["name"], job["team"]) == ("quickstart-pytorch", "quickstart")
        assert f"submitted job {job['id'][:12]}" in text
        done = wait_for_job(api, job["id"])
        assert done["state"] == "succeeded", api.job_log(job["id"])[0].decode()[-2000:]
        log = api.job_log(job["id"])[0].decode()
        printed = [line for line in log.splitlines() if not line.startswith("[shamal]")]
        assert printed[-1].startswith("weights sha256 ")  # the job's own last line
        monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", server.token)
        client = MlflowClient(server.url)
        champion = client.get_model_version_by_alias("quickstart-wine", "champion")
        run = client.get_run(champion.run_id)
        assert run.data.params["model"] == "SGDClassifier"
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
        # A second `make run` finds what the first made and carries on.
        run_quickstart(api, Console(file=io.StringIO(), width=200))
        again = client.get_model_version_by_alias("quickstart-wine", "champion")
        assert int(again.version) == 2
