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
    training = api.dataset_version("wine-training/1")  # 2: the retraining's
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
    its steps ran as a job (no deployment named: its canary step had nothing to do)."""
    retrained = re.search(
        r"ingested data:/wine/2: it started run (\w+), succeeded \(ingest succeeded, "
        r"validate succeeded, features succeeded, train succeeded, evaluate succeeded, "
        r"register succeeded, gate succeeded, canary succeeded\)",
        text,
    )
    assert retrained is not None, text


#: Who acts without a person: the monitor, the pipeline engine, the scheduler, the controller.
PLATFORM_ACTORS = ("monitor", "pipeline", "scheduler", "rollout-controller")


def _assert_the_loop_closed(api: ShamalClient, text: str) -> None:
    """Calm traffic, then shifted traffic: the monitor found drift and started the retraining
    pipeline, which took in the lab's export, validated it, built the training set from the
    feature store, trained, evaluated, registered v3 with its reference and put it on as a
    canary; the rollout controller promoted it on live traffic, and the monitor went on
    against v3's reference. Every step is in lineage and the audit log, and from the lab's
    drop to the promotion nothing was done by a person."""
    assert re.search(r"callers ask wine by sample id: \d+ rows judged, no drift", text), text
    found = re.search(
        r"drift detected: \d+ rows judged, drift \((\d+) of (\d+) columns.*; it started "
        r"retraining run (\w+)",
        text,
    )
    assert found is not None, text
    assert int(found[1]) > int(found[2]) / 2  # the share that makes the data drifted
    assert (
        f"retraining run {found[3]} succeeded: ingest succeeded, validate succeeded, features "
        "succeeded, train succeeded, evaluate succeeded, register succeeded, gate succeeded, "
        "canary succeeded"
    ) in text
    assert "models:/quickstart-wine/3 went on wine as its canary at 25% of traffic" in text
    assert "the rollout controller promoted quickstart-wine/3 on live traffic" in text
    assert re.search(
        r"the monitor now judges v3's answers against its own reference: \d+ rows judged, "
        r"no drift",
        text,
    ), text
    assert re.search(r"callers sent \d+ requests \(0 failed\)", text), text
    deployment = api.get_deployment("wine")
    assert deployment["state"]["phase"] == "promoted"
    assert [(r["role"], r["version"]) for r in deployment["routes"]] == [("primary", 3)]
    reference = api.monitor("wine-drift")["reference"]
    assert (reference["model"], reference["version"]) == ("quickstart-wine", 3)
    (run,) = [r for r in api.pipeline_runs("retrain") if r["id"].startswith(found[3])]
    run = api.pipeline_run(run["id"])
    assert "drift found by monitor wine-drift" in run["trigger"]
    assert run["params"]["landing"] == "quickstart/landing/wine-harvest.csv"
    steps = {s["key"]: s for s in run["steps"]}
    # The harvest became wine/3 (validated, pseudonymized), and the training set was joined
    # from it through the feature view.
    assert steps["ingest"]["output"]["data"] == "wine/3"
    harvest = api.dataset_version("wine/3")
    assert (harvest["row_count"], harvest["status"]) == (356, "valid")
    assert [(t["column"], t["action"]) for t in harvest["transformations"]] == [("taster", "hmac")]
    training = api.dataset_version(steps["features"]["output"]["training"])
    (used,) = training["source"]["feature_views"]
    assert used["dataset"] == "data:/wine/3"
    graph = api.lineage("deployments:/wine", direction="up", depth=10)
    reached = {n["id"] for n in graph["nodes"]}
    trained = f"runs:/{steps['train']['output']['run_id']}"
    assert {"models:/quickstart-wine/3", trained, training["uri"], "data:/wine/3"} <= reached
    _assert_nobody_acted(api, {s["key"]: (s["job_id"] or "")[:12] for s in run["steps"]})


def _assert_nobody_acted(api: ShamalClient, jobs: dict[str, str]) -> None:
    """From the lab's drop of its export on, every audited change was made by the platform
    itself or by a job (the entry names it), and the loop's own steps are all there."""
    entries = api.audit_entries(limit=1000)
    drop = next(e for e in entries if e["target"].endswith("artifact:landing/wine-harvest.csv"))
    after = [e for e in entries if e["seq"] > drop["seq"]]
    by_people = [
        (e["actor"], e["action"], e["target"])
        for e in after
        if e["actor"].split(":")[0] not in PLATFORM_ACTORS and "job" not in e["detail"]
    ]
    assert by_people == []
    done = {(e["actor"], e["action"], e["detail"].get("job")) for e in after}
    assert {
        ("monitor:wine-drift", "pipeline.run", None),
        ("admin", "dataset.ingest", jobs["ingest"]),
        ("admin", "features.historical", jobs["features"]),
        ("admin", "model_version.create", jobs["register"]),
        ("admin", "monitor.reference.build", jobs["register"]),
        ("admin", "deployment.canary", jobs["canary"]),
        ("rollout-controller", "deployment.rollout.promote", None),
        ("monitor:wine-drift", "monitor.reference", None),
    } <= done


def _assert_the_job_trained(api: ShamalClient, text: str) -> None:
    (job,) = [j for j in api.list_jobs() if j["name"] == "quickstart-pytorch"]
    assert (job["name"], job["team"]) == ("quickstart-pytorch", "quickstart")
    assert f"submitted job {job['id'][:12]}" in text
    done = wait_for_job(api, job["id"])
    assert done["state"] == "succeeded", api.job_log(job["id"])[0].decode()[-2000:]
    log = api.job_log(job["id"])[0].decode()
    printed = [line for line in log.splitlines() if not line.startswith("[shamal]")]
    assert printed[-1].startswith("weights sha256 ")  # the job's own last line


def _quickstart(api: ShamalClient) -> str:
    """What `make run` prints, its model servers stopped after."""
    out = io.StringIO()
    try:
        run_quickstart(api, Console(file=out, width=2000))
    finally:
        stop_model_servers()
    return out.getvalue()


# Two whole quickstarts, each with its closed loop (about 2.5 minutes each on a quiet machine):
# more than the suite's 300 s per test.
@pytest.mark.timeout(1200)
def test_quickstart_tracks_registers_and_is_repeatable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHAMAL_HOME", str(tmp_path / "home"))
    with LiveServer(tmp_path / "home") as server, ShamalClient(server.url, server.token) as api:
        text = _quickstart(api)
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
        _assert_the_loop_closed(api, text)
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
        # The drift's retraining registered version 3 and pointed @candidate at it.
        candidate = client.get_model_version_by_alias("quickstart-wine", "candidate")
        assert int(candidate.version) == 3
        _assert_a_second_run_carries_on(api)


def _assert_a_second_run_carries_on(api: ShamalClient) -> None:
    """A second `make run` finds what the first made and carries on."""
    again = _quickstart(api)
    assert re.search(r"registered quickstart-wine version \d+ as @champion", again), again
    # Two new versions of the data (the quickstart's, then one more), each starting a run.
    assert "ingested data:/wine/5: it started run" in again
    # The loop closes again: the newest version, retrained on drift, takes over.
    promoted = re.search(r"the rollout controller promoted quickstart-wine/(\d+) on live", again)
    assert promoted is not None, again
    newest = MlflowClient(api.url).search_model_versions("name = 'quickstart-wine'")
    assert int(promoted[1]) == max(int(v.version) for v in newest) > 3
    # Each ingestion overwrites: the lab's data again, then the harvest again, never both.
    assert api.dataset_version("wine/5")["row_count"] == 178
    latest = api.dataset_version("wine")
    assert (latest["uri"], latest["row_count"]) == ("data:/wine/6", 356)
