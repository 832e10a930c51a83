"""`shamal tune` end to end: a real server and scheduler run every trial as a job."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
from typer.testing import CliRunner

from shamal.cli.tune import CONTEXT, tune
from shamal.client import ShamalClient
from shamal.errors import NotFound
from shamal.tune import TuneClient
from shamal.tune._driver import TuneDriver, TuneOptions
from tests.jobs.test_scheduling import FAST, stop_all_jobs
from tests.live import LiveServer, exchange_folder
from tests.polling import wait_for

pytestmark = pytest.mark.slow

TRIAL = """
import os, sys
import shamal.tune

trial = shamal.tune.current_trial()
number = int(os.environ["TUNE_TRIAL_NUMBER"])
x = trial.suggest_float("x", -3.0, 3.0)
bad = number == 3  # the clearly bad one: far above the median from its first report
for step in range(4):
    # The good ones report the same curve: none is above the median at any step, whatever
    # order their reports arrive in (a busy machine runs them at uneven speeds).
    value = 100.0 if bad else 1.0 - 0.1 * step
    trial.report(step, value)
    with open(os.path.join(os.environ["MARKS"], f"trial-{number}"), "a") as f:
        f.write(f"{step}\\n")
    if trial.should_prune():
        sys.exit(0)  # no tell: the platform settles it as pruned when the job ends
trial.set_run("run-of-%d" % number)
trial.complete(value - 0.01 * number)  # the last good one ends best
"""


class TuneServer(LiveServer):
    """The live server, started through ``tests.tune._server`` (tune routes mounted)."""

    def start(self, deadline_s: float = 60.0) -> LiveServer:
        self.home.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "tests.tune._server", "server", "--port", str(self.port)]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
                argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/ready", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)  # polling with a deadline, not synchronising on a sleep
        self.stop()
        raise RuntimeError(f"server did not become ready:\n{self.log.read_text()[-3000:]}")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with (
        TuneServer(tmp_path / "home", env=FAST) as live,
        ShamalClient(live.url, live.token) as client,
    ):
        try:
            yield live
        finally:
            stop_all_jobs(client)


def test_tune_runs_trials_as_jobs_and_prunes_the_bad_one(
    server: LiveServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, marks = tmp_path / "code", tmp_path / "marks"
    code.mkdir()
    exchange_folder(marks)
    (code / "trial.py").write_text(TRIAL)
    monkeypatch.setenv("SHAMAL_URL", server.url)
    monkeypatch.setenv("SHAMAL_TOKEN", server.token)
    app = typer.Typer()
    app.command("tune", context_settings=CONTEXT)(tune)
    app.command("other")(lambda: None)
    args = ["tune", "--study", "e2e", "--trials", "4", "--parallel", "2", "--pruner", "median",
            "--sampler", "random", "--cpus", "0.5", "--memory", "64MiB", "--poll", "0.2",
            "--workdir", str(code), "--env", f"MARKS={marks}", "--json",
            "--", sys.executable, "trial.py"]  # fmt: skip
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    with ShamalClient(server.url, server.token) as client:
        trials = TuneClient(client).list_trials("", "e2e")
        study = TuneClient(client).get_study("", "e2e")

        def ended() -> dict[str, Any] | None:
            # A trial is complete once its code says so; its job ends just after.
            found = {j["id"]: j for j in client.list_jobs(limit=100)}
            running = any(found[t["job_id"]]["state"] == "running" for t in trials)
            return None if running else found

        jobs = wait_for(ended, "the trials' jobs to end")
    assert [t["state"] for t in trials] == ["complete", "complete", "complete", "pruned"]
    assert (marks / "trial-3").read_text().split() == ["0"]  # stopped at its first report
    assert (marks / "trial-0").read_text().split() == ["0", "1", "2", "3"]
    assert {jobs[t["job_id"]]["state"] for t in trials} == {"succeeded"}
    assert all(-3 <= t["params"]["x"] <= 3 for t in trials)
    assert study["best"]["number"] == 2
    assert study["best"]["user_attrs"] == {"run_id": "run-of-2"}
    assert '"number": 2' in result.output


def test_scikit_learn_study_finds_a_good_tree_and_registers_it(
    server: LiveServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "wine_trial.py").write_text((Path(__file__).parent / "wine_trial.py").read_text())
    monkeypatch.setenv("SHAMAL_URL", server.url)
    monkeypatch.setenv("SHAMAL_TOKEN", server.token)
    app = typer.Typer()
    app.command("tune", context_settings=CONTEXT)(tune)
    app.command("other")(lambda: None)
    args = ["tune", "--study", "wine", "--trials", "4", "--parallel", "2", "--pruner", "none",
            "--direction", "maximize", "--seed", "7", "--cpus", "0.5", "--memory", "512MiB",
            "--poll", "0.2", "--workdir", str(code), "--register-best", "wine-tree",
            "--", sys.executable, "wine_trial.py"]  # fmt: skip
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    with ShamalClient(server.url, server.token) as client:
        trials = TuneClient(client).list_trials("", "wine")
        study = TuneClient(client).get_study("", "wine")
        model = client.get_model("wine-tree")
        best_run = client.get_run(study["best"]["user_attrs"]["run_id"])
    assert [t["state"] for t in trials] == ["complete"] * 4, trials
    values = sorted(t["value"] for t in trials)
    assert study["best"]["value"] == values[-1]
    assert values[-1] >= 0.85  # a tree of depth >= 3 reaches ~0.9 on wine; depth 1 ~0.6
    assert study["best"]["params"]["max_depth"] >= 2
    assert "registered wine-tree version 1" in result.output
    assert model["name"] == "wine-tree"
    tags = best_run["data"]["tags"] if "data" in best_run else best_run["tags"]
    assert str(study["best"]["number"]) in str(tags)


def test_stopping_the_driver_cancels_running_trial_jobs_and_fails_their_trials(
    server: LiveServer, tmp_path: Path
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "slow.py").write_text(
        "import time, shamal.tune\n"
        "trial = shamal.tune.current_trial()\n"
        "trial.report(0, trial.suggest_float('x', 0.0, 1.0))\n"
        "while True:\n    time.sleep(0.2)\n"
    )
    options = TuneOptions(
        study="stop", command=[sys.executable, "slow.py"], trials=5, parallel=2,
        workdir=code, job={"cpus": 0.5, "memory_mib": 64}, poll_s=0.1,
    )  # fmt: skip
    with (
        ShamalClient(server.url, server.token) as client,
        ShamalClient(server.url, server.token) as own,  # the driver's, in its thread
    ):
        driver = TuneDriver(own, options)
        worker = threading.Thread(target=driver.run, daemon=True)
        worker.start()

        def both_reported() -> bool:
            try:
                trials = TuneClient(client).list_trials("", "stop")
            except NotFound:  # not created yet
                return False
            return len(trials) == 2 and all(t["intermediate"] for t in trials)

        try:
            wait_for(both_reported, "two trials to run and report", deadline_s=60)
            jobs = set(driver.running.values())
        finally:
            driver.stop()
            worker.join(30)
        assert not worker.is_alive()
        wait_for(
            lambda: {client.get_job(j)["state"] for j in jobs} == {"cancelled"}, "cancellation"
        )

        def failed() -> list[dict[str, Any]]:
            trials = TuneClient(client).list_trials("", "stop")
            return trials if {t["state"] for t in trials} == {"fail"} else []

        trials = wait_for(failed, "the platform to fail both cancelled trials")
    assert {t["job_id"] for t in trials} == jobs
    assert {t["reason"] for t in trials} == {"job cancelled"}


def test_a_study_whose_trials_never_complete_says_why_and_where_to_look(
    server: LiveServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('trained, but told the study nothing')\n")
    monkeypatch.setenv("SHAMAL_URL", server.url)
    monkeypatch.setenv("SHAMAL_TOKEN", server.token)
    monkeypatch.setenv("COLUMNS", "200")
    app = typer.Typer()
    app.command("tune", context_settings=CONTEXT)(tune)
    app.command("other")(lambda: None)
    args = ["tune", "--study", "silent", "--trials", "2", "--cpus", "0.5", "--memory", "64MiB",
            "--poll", "0.2", "--workdir", str(code), "--", sys.executable, "train.py"]  # fmt: skip
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "no trial completed" in said
    assert "trials: 2 fail" in said
    assert "calls shamal.tune.current_trial().complete(value)" in said
    with ShamalClient(server.url, server.token) as client:
        trials = TuneClient(client).list_trials("", "silent")
    assert f"shamal job logs {trials[-1]['job_id'][:12]}" in said
