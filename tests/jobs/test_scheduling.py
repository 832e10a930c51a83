"""The live scheduler end to end: a real server process runs jobs with the local executor.

Jobs are tiny Python commands in a snapshot of a temporary folder. Tests wait on job
states by polling the API with a deadline; the jobs themselves leave marker files that
show what ran, how often and when.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from shamal.client import ShamalClient
from tests.live import LiveServer, exchange_folder, job_command_pid
from tests.polling import wait_for

pytestmark = pytest.mark.slow

FAST = {
    "SHAMAL_SCHEDULER__TICK_S": "0.2",
    "SHAMAL_SCHEDULER__GRACE_S": "5",
}
SMALL = {"cpus": 0.5, "memory_mib": 64}


def state_is(api: ShamalClient, job_id: str, *states: str) -> Callable[[], Any]:
    def check() -> Any:
        job = api.get_job(job_id)
        return job if job["state"] in states else None

    return check


@pytest.fixture
def code(tmp_path: Path) -> Path:
    """The job's working folder: a script that records each start and obeys its args."""
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "job.py").write_text(
        """
import json, os, signal, sys, time
marks = sys.argv[1]
mode = sys.argv[2] if len(sys.argv) > 2 else "ok"
with open(os.path.join(marks, "starts.jsonl"), "a") as f:
    f.write(json.dumps({"job": os.environ["SHAMAL_JOB_ID"],
                        "attempt": os.environ["SHAMAL_ATTEMPT"], "t": time.time()}) + "\\n")
print("hello from", os.environ["SHAMAL_JOB_ID"], "attempt", os.environ["SHAMAL_ATTEMPT"])
sys.stdout.flush()
resumed = os.path.join(marks, "checkpoint")
if mode == "ok":
    sys.exit(0)
if mode == "fail":
    sys.exit(3)
if mode == "whoami":
    import urllib.error, urllib.request
    auth = {"Authorization": "Bearer " + os.environ["SHAMAL_TOKEN"],
            "Content-Type": "application/json"}
    request = urllib.request.Request(os.environ["SHAMAL_URL"] + "/api/v1/whoami", headers=auth)
    me = json.load(urllib.request.urlopen(request))
    print("I am", me["user"]["name"], "admin:", me["user"]["is_admin"], "scope:", me["scope"])
    mint = urllib.request.Request(os.environ["SHAMAL_URL"] + "/api/v1/tokens", headers=auth,
                                  data=b'{"name": "escape"}', method="POST")
    try:
        urllib.request.urlopen(mint)
        print("minted a token of my own")
    except urllib.error.HTTPError as refused:
        print("minting refused:", refused.code)
    with open(os.path.join(marks, "token"), "w") as f:
        f.write(os.environ["SHAMAL_TOKEN"])
    sys.exit(0 if os.environ["MLFLOW_TRACKING_TOKEN"] == os.environ["SHAMAL_TOKEN"] else 4)
if mode == "preemptible":
    if os.path.exists(resumed):
        print("resumed from checkpoint"); sys.exit(0)
    def on_term(signum, frame):
        open(resumed, "w").write("saved"); print("checkpointed"); sys.exit(75)
    signal.signal(signal.SIGTERM, on_term)
open(os.path.join(marks, "running-" + os.environ["SHAMAL_ATTEMPT"]), "w").write(str(os.getpid()))
if mode == "wait-file":
    while not os.path.exists(os.path.join(marks, "go")):
        time.sleep(0.05)
    sys.exit(0)
while True:
    time.sleep(0.2)
"""
    )
    (folder / ".gitignore").write_text("marks/\n")
    return folder


@pytest.fixture
def marks(tmp_path: Path) -> Path:
    return exchange_folder(tmp_path / "marks")


def starts(marks: Path) -> list[dict[str, Any]]:
    path = marks / "starts.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with LiveServer(tmp_path / "home", env=FAST) as live:
        yield live


def stop_all_jobs(api: ShamalClient) -> None:
    """Jobs outlive their server by design: cancel whatever a test left running."""
    active = ["queued", "admitted", "running"]
    for job in api.list_jobs(states=active, limit=1000):
        api.cancel_job(job["id"])
    wait_for(lambda: not api.list_jobs(states=active), "every job to stop", deadline_s=30)


@pytest.fixture
def api(server: LiveServer) -> Iterator[ShamalClient]:
    with ShamalClient(server.url, server.token) as client:
        try:
            yield client
        finally:
            stop_all_jobs(client)


def submit(api: ShamalClient, code: Path, marks: Path, mode: str, **options: Any) -> str:
    digest = api.upload_snapshot(code)
    job = api.submit_job(
        ["python", "job.py", str(marks), mode], snapshot=digest, **{**SMALL, **options}
    )
    return str(job["id"])


def log_of(api: ShamalClient, job_id: str, attempt: int | None = None) -> str:
    data, _, _, _ = api.job_log(job_id, attempt=attempt)
    return data.decode()


def test_a_job_runs_logs_and_is_charged(
    api: ShamalClient, code: Path, marks: Path, tmp_path: Path
) -> None:
    sentinel = tmp_path / "SENTINEL"
    digest = api.upload_snapshot(code)
    injected = ["python", "job.py", str(marks), "ok", f"; touch {sentinel}", f"$(touch {sentinel})"]
    job_id = api.submit_job(injected, snapshot=digest, **SMALL)["id"]
    job = wait_for(state_is(api, job_id, "succeeded", "failed"), "the job to finish")
    assert (job["state"], job["exit_code"], job["attempt"]) == ("succeeded", 0, 1)
    assert f"hello from {job_id} attempt 1" in wait_for(lambda: log_of(api, job_id), "its log")
    events = [(e["from_state"], e["to_state"]) for e in api.job_events(job_id)]
    assert events == [
        (None, "queued"),
        ("queued", "admitted"),
        ("admitted", "running"),
        ("running", "succeeded"),
    ]
    assert [s["job"] for s in starts(marks)] == [job_id]
    since = datetime.now(UTC) - timedelta(hours=1)
    (line,) = api.cost_report(by="job", since=since)
    assert (line["key"], line["attempts"], line["gpu_seconds"]) == (job_id, 1, 0)
    assert line["cpu_seconds"] > 0
    assert not sentinel.exists()  # arguments are argv entries, never shell text


def test_a_job_whose_process_is_killed_fails_and_is_retried(
    api: ShamalClient, code: Path, marks: Path
) -> None:
    job_id = submit(api, code, marks, "forever", retries=1)
    wait_for(lambda: (marks / "running-1").exists(), "the job to run")
    os.kill(job_command_pid(job_id, 1), signal.SIGKILL)  # e.g. the OOM killer
    wait_for(lambda: (marks / "running-2").exists(), "the retry to run")
    events = [e["to_state"] for e in api.job_events(job_id)]
    assert events[3:6] == ["failed", "queued", "admitted"]
    assert api.get_job(job_id)["retries_used"] == 1
    api.cancel_job(job_id)
    wait_for(state_is(api, job_id, "cancelled"), "the cancellation")


def test_a_job_calls_the_platform_with_a_token_of_its_own(
    api: ShamalClient, server: LiveServer, code: Path, marks: Path
) -> None:
    """The submitter here is the admin: the job acts as that account but cannot mint
    tokens or take admin actions, and its token is revoked once the attempt ends."""
    job_id = submit(api, code, marks, "whoami", time_limit_s=600)
    job = wait_for(state_is(api, job_id, "succeeded", "failed"), "the job to finish")
    log = log_of(api, job_id)
    assert job["state"] == "succeeded", log
    assert "I am admin admin: True scope: job" in log
    assert "minting refused: 403" in log
    (token,) = [t for t in api.request("GET", "/api/v1/tokens") if t["name"].startswith("job-")]
    assert (token["name"], token["scope"]) == (f"job-{job_id[:12]}-1", "job")
    lifetime = datetime.fromisoformat(token["expires_at"]) - datetime.fromisoformat(
        token["created_at"]
    )
    assert timedelta(minutes=69) < lifetime <= timedelta(minutes=71)  # time limit + 1 h
    assert token["revoked_at"] is not None  # the attempt ended
    secret = (marks / "token").read_text()
    answer = httpx.get(f"{server.url}/api/v1/whoami", headers={"Authorization": f"Bearer {secret}"})
    assert answer.status_code == 401


def test_failures_are_retried_up_to_the_limit(api: ShamalClient, code: Path, marks: Path) -> None:
    job_id = submit(api, code, marks, "fail", retries=1)
    job = wait_for(
        lambda: (j := api.get_job(job_id))["state"] == "failed" and j["attempt"] == 2 and j,
        "the retry to fail too",
    )
    assert (job["exit_code"], job["retries_used"]) == (3, 1)
    assert [s["attempt"] for s in starts(marks)] == ["1", "2"]


def test_time_limit_stops_a_job(api: ShamalClient, code: Path, marks: Path) -> None:
    job_id = submit(api, code, marks, "forever", time_limit_s=1.0)
    job = wait_for(state_is(api, job_id, "failed", "succeeded"), "the time limit")
    assert (job["state"], job["reason"]) == ("failed", "stopped at its time limit")


def test_cancel_stops_a_running_job(api: ShamalClient, code: Path, marks: Path) -> None:
    job_id = submit(api, code, marks, "forever")
    wait_for(lambda: (marks / "running-1").exists(), "the job to run")
    pid = job_command_pid(job_id, 1)
    assert api.cancel_job(job_id)["stop_request"] == "cancel"
    job = wait_for(state_is(api, job_id, "cancelled"), "the cancellation")
    assert job["finished_at"] is not None
    wait_for(lambda: not _alive(pid), "the process to be gone", deadline_s=15)


def test_preempted_job_checkpoints_requeues_and_resumes(
    api: ShamalClient, code: Path, marks: Path
) -> None:
    job_id = submit(api, code, marks, "preemptible")
    wait_for(lambda: (marks / "running-1").exists(), "the job to run")
    api.preempt_job(job_id)
    job = wait_for(state_is(api, job_id, "succeeded"), "the resumed job to finish")
    assert (job["attempt"], job["preemptions"], job["retries_used"]) == (2, 1, 0)
    assert (marks / "checkpoint").read_text() == "saved"
    assert "checkpointed" in log_of(api, job_id, attempt=1)
    assert "resumed from checkpoint" in log_of(api, job_id, attempt=2)
    states = [e["to_state"] for e in api.job_events(job_id)]
    assert states[3:6] == ["preempted", "queued", "admitted"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_killed_server_recovers_running_jobs_without_running_them_twice(
    tmp_path: Path, code: Path, marks: Path
) -> None:
    live = LiveServer(tmp_path / "home", env=FAST).start()
    try:
        with ShamalClient(live.url, live.token) as api:
            keep = submit(api, code, marks, "wait-file")
            wait_for(lambda: (marks / "running-1").exists(), "the job to run")
        live.kill()  # SIGKILL: no shutdown code runs; the job's supervisor survives
        live.start()
        with ShamalClient(live.url, live.token) as api:
            assert api.get_job(keep)["state"] == "running"
            (marks / "go").write_text("go")
            job = wait_for(state_is(api, keep, "succeeded", "failed", "lost"), "the job")
            assert (job["state"], job["attempt"]) == ("succeeded", 1)
            assert "hello from" in log_of(api, keep)
        assert len(starts(marks)) == 1
    finally:
        with ShamalClient(live.url, live.token) as api:
            stop_all_jobs(api)
        live.stop()


def test_a_job_whose_processes_died_with_the_server_is_lost_and_retried(
    tmp_path: Path, code: Path, marks: Path
) -> None:
    live = LiveServer(tmp_path / "home", env=FAST).start()
    try:
        with ShamalClient(live.url, live.token) as api:
            job_id = submit(api, code, marks, "forever", retries=1)
            wait_for(lambda: (marks / "running-1").exists(), "the job to run")
            pid = job_command_pid(job_id, 1)
        live.kill()
        # The machine "lost" the job too: its supervisor and its processes are gone.
        record = tmp_path / "home" / "jobs" / job_id / "attempt-1.log.supervisor.json"
        supervisor = int(json.loads(record.read_text())["supervisor"]["pid"])
        os.kill(supervisor, signal.SIGKILL)
        os.killpg(os.getpgid(pid), signal.SIGKILL)
        live.start()
        with ShamalClient(live.url, live.token) as api:
            wait_for(lambda: (marks / "running-2").exists(), "the retry to run")
            job = api.get_job(job_id)
            assert (job["state"], job["attempt"], job["retries_used"]) == ("running", 2, 1)
            events = [e["to_state"] for e in api.job_events(job_id)]
            assert events[3:6] == ["lost", "queued", "admitted"]
    finally:
        with ShamalClient(live.url, live.token) as api:
            stop_all_jobs(api)
        live.stop()


@pytest.mark.postgres
def test_two_scheduler_processes_never_run_a_job_twice(
    tmp_path: Path, code: Path, marks: Path, fresh_pg_url: str
) -> None:
    home = tmp_path / "home"
    cluster = tmp_path / "cluster.toml"
    cluster.write_text(
        '[[pools]]\nname = "p"\n[[pools.nodes]]\nname = "box"\ncpus = 2\nmemory_mib = 4096\n'
    )
    env = {
        **FAST,
        "SHAMAL_DATABASE_URL": fresh_pg_url,
        "SHAMAL_SCHEDULER__CLUSTER_FILE": str(cluster),
        "SHAMAL_SCHEDULER__JOB_SHARED_FOLDERS": json.dumps([str(tmp_path)]),
    }
    live = LiveServer(home, env={**env, "SHAMAL_SCHEDULER__ENABLED": "false"}).start()
    schedulers = [
        subprocess.Popen(
            [sys.executable, "-m", "shamal", "scheduler", "run", "--name", name]
            + ["--api-url", live.url],
            env={**os.environ, "SHAMAL_HOME": str(home), **env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for name in ("left", "right")
    ]
    try:
        with ShamalClient(live.url, live.token) as api:
            ids = [submit(api, code, marks, "ok", cpus=1.0) for _ in range(7)]
            ids.append(submit(api, code, marks, "whoami", cpus=1.0))  # needs a token
            finals = [
                wait_for(state_is(api, job_id, "succeeded", "failed"), "every job", 120)
                for job_id in ids
            ]
            claimed = {api.get_job(job_id)["attempt"] for job_id in ids}
            runners = {e["actor"] for job_id in ids for e in api.job_events(job_id)[1:]}
            whoami = log_of(api, ids[-1])
        assert [j["state"] for j in finals] == ["succeeded"] * 8, whoami
        assert "I am admin admin: True scope: job" in whoami
        assert claimed == {1}
        assert sorted(s["job"] for s in starts(marks)) == sorted(ids)  # each ran once
        assert runners <= {"scheduler:left", "scheduler:right"}
    finally:
        for process in schedulers:
            process.send_signal(signal.SIGTERM)
        for process in schedulers:
            process.wait(timeout=30)
        live.stop()


def test_the_cli_submits_follows_and_reports(
    server: LiveServer, code: Path, marks: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from shamal.cli import app

    monkeypatch.setenv("SHAMAL_URL", server.url)
    monkeypatch.setenv("SHAMAL_TOKEN", server.token)
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.chdir(code)
    cli = CliRunner()
    submitted = cli.invoke(
        app,
        [
            "job",
            "submit",
            "--cpus",
            "0.5",
            "--memory",
            "64MiB",
            "--time-limit",
            "5m",
            "--json",
            "--name",
            "from-cli",
            "--",
            "python",
            "job.py",
            str(marks),
            "ok",
        ],
    )
    assert submitted.exit_code == 0, submitted.output
    job = json.loads(submitted.output)
    assert (job["name"], job["memory_mib"], job["time_limit_s"]) == ("from-cli", 64, 300.0)
    followed = cli.invoke(app, ["job", "logs", "-f", "--interval", "0.1", job["id"][:10]])
    assert followed.exit_code == 0, followed.output
    assert f"hello from {job['id']} attempt 1" in followed.output
    shown = json.loads(cli.invoke(app, ["job", "show", "--json", job["id"]]).output)
    assert shown["state"] == "succeeded"
    assert [e["to_state"] for e in shown["events"]][-1] == "succeeded"
    listed = cli.invoke(app, ["job", "list", "--state", "succeeded"])
    assert "from-cli" in listed.output
    report = tmp_path / "cost.csv"
    costed = cli.invoke(
        app, ["cost", "report", "--by", "user", "--since", "1d", "--csv", str(report)]
    )
    assert costed.exit_code == 0, costed.output
    rows = report.read_text().splitlines()
    assert rows[0].startswith("user,jobs,attempts,gpu_seconds")
    assert rows[1].startswith("admin,1,1,0.000,")
    default = cli.invoke(app, ["cost", "report", "--since", "1d"])  # by team, CSV here
    assert default.exit_code == 0, default.output
    (written,) = code.glob("cost-by-team-*.csv")
    assert written.read_text().splitlines()[0].startswith("team,jobs,attempts")
    written.unlink()
    bad = cli.invoke(app, ["job", "submit", "--memory", "lots", "--", "true"])
    assert bad.exit_code == 1
    assert "--memory takes sizes" in bad.output


def test_a_higher_priority_job_preempts_and_the_victim_resumes(
    tmp_path: Path, code: Path, marks: Path
) -> None:
    cluster = tmp_path / "cluster.toml"
    cluster.write_text(
        '[[pools]]\nname = "one"\n[[pools.nodes]]\nname = "box"\ncpus = 1\nmemory_mib = 1024\n'
    )
    env = {
        **FAST,
        "SHAMAL_SCHEDULER__CLUSTER_FILE": str(cluster),
        "SHAMAL_SCHEDULER__POLICY_OPTIONS": '{"min_run_s": 0}',
    }
    with LiveServer(tmp_path / "home", env=env) as live, ShamalClient(live.url, live.token) as api:
        try:
            run_preemption(api, code, marks)
        finally:
            stop_all_jobs(api)


def run_preemption(api: ShamalClient, code: Path, marks: Path) -> None:
    low = submit(api, code, marks, "preemptible", cpus=1.0, priority="low")
    wait_for(lambda: (marks / "running-1").exists(), "the low-priority job to run")
    high = submit(api, code, marks, "ok", cpus=1.0, priority="high")
    done = wait_for(state_is(api, high, "succeeded", "failed"), "the high-priority job")
    assert done["state"] == "succeeded"
    resumed = wait_for(state_is(api, low, "succeeded", "failed"), "the victim to resume")
    assert (resumed["state"], resumed["preemptions"], resumed["attempt"]) == ("succeeded", 1, 2)
    order = [(s["job"], s["attempt"]) for s in starts(marks)]
    assert order == [(low, "1"), (high, "1"), (low, "2")]  # never two at once on 1 CPU
    low_events = api.job_events(low)
    assert any(e["to_state"] == "preempted" for e in low_events)
