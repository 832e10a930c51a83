"""Pipelines survive faults, against real server processes: a server SIGKILLed mid-run and
started again on the same home carries every run on where it was (no step twice, none
forgotten); a failed step is retried up to its limit and what follows it never starts; two
servers sharing one PostgreSQL database never both start a step or both fire a tick.

Steps leave marker files in an exchange folder beside the server's home: a line when they
start and one when they end, with their job and attempt, so the test sees what ran, how
often, and whether two runs of one step ever overlapped.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shamal.client import ShamalClient
from shamal.pipelines import load_pipeline
from shamal.pipelines._advance import lease_owner_name, owner_is_gone
from tests.live import LiveServer, exchange_folder, job_command_pid
from tests.polling import wait_for

pytestmark = pytest.mark.slow

FAST = {"SHAMAL_SCHEDULER__TICK_S": "0.1", "SHAMAL_SCHEDULER__GRACE_S": "5"}

STEPS = """
import json, os, time
from pathlib import Path
from shamal.pipelines import pipeline, step


def _mark(folder, step, what):
    line = {"step": step, "what": what, "t": time.time(),
            "job": os.environ.get("SHAMAL_JOB_ID"), "attempt": os.environ["SHAMAL_ATTEMPT"]}
    with open(Path(folder) / "marks.jsonl", "a") as f:
        f.write(json.dumps(line) + "\\n")


def _wait(path, deadline_s=180):
    end = time.monotonic() + deadline_s
    while not path.exists():
        if time.monotonic() > end:
            raise SystemExit(f"nobody wrote {path}")
        time.sleep(0.05)


@step(cpus=0.1, memory_mib=256, cache=False)
def a(folder: str) -> int:
    _mark(folder, "a", "start")
    _mark(folder, "a", "end")
    return 2


@step(cpus=0.1, memory_mib=256, cache=False, retries=1)
def b(x: int, folder: str) -> int:
    _mark(folder, "b", "start")
    attempt = os.environ["SHAMAL_ATTEMPT"]
    Path(folder, f"running-b-{attempt}").write_text(os.environ["SHAMAL_JOB_ID"])
    _wait(Path(folder) / "go-b")
    _mark(folder, "b", "end")
    return x * 10


@step(cpus=0.1, memory_mib=256, cache=False)
def c(y: int, folder: str) -> int:
    _mark(folder, "c", "start")
    _mark(folder, "c", "end")
    return y + 1


@pipeline
def chain(folder: str) -> None:
    c(b(a(folder), folder), folder)


@step(cpus=0.1, memory_mib=256, cache=False, retries=2)
def flaky(folder: str) -> str:
    _mark(folder, "flaky", "start")
    attempt = int(os.environ["SHAMAL_ATTEMPT"])
    if attempt < 3:
        raise RuntimeError(f"attempt {attempt} fails")
    _mark(folder, "flaky", "end")
    return f"ok on attempt {attempt}"


@step(cpus=0.1, memory_mib=256, cache=False, retries=1)
def doomed(folder: str) -> str:
    _mark(folder, "doomed", "start")
    raise RuntimeError("always fails")


@step(cpus=0.1, memory_mib=256, cache=False)
def after(value: str, folder: str) -> str:
    _mark(folder, "after", "start")
    return value.upper()


@pipeline
def retried(folder: str) -> None:
    after(flaky(folder), folder)


@pipeline
def hopeless(folder: str) -> None:
    after(doomed(folder), folder)


@step(cpus=0.25, memory_mib=128, cache=False)
def items(n: int, folder: str) -> list[int]:
    _mark(folder, "items", "start")
    return list(range(n))


@step(cpus=0.25, memory_mib=128, cache=False)
def square(i: int, folder: str) -> int:
    _mark(folder, f"square[{i}]", "start")
    return i * i


@step(cpus=0.25, memory_mib=128, cache=False)
def total(values: list[int], folder: str) -> int:
    _mark(folder, "total", "start")
    return sum(values)


@pipeline
def fanout(folder: str, n: int = 20) -> None:
    total(square.map(items(n, folder), folder=folder), folder)


@step(cpus=0.1, memory_mib=128, cache=False)
def tick(folder: str) -> str:
    _mark(folder, "tick", "start")
    return "ticked"


@pipeline(name="minutely", schedule="* * * * *")
def every_minute(folder: str = "@MARKS@") -> None:
    tick(folder)
"""


def _marks(folder: Path) -> list[dict[str, Any]]:
    path = folder / "marks.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def _starts(folder: Path) -> Counter[str]:
    return Counter(m["step"] for m in _marks(folder) if m["what"] == "start")


def _never_overlapped(folder: Path, step: str) -> None:
    """Every start of ``step`` comes after the end of the one before (by time), and each
    start that ended was one attempt of one job."""
    seen = sorted((m for m in _marks(folder) if m["step"] == step), key=lambda m: m["t"])
    open_runs = 0
    for mark in seen:
        open_runs += 1 if mark["what"] == "start" else -1
        assert 0 <= open_runs <= 1, f"{step} ran twice at once: {seen}"


def _register(client: ShamalClient, code: Path, name: str) -> None:
    spec, root = load_pipeline(f"{code / 'flow.py'}:{name}")
    snapshot = client.upload_snapshot(root, "ml")
    client.register_pipeline(spec.to_json() | {"team": "ml"}, snapshot)


def _finished(client: ShamalClient, run_id: str, deadline_s: float = 150) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def ended() -> bool:
        found[:] = [client.pipeline_run(run_id)]
        return bool(found[0]["state"] != "running")

    wait_for(ended, f"pipeline run {run_id} to end", deadline_s)
    return found[0]


def _steps(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["key"]: s for s in run["steps"]}


def _explain(run: dict[str, Any]) -> Any:
    return run["reason"], [(s["key"], s["state"], s["reason"]) for s in run["steps"]]


def _jobs_per_name(client: ShamalClient, prefix: str) -> Counter[str]:
    jobs = client.list_jobs(limit=1000)
    return Counter(j["name"] for j in jobs if j["name"].startswith(prefix))


@pytest.fixture
def code(tmp_path: Path, marks: Path) -> Path:
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "flow.py").write_text(textwrap.dedent(STEPS).replace("@MARKS@", str(marks)))
    return folder


@pytest.fixture
def marks(tmp_path: Path) -> Path:
    return exchange_folder(tmp_path / "marks")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    live = LiveServer(tmp_path / "home", FAST).start()
    try:
        yield live
    finally:
        live.stop()


def _team(client: ShamalClient) -> None:
    client.request("POST", "/api/v1/teams", json={"name": "ml"})


@pytest.mark.parametrize("job_dies_too", [False, True], ids=["job-lives", "job-dies"])
def test_a_server_killed_mid_pipeline_carries_it_on_after_a_restart(
    server: LiveServer, code: Path, marks: Path, job_dies_too: bool
) -> None:
    """SIGKILL the server while step b runs. Its job lives on (re-attached by the next
    server) or, when the machine lost it too, is declared lost and retried (b allows one
    retry): either way one job, its attempts never overlapping, c once after it."""
    with ShamalClient(server.url, server.token) as client:
        _team(client)
        _register(client, code, "chain")
        run_id = client.start_pipeline("chain", {"folder": str(marks)})["id"]
        wait_for(lambda: (marks / "running-b-1").exists(), "step b to run", 120)
        b_job = _steps(client.pipeline_run(run_id))["b"]["job_id"]
        pid = job_command_pid(b_job, 1)
    server.kill()  # SIGKILL of the whole group: no shutdown code runs
    killed_at = time.time()
    if job_dies_too:
        record = server.home / "jobs" / b_job / "attempt-1.log.supervisor.json"
        os.kill(int(json.loads(record.read_text())["supervisor"]["pid"]), signal.SIGKILL)
        os.killpg(os.getpgid(pid), signal.SIGKILL)
    server.start()  # the same home, database and port
    with ShamalClient(server.url, server.token) as client:
        (marks / "go-b").write_text("go")
        # Well within the 60 s lease: the new server does not wait out the dead one's.
        run = _finished(client, run_id, deadline_s=40)
        assert run["state"] == "succeeded", _explain(run)
        steps = _steps(run)
        assert [steps[k]["output"] for k in ("a", "b", "c")] == [2, 20, 21]
        assert all(steps[k]["state"] == "succeeded" for k in ("a", "b", "c"))
        assert steps["b"]["job_id"] == b_job
        jobs = _jobs_per_name(client, "chain.")
        attempts = client.get_job(b_job)["attempt"]
    assert jobs == Counter({"chain.a": 1, "chain.b": 1, "chain.c": 1})
    starts = _starts(marks)
    assert (starts["a"], starts["c"]) == (1, 1)
    b_marks = [m for m in _marks(marks) if m["step"] == "b"]
    if job_dies_too:
        assert attempts == 2
        # Attempt 1 never ended (it was killed); attempt 2 started after that.
        assert [(m["attempt"], m["what"]) for m in b_marks] == [
            ("1", "start"),
            ("2", "start"),
            ("2", "end"),
        ]
        assert b_marks[1]["t"] > killed_at
    else:
        assert attempts == 1
        _never_overlapped(marks, "b")
        assert starts["b"] == 1
    c_start = next(m["t"] for m in _marks(marks) if m["step"] == "c")
    assert c_start > b_marks[-1]["t"]


def test_a_failed_step_is_retried_to_its_limit_and_what_follows_never_starts(
    server: LiveServer, code: Path, marks: Path
) -> None:
    with ShamalClient(server.url, server.token) as client:
        _team(client)
        for name in ("retried", "hopeless"):
            _register(client, code, name)
        good = client.start_pipeline("retried", {"folder": str(marks)})["id"]
        bad = client.start_pipeline("hopeless", {"folder": str(marks)})["id"]
        run = _finished(client, good)
        assert run["state"] == "succeeded", _explain(run)
        steps = _steps(run)
        assert steps["flaky"]["output"] == "ok on attempt 3"
        assert steps["after"]["output"] == "OK ON ATTEMPT 3"
        assert client.get_job(steps["flaky"]["job_id"])["attempt"] == 3
        failed = _finished(client, bad)
        assert failed["state"] == "failed", _explain(failed)
        steps = _steps(failed)
        assert steps["doomed"]["state"] == "failed"
        doomed = client.get_job(steps["doomed"]["job_id"])
        assert (doomed["state"], doomed["attempt"]) == ("failed", 2)
        assert steps["after"]["state"] == "upstream_failed"
        assert steps["after"]["job_id"] is None
        assert "doomed" in failed["reason"]
        jobs = _jobs_per_name(client, "")
    starts = _starts(marks)
    assert (starts["flaky"], starts["doomed"]) == (3, 2)
    assert starts["after"] == 1  # only the good run's
    assert jobs["hopeless.after"] == 0
    assert (jobs["retried.flaky"], jobs["hopeless.doomed"]) == (1, 1)


@pytest.mark.postgres
def test_two_servers_on_postgres_start_each_step_and_fire_each_tick_once(
    tmp_path: Path, code: Path, marks: Path, fresh_pg_url: str
) -> None:
    """Both servers share the database and the home (the snapshots, the job folders), each
    with a scheduler of its own name. The schedule is a real one, every minute: the test
    waits for a minute boundary with both servers up (its fan-out runs meanwhile)."""
    cluster = tmp_path / "cluster.toml"
    cluster.write_text(
        '[[pools]]\nname = "p"\n[[pools.nodes]]\nname = "box"\ncpus = 2\nmemory_mib = 8192\n'
    )
    env = {
        **FAST,
        "SHAMAL_DATABASE_URL": fresh_pg_url,
        "SHAMAL_SCHEDULER__CLUSTER_FILE": str(cluster),
    }
    home = tmp_path / "home"
    left = LiveServer(home, {**env, "SHAMAL_SCHEDULER__NAME": "left"}).start()
    right: LiveServer | None = None
    try:
        right = LiveServer(home, {**env, "SHAMAL_SCHEDULER__NAME": "right"}).start()
        with (
            ShamalClient(left.url, left.token) as one,
            ShamalClient(right.url, right.token) as other,
        ):
            _team(one)
            _register(one, code, "every_minute")
            _register(one, code, "fanout")
            # Runs started on either server; both servers' loops advance both.
            ids = [
                one.start_pipeline("fanout", {"folder": str(marks)})["id"],
                other.start_pipeline("fanout", {"folder": str(marks), "n": 19})["id"],
            ]
            runs = [_finished(one, run_id) for run_id in ids]
            for run, n in zip(runs, (20, 19), strict=True):
                assert run["state"] == "succeeded", _explain(run)
                assert _steps(run)["total"]["output"] == sum(i * i for i in range(n))
            jobs = _jobs_per_name(other, "fanout.")
            # A whole tick fired with both servers up, and its run ended.
            scheduled = wait_for(
                lambda: [
                    r for r in one.pipeline_runs("minutely", limit=100) if r["state"] != "running"
                ],
                "a scheduled run",
                150,  # a tick is at most two minutes after registration
            )
            all_scheduled = one.pipeline_runs("minutely", limit=100)
    finally:
        if right is not None:
            right.stop()
        left.stop()
    # Two runs' steps: each a job of its own, once (20 + 19 items, items and total twice).
    assert jobs["fanout.items"] == 2
    assert jobs["fanout.total"] == 2
    assert all(jobs[f"fanout.square[{i}]"] == 2 for i in range(19))
    assert jobs["fanout.square[19]"] == 1
    assert sum(jobs.values()) == 43
    starts = _starts(marks)
    assert all(count in (1, 2) for count in starts.values())
    assert starts["items"] == 2
    assert starts["square[19]"] == 1
    assert scheduled[0]["state"] == "succeeded"
    ticks = Counter(r["trigger"] for r in all_scheduled)
    assert set(ticks.values()) == {1}, ticks
    # Each scheduled run's one step ran once, as one job.
    tick_jobs = Counter(m["job"] for m in _marks(marks) if m["step"] == "tick")
    assert set(tick_jobs.values()) == {1}
    assert len(tick_jobs) <= len(all_scheduled)


def test_a_lease_holder_counts_as_gone_only_when_its_process_here_has_ended() -> None:
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    host = socket.gethostname()[:32]
    assert owner_is_gone(f"{host}:{ended.pid}:0123abcd")
    assert not owner_is_gone(lease_owner_name())  # this process
    assert not owner_is_gone(f"{host}:{os.getppid()}:0123abcd")  # alive
    assert not owner_is_gone(f"elsewhere-{host}:{ended.pid}:0123abcd")  # another host
    assert not owner_is_gone(f"{host}:1:0123abcd")
    assert not owner_is_gone("no shape at all")
    assert not owner_is_gone(f"{host}:12ab:0123abcd")
