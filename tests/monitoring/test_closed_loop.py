"""The closed loop, unattended, end to end (issue 23, point 4).

A live server with its real scheduler, rollout controller and monitor loop; a real `shamal
serve --deployment` process serving the champion, which reads its features online. The test
sets the world up as a team would (data, features, a tracked and registered champion with
its reference, the deployment with its SLO and rollout plan, the retraining pipeline, a
monitor that retrains on drift), then only sends traffic: calm, then shifted. Everything
after that is the platform's doing: the monitor finds drift and starts the pipeline; the
pipeline ingests the lab's fresh export, validates it, builds the training set from the
feature store, trains, evaluates, registers v2 with its reference and puts it on the
deployment as a canary; the rollout controller promotes it on the traffic that keeps coming.
The test polls with deadlines, then checks the lineage from the deployment down to the new
data and that every automated change is in the audit log under the platform's name (or a
job's), none under a person's.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sklearn.datasets import load_wine

from shamal.cli._quickstart import (
    define_features,
    ingest_training_data,
    serve_the_champion,
    stop_model_servers,
    track_a_model,
)
from shamal.cli._quickstart_loop import LANDING, RETRAIN, harvest
from shamal.cli._quickstart_wine import MODEL, QUICKSTART_TEAM, SERVED_AS, Served, wine_csv
from shamal.client import ShamalClient
from tests.live import LiveServer
from tests.polling import wait_for

pytestmark = pytest.mark.slow

MONITOR = "wine-loop"
#: Every step of the retraining pipeline, in order; each ran as a job.
STEPS = ["ingest", "validate", "features", "train", "evaluate", "register", "gate", "canary"]
#: Who acts without a person: the monitor, the pipeline engine, the scheduler, the controller.
PLATFORM_ACTORS = ("monitor", "pipeline", "scheduler", "rollout-controller")


class Callers:
    """The deployment's callers, in a thread: one request after another, each for one wine
    sample by its id (the model server reads its measurements online), until :meth:`shift`
    hands them measurements to send as they are."""

    def __init__(self, served: Served) -> None:
        self._url = f"http://127.0.0.1:{served.http_port}/v2/models/{SERVED_AS}/infer"
        self._headers = {"Authorization": f"Bearer {served.caller}"}
        self._order = random.Random(7).sample(range(178), 178)
        self._rows: list[list[float]] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="callers", daemon=True)
        self.sent = 0
        self.failed: list[int] = []

    def __enter__(self) -> Callers:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def shift(self, rows: list[list[float]]) -> None:
        self._rows = rows

    def _body(self, i: int) -> dict[str, Any]:
        pick = self._order[i % len(self._order)]
        rows = self._rows
        if rows is None:
            tensor = {"name": "sample_id", "shape": [1], "datatype": "INT64", "data": [pick]}
        else:
            row = rows[pick % len(rows)]
            tensor = {"name": "input", "shape": [1, len(row)], "datatype": "FP32", "data": row}
        return {"id": f"c{i}", "inputs": [tensor]}

    def _run(self) -> None:
        with httpx.Client(headers=self._headers, timeout=30) as http:
            # The wait paces the callers (about 20 a second); it synchronises nothing.
            while not self._stop.wait(0.05):
                answer = http.post(self._url, json=self._body(self.sent))
                if answer.status_code != 200:
                    self.failed.append(answer.status_code)
                self.sent += 1


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ShamalClient, Served]]:
    """A live server where the team's champion ``quickstart-wine/1`` (trained on the wine
    data through the feature store, with its reference profile) is served as ``wine`` by a
    `shamal serve` process: every request sampled, a rollout plan of short healthy steps and
    an error and latency SLO; the retraining pipeline registered; a monitor every 10 s that
    starts it on drift, with the lab's landing export as the fresh data."""
    home = tmp_path / "home"
    monkeypatch.setenv("SHAMAL_HOME", str(home))
    with LiveServer(home) as server, ShamalClient(server.url, server.token) as api:
        monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", server.token)
        api.create_team(QUICKSTART_TEAM, "the closed loop's")
        ingest_training_data(api, tmp_path)
        define_features(api)
        track_a_model(server.url, server.token)
        try:
            _, served = serve_the_champion(api)
            _retraining(api)
            yield api, served
        finally:
            stop_model_servers()


def _retraining(api: ShamalClient) -> None:
    from shamal.pipelines import load_pipeline

    spec, root = load_pipeline(f"{RETRAIN}:retrain")
    body = spec.to_json() | {"team": QUICKSTART_TEAM}
    api.register_pipeline(body, api.upload_snapshot(root, QUICKSTART_TEAM))
    api.create_monitor(
        {
            "deployment": SERVED_AS,
            "name": MONITOR,
            "schedule_s": 10,
            "on_drift": "retrain:retrain",
            "retrain_params": {
                "landing": f"{QUICKSTART_TEAM}/{LANDING}",
                "mode": "overwrite",
                "deployment": SERVED_AS,
                "canary_percent": 25,
            },
        }
    )


def _next_result(
    api: ShamalClient, seen: set[str], wanted: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The first monitor result after ``seen`` that read samples and that ``wanted`` takes."""

    def probe() -> dict[str, Any] | None:
        for result in reversed(api.monitor_results(MONITOR, limit=20)):
            if result["id"] not in seen:
                seen.add(result["id"])
                if result["samples"] and wanted(result):
                    chosen: dict[str, Any] = result
                    return chosen
        return None

    found: dict[str, Any] = wait_for(probe, "a monitor result", 120)
    return found


def _acted(api: ShamalClient, result_id: str) -> dict[str, Any]:
    """The drift policy's action on result ``result_id`` (it follows the drift event)."""

    def probe() -> dict[str, Any] | None:
        for result in api.monitor_results(MONITOR, limit=20):
            if result["id"] == result_id and result["actions"]:
                (action,) = result["actions"]
                return dict(action)
        return None

    found: dict[str, Any] = wait_for(probe, "the drift policy's action", 120)
    return found


# Sixteen jobs, a monitor every 10 s and two rollouts: 200 to 350 s measured on two CPUs
# shared with other work, more than the suite's 300 s per test.
@pytest.mark.timeout(900)
def test_drift_retrains_canaries_and_promotes_with_nobody_at_the_keyboard(
    world: tuple[ShamalClient, Served], tmp_path: Path
) -> None:
    api, served = world
    seen: set[str] = set()
    assert _routes(api.get_deployment(SERVED_AS)) == [("primary", 1)]
    with Callers(served) as callers:
        calm = _next_result(api, seen, lambda r: True)
        assert calm["drifted"] is False, calm["report"]
        path, rows = harvest(tmp_path)
        with path.open("rb") as handle:
            api.upload_artifact(QUICKSTART_TEAM, LANDING, handle)
        callers.shift(rows)
        steps = _retrained(api, seen, version=2)
        promoted = wait_for(lambda: _rolled_out(api), "the end of the rollout", 300)
        assert promoted["state"]["phase"] == "promoted", promoted
        assert _routes(promoted) == [("primary", 2)], promoted
        # The monitor follows the primary: the shifted traffic is v2's normal, by v2's reference.
        settled = _next_result(api, seen, lambda r: _judged_by(r) == 2)
        assert settled["drifted"] is False, settled["report"]
        assert callers.failed == []
        assert _controller_moves(api) == ["step", "promote"]
        _assert_the_lineage(api, steps)
        _assert_nobody_acted(api, steps)
        _a_bad_retraining_is_rolled_back(api, callers, seen, tmp_path)


def _a_bad_retraining_is_rolled_back(
    api: ShamalClient, callers: Callers, seen: set[str], folder: Path
) -> None:
    """Someone edits the retraining to log its model pickled; the old instrument comes back
    (the lab exports the old data again, the callers send it). Drift again, retraining
    again, and v3 goes on as a canary, but the serve process refuses to load a pickle: the
    rollout controller rolls it back, and v2 serves on. Drift found after that waits (the
    monitor backs off) instead of retraining into the same failure again."""
    bad = folder / "bad"
    bad.mkdir()
    source = RETRAIN.read_text()
    assert source.count('serialization_format="skops"') == 1
    (bad / "pipeline.py").write_text(
        source.replace('serialization_format="skops"', 'serialization_format="cloudpickle"')
    )
    from shamal.pipelines import load_pipeline

    spec, root = load_pipeline(f"{bad / 'pipeline.py'}:retrain")
    body = spec.to_json() | {"team": QUICKSTART_TEAM}
    api.register_pipeline(body, api.upload_snapshot(root, QUICKSTART_TEAM))
    with wine_csv(folder).open("rb") as handle:
        api.upload_artifact(QUICKSTART_TEAM, LANDING, handle)
    callers.shift(load_wine().data.tolist())
    _retrained(api, seen, version=3)
    ended = wait_for(lambda: _rolled_out(api), "the end of the rollout", 300)
    assert ended["state"]["phase"] == "rolled_back", ended
    assert _routes(ended) == [("primary", 2)], ended
    events = api.deployment_events(SERVED_AS, limit=50)
    (rollback,) = [e for e in events if e["kind"] == "rollback"]
    assert rollback["actor"] == "rollout-controller"
    assert rollback["reason"].startswith("canary v3 failed to load"), rollback
    # The drift goes on, but retraining again would make the same again: it backs off.
    rolled_back_at = datetime.fromisoformat(rollback["at"])
    later = _next_result(
        api, seen, lambda r: r["drifted"] and datetime.fromisoformat(r["at"]) > rolled_back_at
    )
    held = _acted(api, later["id"])
    assert held["status"] == "held", held
    assert "did not take (its canary was rolled back); retraining waits" in held["reason"]


def _retrained(api: ShamalClient, seen: set[str], *, version: int) -> dict[str, Any]:
    """The drift the monitor finds next, the retraining run its policy starts, each of the
    run's steps done (as jobs), and ``version`` on the deployment as its canary."""
    drifted = _next_result(api, seen, lambda r: bool(r["drifted"]))
    action = _acted(api, drifted["id"])
    assert (action["action"], action["status"]) == ("retrain", "started"), action
    run = _finished(api, action["run"])
    assert [(s["key"], s["state"]) for s in run["steps"]] == [(key, "succeeded") for key in STEPS]
    steps = {s["key"]: s for s in run["steps"]}
    assert steps["register"]["output"] == {"version": version}
    assert steps["canary"]["output"]["canary"] == f"models:/{MODEL}/{version}"
    return steps


def _judged_by(result: dict[str, Any]) -> int | None:
    reference: dict[str, Any] = result["report"].get("reference") or {}
    return reference.get("version")


def _finished(api: ShamalClient, run_id: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        run: dict[str, Any] = api.pipeline_run(run_id)
        return None if run["state"] == "running" else run

    run: dict[str, Any] = wait_for(probe, f"retraining run {run_id}", 600)
    assert run["state"] == "succeeded", run
    assert f"drift found by monitor {MONITOR}" in run["trigger"]
    return run


def _routes(deployment: dict[str, Any]) -> list[tuple[str, int]]:
    return [(r["role"], r["version"]) for r in deployment["routes"]]


def _rolled_out(api: ShamalClient) -> dict[str, Any] | None:
    deployment: dict[str, Any] = api.get_deployment(SERVED_AS)
    return None if deployment["state"]["phase"] == "progressing" else deployment


def _controller_moves(api: ShamalClient) -> list[str]:
    """What the rollout controller did to the deployment, oldest first."""
    events = api.deployment_events(SERVED_AS, limit=50)
    return [e["kind"] for e in events if e["actor"] == "rollout-controller"]


def _assert_the_lineage(api: ShamalClient, steps: dict[str, Any]) -> None:
    """From the deployment up: v2, the tracking run that trained it, the training set joined
    through the feature view from the fresh data version the ingest step wrote."""
    fresh = steps["ingest"]["output"]["data"]
    assert fresh == "wine/2"
    training = api.dataset_version(steps["features"]["output"]["training"])
    (used,) = training["source"]["feature_views"]
    assert used["dataset"] == f"data:/{fresh}"
    graph = api.lineage(f"deployments:/{SERVED_AS}", direction="up", depth=10)
    trained = f"runs:/{steps['train']['output']['run_id']}"
    chain = [f"deployments:/{SERVED_AS}", f"models:/{MODEL}/2", trained, training["uri"]]
    for later, earlier in itertools.pairwise([*chain, f"data:/{fresh}"]):
        assert _reaches(graph, earlier, later), (earlier, later, graph["edges"])
    assert not _reaches(graph, "data:/wine/1", f"models:/{MODEL}/2")


def _reaches(graph: dict[str, Any], source: str, target: str) -> bool:
    """Whether edges lead from ``source`` to ``target``."""
    after: dict[str, set[str]] = {}
    for edge in graph["edges"]:
        after.setdefault(edge["source"], set()).add(edge["target"])
    found, todo = {source}, [source]
    while todo:
        for nxt in after.get(todo.pop(), set()) - found:
            found.add(nxt)
            todo.append(nxt)
    return target in found


def _assert_nobody_acted(api: ShamalClient, steps: dict[str, Any]) -> None:
    """From the lab's drop of its export on, every audited change was made by the platform or
    by a job (the entry names it), and each automated step is there."""
    entries = api.audit_entries(limit=1000)
    drop = next(e for e in entries if e["target"].endswith(f"artifact:{LANDING}"))
    after = [e for e in entries if e["seq"] > drop["seq"]]
    by_people = [
        (e["actor"], e["action"], e["target"])
        for e in after
        if e["actor"].split(":")[0] not in PLATFORM_ACTORS and "job" not in e["detail"]
    ]
    assert by_people == []
    jobs = {key: (s["job_id"] or "")[:12] for key, s in steps.items()}
    done = {(e["actor"], e["action"], e["detail"].get("job")) for e in after}
    assert {
        (f"monitor:{MONITOR}", "pipeline.run", None),
        ("admin", "dataset.ingest", jobs["ingest"]),
        ("admin", "features.historical", jobs["features"]),
        ("admin", "model_version.create", jobs["register"]),
        ("admin", "monitor.reference.build", jobs["register"]),
        ("admin", "deployment.canary", jobs["canary"]),
        ("rollout-controller", "deployment.rollout.step", None),
        ("rollout-controller", "deployment.rollout.promote", None),
        (f"monitor:{MONITOR}", "monitor.reference", None),
    } <= done, sorted(done, key=str)
