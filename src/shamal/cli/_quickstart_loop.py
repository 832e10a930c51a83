"""The quickstart's last act: the loop that keeps the served model healthy, with nobody at the
keyboard.

The deployment's callers keep asking (a thread here), a monitor compares what they send and
what the model answers with the champion's reference profile every few seconds, and the
retraining pipeline waits for its drift. Then the lab's new instrument starts reading every
measurement a quarter high: the callers' requests shift, the monitor finds drift and starts
the pipeline, which takes in the lab's labelled export of the new harvest, validates it,
builds the training set from the feature store, trains, registers the new version with its
own reference and puts it on the deployment as a canary; the rollout controller moves it up
on live traffic and promotes it, and the monitor, following the deployment's primary, judges
the traffic against the new version's reference from then on. The quickstart only watches,
and prints each step and the new champion's lineage.
"""

from __future__ import annotations

import contextlib
import csv
import random
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from rich.tree import Tree

from shamal.cli._quickstart_wine import (
    MODEL,
    QUICKSTART_TEAM,
    SERVED_AS,
    TRAINING_DATA,
    Served,
    taster,
    wine_csv,
    wine_measurements,
)
from shamal.cli.monitor import describe_action
from shamal.client import ShamalClient
from shamal.errors import AlreadyExists

RETRAIN = Path(__file__).resolve().parents[3] / "examples" / "retrain" / "pipeline.py"
MONITOR = f"{SERVED_AS}-drift"
#: Where the lab drops its labelled export in the team's artifact store.
LANDING = "landing/wine-harvest.csv"
#: The new instrument reads every measurement this much high.
DRIFT_FACTOR = 1.25
#: Monitor runs this often (the shortest schedule a monitor takes).
SCHEDULE_S = 10
#: The share of traffic a new version starts with, as a canary.
CANARY_PERCENT = 25
#: Requests the callers send a second.
RATE = 20.0
#: How long each stage may take before the quickstart says so and stops waiting.
WAIT_RESULT_S = 120.0
WAIT_RUN_S = 420.0
WAIT_ROLLOUT_S = 300.0


class Traffic:
    """The deployment's callers, in a thread: one request after another, each for one wine
    sample, by its id (the model server reads its measurements online) until :meth:`shift`
    hands it measurements to send as they are."""

    def __init__(self, served: Served, samples: int) -> None:
        self._url = f"http://127.0.0.1:{served.http_port}/v2/models/{SERVED_AS}/infer"
        self._headers = {"Authorization": f"Bearer {served.caller}"}
        self._samples = samples
        self._order = [int(i) for i in random.Random(7).sample(range(4 * samples), 4 * samples)]
        self._rows: list[list[float]] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="quickstart-callers", daemon=True)
        self.sent = 0
        self.failed = 0

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def shift(self, rows: list[list[float]]) -> None:
        self._rows = rows

    def _body(self, i: int) -> dict[str, Any]:
        rows = self._rows
        # Callers come in no order: a stretch of the data sorted by class is not the traffic.
        pick = self._order[i % len(self._order)]
        if rows is None:
            tensor = {"name": "sample_id", "shape": [1], "datatype": "INT64"}
            return {"id": f"q{i}", "inputs": [{**tensor, "data": [pick % self._samples]}]}
        row = rows[pick % len(rows)]
        tensor = {"name": "input", "shape": [1, len(row)], "datatype": "FP32", "data": row}
        return {"id": f"q{i}", "inputs": [tensor]}

    def _run(self) -> None:
        with httpx.Client(headers=self._headers, timeout=30) as http:
            # The wait paces the callers; it synchronises nothing.
            while not self._stop.wait(1 / RATE):
                try:
                    ok = http.post(self._url, json=self._body(self.sent)).status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.sent += 1
                self.failed += 0 if ok else 1


def harvest(folder: Path) -> tuple[Path, list[list[float]]]:
    """The new harvest as the lab exports it (two samples of each kind the wine data holds,
    measured by the new instrument: every measurement a quarter high, with a little noise),
    labelled, with new sample ids; and the measurements the callers will send."""
    import numpy as np
    from sklearn.datasets import load_wine

    wine = load_wine()
    rng = np.random.default_rng(2026)
    data = np.vstack([wine.data, wine.data]) * DRIFT_FACTOR
    data *= rng.normal(1.0, 0.01, data.shape)
    labels = np.concatenate([wine.target, wine.target])
    start = datetime.now(UTC) - timedelta(days=2)
    path = folder / Path(LANDING).name
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["sample_id", "measured_at", *wine_measurements(), "target", "taster"])
        for index, (row, label) in enumerate(zip(data, labels, strict=True)):
            when = (start + timedelta(minutes=index)).isoformat()
            sample = 10_000 + index
            writer.writerow(
                [sample, when, *(repr(float(v)) for v in row), int(label)] + [taster(sample)]
            )
    return path, [[float(v) for v in row] for row in data]


def retrain_on_new_data(client: ShamalClient, folder: Path, say: Callable[[str], None]) -> None:
    """Register the retraining pipeline, which every new version of the wine data starts by
    itself, then ingest one and follow the run it starts (it registers a candidate and the
    gate decides @champion; deploying is the drift monitor's call, below)."""
    from shamal.pipelines import load_pipeline

    spec, root = load_pipeline(f"{RETRAIN}:retrain")
    body = spec.to_json() | {"team": QUICKSTART_TEAM}
    registered = client.register_pipeline(body, client.upload_snapshot(root, QUICKSTART_TEAM))
    say(
        f"registered pipeline [bold]retrain[/] v{registered['pipeline']['version']} (ingest, "
        "validate, features, train, evaluate, register, gate, canary), started by every new "
        "version of wine"
    )
    before = {r["id"] for r in client.pipeline_runs("retrain", limit=1000)}
    found = client.ingest_file(TRAINING_DATA, wine_csv(folder), mode="overwrite")

    def started() -> dict[str, Any] | None:
        runs = [r for r in client.pipeline_runs("retrain", limit=1000) if r["id"] not in before]
        if runs and runs[0]["state"] != "running":
            run: dict[str, Any] = client.pipeline_run(runs[0]["id"])
            return run
        return None

    run = _wait(f"a run started by {found['uri']}", WAIT_RUN_S, started)
    states = ", ".join(f"{s['key']} {s['state']}" for s in run["steps"] if s.get("fan_out") is None)
    say(
        f"ingested {found['uri']}: it started run [bold]{run['id'][:12]}[/], {run['state']} "
        f"({states}); see it: shamal pipeline show {run['id']}"
    )


def _watch(client: ShamalClient) -> str:
    """The monitor on the served deployment: every few seconds, retraining on drift, with the
    lab's export as the fresh data (it replaces the old: the model learns the new harvest)."""
    spec = {
        "deployment": SERVED_AS,
        "name": MONITOR,
        "schedule_s": SCHEDULE_S,
        "on_drift": "retrain:retrain",
        "retrain_params": {
            "landing": f"{QUICKSTART_TEAM}/{LANDING}",
            "mode": "overwrite",
            "deployment": SERVED_AS,
            "canary_percent": CANARY_PERCENT,
        },
    }
    with contextlib.suppress(AlreadyExists):
        client.create_monitor(spec)
    found = client.monitor(MONITOR)
    ref = found["reference"]
    return (
        f"monitor [bold]{MONITOR}[/] compares {SERVED_AS}'s traffic with the reference of "
        f"{ref['model']}/{ref['version']} every {found['schedule_s']} s (following the "
        "primary), and on drift starts [bold]retrain[/] on the lab's newest export"
    )


def _wait(what: str, deadline_s: float, probe: Callable[[], Any]) -> Any:
    """``probe()``'s first answer other than None, polling the server.

    Raises:
        TimeoutError: none came within ``deadline_s``, naming ``what`` was awaited.
    """
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        found = probe()
        if found is not None:
            return found
        time.sleep(0.5)  # polling the server, with a deadline
    raise TimeoutError(f"{what} did not happen within {deadline_s:.0f} s")


def _next_result(
    client: ShamalClient, seen: set[str], wanted: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The first result after ``seen`` that read samples and that ``wanted`` accepts, once
    its drift policy (if any) has acted."""

    def probe() -> dict[str, Any] | None:
        for result in reversed(client.monitor_results(MONITOR, limit=20)):
            if result["id"] in seen:
                continue
            seen.add(result["id"])
            if result["samples"] and wanted(result):
                chosen: dict[str, Any] = result
                return chosen
        return None

    found: dict[str, Any] = _wait("a monitor run", WAIT_RESULT_S, probe)
    if found["drifted"] and not found["actions"]:
        # The policy follows the drift event; its action lands on the result in a moment.
        def acted() -> dict[str, Any] | None:
            for result in client.monitor_results(MONITOR, limit=20):
                if result["id"] == found["id"] and result["actions"]:
                    return result
            return None

        found = _wait("the drift policy", WAIT_RESULT_S, acted)
    return found


def _follow_run(client: ShamalClient, run_id: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        run: dict[str, Any] = client.pipeline_run(run_id)
        return None if run["state"] == "running" else run

    found: dict[str, Any] = _wait(f"retraining run {run_id[:12]}", WAIT_RUN_S, probe)
    return found


def _rollout(client: ShamalClient) -> dict[str, Any]:
    """The deployment once its rollout has ended (promoted or rolled back)."""

    def probe() -> dict[str, Any] | None:
        found: dict[str, Any] = client.get_deployment(SERVED_AS)
        return None if found["state"]["phase"] == "progressing" else found

    done: dict[str, Any] = _wait("the canary's rollout", WAIT_ROLLOUT_S, probe)
    return done


def _primary(deployment: dict[str, Any]) -> int:
    return int(next(r["version"] for r in deployment["routes"] if r["role"] == "primary"))


def close_the_loop(
    client: ShamalClient, served: Served, folder: Path, *, say: Callable[[str], None]
) -> Tree | None:
    """Watch drift, retraining, canary and promotion happen by themselves, telling each step
    as it happens; the new champion's lineage as a tree (None when the loop did not close)."""
    if not RETRAIN.is_file():
        say("the retraining pipeline example is part of a source checkout: skipped here")
        return None
    try:
        retrain_on_new_data(client, folder, say)
    except TimeoutError as exc:
        say(f"[yellow]{exc}[/]: see `shamal pipeline list`")
        return None
    say(_watch(client))
    seen = {r["id"] for r in client.monitor_results(MONITOR, limit=20)}
    before = _primary(client.get_deployment(SERVED_AS))
    with Traffic(served, samples=178) as traffic:
        try:
            after = _loop(client, traffic, seen, folder, say)
        except TimeoutError as exc:
            say(f"[yellow]{exc}[/]: see `shamal monitor show {MONITOR}`")
            return None
        finally:
            say(f"callers sent {traffic.sent} requests ({traffic.failed} failed)")
    if after == before:
        return None
    return lineage_tree(client, f"models:/{MODEL}/{after}")


def _loop(
    client: ShamalClient,
    traffic: Traffic,
    seen: set[str],
    folder: Path,
    say: Callable[[str], None],
) -> int:
    """The loop, told step by step; the deployment's primary version at its end."""
    calm = _next_result(client, seen, lambda r: True)
    say(f"callers ask {SERVED_AS} by sample id: {_verdict(calm)}")
    path, rows = harvest(folder)
    with path.open("rb") as handle:
        client.upload_artifact(QUICKSTART_TEAM, LANDING, handle)
    traffic.shift(rows)
    say(
        "the lab's new instrument reads every measurement a quarter high; its labelled export "
        f"of the new harvest lands in the team's artifacts ({LANDING})"
    )
    found = _next_result(client, seen, lambda r: bool(r["drifted"]))
    action: dict[str, Any] = next((a for a in found["actions"] if a["action"] == "retrain"), {})
    if not action.get("run"):
        say(f"[bold red]drift detected[/]: {_verdict(found)}; {describe_action(action)}")
        return _primary(client.get_deployment(SERVED_AS))
    say(
        f"[bold red]drift detected[/]: {_verdict(found)}; it started retraining run "
        f"[bold]{action['run'][:12]}[/]"
    )
    run = _follow_run(client, action["run"])
    states = ", ".join(f"{s['key']} {s['state']}" for s in run["steps"])
    say(f"retraining run {run['id'][:12]} {run['state']}: {states}")
    canary = next((s.get("output") or {} for s in run["steps"] if s["key"] == "canary"), {})
    if not canary.get("canary"):
        return _primary(client.get_deployment(SERVED_AS))
    say(f"{canary['canary']} went on {SERVED_AS} as its canary at {CANARY_PERCENT}% of traffic")
    before = _primary(client.get_deployment(SERVED_AS))
    deployment = _rollout(client)
    after = _primary(deployment)
    for line in _rollout_lines(client, deployment, before):
        say(line)
    if after != before:
        settled = _next_result(
            client, seen, lambda r: r["report"].get("reference", {}).get("version") == after
        )
        say(
            f"the monitor now judges v{after}'s answers against its own reference: "
            f"{_verdict(settled)}"
        )
    return after


def _verdict(result: dict[str, Any]) -> str:
    columns = result["report"]["columns"]
    drifted = [c["column"] for c in columns if c["drifted"]]
    named = f": {', '.join(drifted[:4])}{', ...' if len(drifted) > 4 else ''}" if drifted else ""
    word = "[red]drift[/]" if result["drifted"] else "no drift"
    return f"{result['rows']} rows judged, {word} ({len(drifted)} of {len(columns)} columns{named})"


def _rollout_lines(client: ShamalClient, deployment: dict[str, Any], before: int) -> list[str]:
    events = client.deployment_events(SERVED_AS, limit=20)
    moves = [e for e in reversed(events) if e["actor"] == "rollout-controller"]
    told = [f"  {e['kind']}: {e['reason']}" for e in moves[-4:]]
    after = _primary(deployment)
    if after == before:
        return [
            f"the rollout controller rolled the canary back ({deployment['state']['phase']})",
            *told,
        ]
    return [
        f"the rollout controller promoted [bold]{MODEL}/{after}[/] on live traffic; "
        "nobody approved anything:",
        *told,
    ]


def lineage_tree(client: ShamalClient, uri: str) -> Tree:
    """Where ``uri`` came from and where it went, as `shamal lineage URI` tells it."""
    from shamal.cli.lineage import lineage_tree as draw

    return draw(client.lineage(uri, direction="both", depth=10))
