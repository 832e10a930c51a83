"""`shamal job` and `shamal cost` against a real server whose cluster declares GPUs.

The flags are the ones the scheduler issue lists, typed as a user would; the jobs run
with the local executor (declared nodes stand for machines NVML cannot see). Jobs wait
for a marker file, so a test decides when each one ends; states are polled with a
deadline.
"""

from __future__ import annotations

import csv
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from typer.testing import CliRunner, Result

from shamal.cli import app
from shamal.client import ShamalClient
from shamal.errors import NotFound
from tests.jobs.test_scheduling import stop_all_jobs
from tests.live import LiveServer, exchange_folder
from tests.polling import wait_for

pytestmark = pytest.mark.slow

CLUSTER = """
[[pools]]
name = "gpu"
# One GPU-hour costs 3600: a team's cost is its GPU-seconds, to the cent.
labels = { cost_per_gpu_hour = "3600" }
[[pools.nodes]]
name = "g1"
cpus = 4
memory_mib = 16384
[[pools.nodes.gpus]]
model = "A100-80GB"
memory_mib = 81920
count = 2
[[pools.nodes.gpus]]
model = "A100-80GB"
memory_mib = 81920
mig_slices = 7

[[pools]]
name = "cpu"
[[pools.nodes]]
name = "c1"
cpus = 2
memory_mib = 8192
"""

JOB = """
import os, sys, time
marks, name = sys.argv[1], sys.argv[2]
attempt = os.environ["SHAMAL_ATTEMPT"]
open(os.path.join(marks, f"running-{name}-{attempt}"), "w").close()
while not os.path.exists(os.path.join(marks, f"go-{name}")):
    time.sleep(0.05)
"""

NAME = "oops [/] [red]x"
"""Rich markup in a job's name (and below, in its command) must print as typed."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    home = tmp_path_factory.mktemp("home")
    cluster = home / "cluster.toml"
    cluster.write_text(CLUSTER)
    env = {
        "SHAMAL_SCHEDULER__TICK_S": "0.2",
        "SHAMAL_SCHEDULER__GRACE_S": "5",
        "SHAMAL_SCHEDULER__CLUSTER_FILE": str(cluster),
    }
    with LiveServer(home, env=env) as live:
        yield live


@pytest.fixture
def api(server: LiveServer) -> Iterator[ShamalClient]:
    with ShamalClient(server.url, server.token) as client:
        try:
            yield client
        finally:
            stop_all_jobs(client)


@pytest.fixture
def code(tmp_path: Path) -> Path:
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "job.py").write_text(JOB)
    return folder


@pytest.fixture
def marks(tmp_path: Path) -> Path:
    return exchange_folder(tmp_path / "marks")


@pytest.fixture
def shamal(server: LiveServer, monkeypatch: pytest.MonkeyPatch, code: Path) -> CliRunner:
    monkeypatch.setenv("SHAMAL_URL", server.url)
    monkeypatch.setenv("SHAMAL_TOKEN", server.token)
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.chdir(code)
    return CliRunner()


def run(cli: CliRunner, *args: str) -> Result:
    result = cli.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    assert result.exception is None, result.output
    return result


def in_state(api: ShamalClient, job_id: str, *states: str) -> dict[str, Any] | None:
    job = api.get_job(job_id)
    return job if job["state"] in states else None


def table_rows(output: str, first: str) -> list[list[str]]:
    """The cells of a Rich table's rows whose first cell is ``first``."""
    rows = []
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("│┃").split("│")]
        if cells and cells[0] == first:
            rows.append(cells)
    return rows


def submit_json(cli: CliRunner, *args: str) -> dict[str, Any]:
    job: dict[str, Any] = json.loads(run(cli, "job", "submit", "--json", *args).stdout)
    return job


def submit_the_jobs(cli: CliRunner, marks: Path) -> tuple[dict[str, Any], ...]:
    """A job without a team (the admin is in none yet) on a quarter of a GPU, one on a
    MIG slice that ends by itself, and the team's job with every flag of the issue."""
    shared = submit_json(
        cli, "--gpu-fraction", "0.25", "--pool", "gpu", "--cpus", "0.5", "--memory", "64MiB",
        "--name", "[bold]nb", "--", "python", "job.py", str(marks), "shared",
    )  # fmt: skip
    assert (shared["team"], shared["gpu_fraction"], shared["name"]) == ("", 0.25, "[bold]nb")
    (marks / "go-slice").touch()
    sliced = submit_json(
        cli, "--mig", "1g.10gb", "--pool", "gpu", "--cpus", "0.5", "--memory", "64MiB",
        "--", "python", "job.py", str(marks), "slice",
    )  # fmt: skip
    run(cli, "team", "create", "vision")
    job = submit_json(
        cli, "--team", "vision", "--priority", "high", "--cpus", "1", "--memory", "4GiB",
        "--gpus", "1", "--time-limit", "2h", "--retries", "2", "--pool", "gpu", "--name", NAME,
        "--", "python", "job.py", str(marks), "whole", "[/bold] hi",
    )  # fmt: skip
    expected = {
        "team": "vision",
        "priority": "high",
        "cpus": 1.0,
        "memory_mib": 4096,
        "gpus": 1,
        "time_limit_s": 7200.0,
        "max_retries": 2,
        "pool": "gpu",
        "name": NAME,
        "state": "queued",
    }
    assert {key: job[key] for key in expected} == expected
    return shared, sliced, job


def check_the_listings(cli: CliRunner, job_id: str, shared_id: str, sliced_id: str) -> None:
    listed = {item["id"]: item for item in json.loads(run(cli, "job", "list", "--json").stdout)}
    assert listed[job_id]["state"] in ("admitted", "running")
    assert listed[job_id]["resources"] == "1 CPU, 4096 MiB, 1 GPU"
    assert listed[shared_id]["resources"] == "0.5 CPU, 64 MiB, 0.25 GPU"
    assert listed[sliced_id]["resources"] == "0.5 CPU, 64 MiB, MIG 1g.10gb"
    table = run(cli, "job", "list").stdout
    assert NAME in table
    assert "[bold]nb" in table
    shown = run(cli, "job", "show", job_id[:8]).stdout
    for text in (NAME, "python job.py", "'[/bold] hi'", "vision", "high", "Transitions"):
        assert text in shown
    assert "time limit 2h\n" in shown  # as --time-limit took it


def check_the_cost_report(
    cli: CliRunner, reports: Path, whole: dict[str, Any], team_less: float
) -> None:
    """The table by team (and its CSV) against the jobs' usage: at 3600 per GPU-hour a
    team's cost is the GPU-seconds its jobs held."""
    report = run(cli, "cost", "report", "--by", "team", "--since", "7d").stdout
    (vision,) = table_rows(report, "vision")
    (nobody,) = table_rows(report, "(no team)")
    assert vision[1:3] == ["1", "2"]  # one job, two attempts
    assert float(vision[6]) == pytest.approx(whole["attained_s"], abs=0.006)
    assert nobody[1:3] == ["2", "2"]
    assert float(nobody[6]) == pytest.approx(team_less, abs=0.006)
    (written,) = reports.glob("cost-by-team-*.csv")  # the table comes with its CSV
    lines = written.read_text(encoding="utf-8").splitlines()
    rows = {row["team"]: row for row in csv.DictReader(lines)}
    assert float(rows["vision"]["gpu_seconds"]) == pytest.approx(whole["attained_s"], abs=2e-3)
    assert set(rows) == {"vision", "(no team)"}
    written.unlink()

    as_json = run(cli, "cost", "report", "--since", "7d", "--json")
    assert {line["key"] for line in json.loads(as_json.stdout)} == {"vision", "-"}
    assert list(reports.iterdir()) == []  # --json alone writes no CSV
    chosen = reports / "chosen.csv"
    run(cli, "cost", "report", "--since", "7d", "--json", "--csv", str(chosen))
    assert chosen.read_text(encoding="utf-8").startswith("team,jobs,attempts")


def test_the_job_and_cost_commands_with_the_flags_of_the_issue(
    shamal: CliRunner,
    api: ShamalClient,
    marks: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shared, sliced, job = submit_the_jobs(shamal, marks)
    job_id = job["id"]
    wait_for(lambda: (marks / "running-whole-1").exists(), "the whole-GPU job to run")
    wait_for(lambda: (marks / "running-shared-1").exists(), "the shared-GPU job to run")
    done = wait_for(lambda: in_state(api, sliced["id"], "succeeded"), "the MIG job")
    (slot,) = done["placement"]["slots"]
    assert (slot["node"], slot["mig_profile"]) == ("g1", "1g.10gb")
    check_the_listings(shamal, job_id, shared["id"], sliced["id"])

    assert "job" in run(shamal, "job", "cancel", shared["id"][:10]).stdout
    wait_for(lambda: in_state(api, shared["id"], "cancelled"), "the cancelled job to stop")
    preempting = " ".join(run(shamal, "job", "preempt", job_id[:10]).stdout.split())
    assert "preempting job" in preempting
    assert f"shamal job show {job_id[:12]}` then says what it waits for" in preempting
    wait_for(lambda: (marks / "running-whole-2").exists(), "the preempted job to run again")
    (marks / "go-whole").touch()
    finished = wait_for(lambda: in_state(api, job_id, "succeeded", "failed"), "the job to end")
    assert (finished["state"], finished["attempt"], finished["preemptions"]) == (
        "succeeded",
        2,
        1,
    )
    states = [event["to_state"] for event in api.job_events(job_id)]
    assert states == [
        "queued",
        "admitted",
        "running",
        "preempted",
        "queued",
        "admitted",
        "running",
        "succeeded",
    ]

    reports = tmp_path / "reports"
    reports.mkdir()
    monkeypatch.chdir(reports)
    slice_share = 1000 // 7 / 1000  # a 1g slice holds 1/7 of a GPU
    team_less = 0.25 * api.get_job(shared["id"])["attained_s"] + slice_share * done["attained_s"]
    check_the_cost_report(shamal, reports, finished, team_less)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            ["--gpus", "1", "--pool", "cpu"],
            "this job could never start: pool 'cpu' has no GPUs; the largest node offers "
            "2 CPUs, 8 GiB (it would fit in pool 'gpu': --pool gpu)",
        ),
        (
            ["--cpus", "999"],
            "no pool could ever hold it: 999 CPUs per worker is more than any node of pool "
            "'gpu' has",
        ),
        (["--mig", "1g.5gb", "--pool", "gpu"], "no GPU of pool 'gpu' offers MIG slice 1g.5gb"),
    ],
)
def test_a_job_that_could_never_start_is_refused_with_the_reason(
    shamal: CliRunner, api: ShamalClient, options: list[str], message: str
) -> None:
    before = api.list_jobs(limit=1000)
    result = shamal.invoke(app, ["job", "submit", "--no-snapshot", *options, "--", "true"])
    assert result.exit_code == 1, result.output
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output
    assert api.list_jobs(limit=1000) == before


def test_a_scheduler_named_with_markup_starts_and_says_so(tmp_path: Path) -> None:
    env = {**os.environ, "SHAMAL_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    name = "box [/] [red]1"
    process = subprocess.Popen(
        [sys.executable, "-m", "shamal", "scheduler", "run", "--name", name],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        lines = []
        for line in process.stdout:  # ends when the process does: no sleep needed
            lines.append(line)
            if "Ctrl-C stops it" in line:
                break
        assert f"scheduler {name} with policy" in "".join(lines), "".join(lines)[-3000:]
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)


def first_line(stream: IO[str], deadline_s: float) -> str:
    """The first line ``stream`` gives, read on a thread so that the wait has a deadline."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(stream.readline()), daemon=True).start()
    try:
        return lines.get(timeout=deadline_s)
    except queue.Empty:
        pytest.fail(f"nothing printed within {deadline_s}s")


def test_following_a_failing_job_ends_with_it_says_how_and_exits_1(
    shamal: CliRunner, api: ShamalClient, code: Path
) -> None:
    (code / "fail.py").write_text("import sys\nprint('about to fail', flush=True)\nsys.exit(3)\n")
    job = submit_json(
        shamal, "--pool", "cpu", "--cpus", "0.5", "--memory", "64MiB", "--", "python", "fail.py"
    )
    followed = shamal.invoke(app, ["job", "logs", "-f", "--interval", "0.1", job["id"][:10]])
    assert followed.exit_code == 1, followed.output
    assert "about to fail" in followed.stdout
    assert f"job {job['id'][:12]} failed (exited with code 3)" in " ".join(followed.stderr.split())
    assert api.get_job(job["id"])["state"] == "failed"


def test_following_a_queued_job_says_what_it_waits_for_and_how_it_ended(
    shamal: CliRunner, server: LiveServer, api: ShamalClient, marks: Path
) -> None:
    """The follower runs as its own process: it prints that the job waits, the test then
    cancels the job, and the follower ends with it, exiting 1."""
    holder = submit_json(
        shamal, "--pool", "cpu", "--cpus", "2", "--memory", "64MiB",
        "--", "python", "job.py", str(marks), "holder",
    )  # fmt: skip
    wait_for(lambda: (marks / "running-holder-1").exists(), "the job holding the pool to run")
    waiter = submit_json(
        shamal, "--pool", "cpu", "--cpus", "2", "--memory", "64MiB", "--", "python", "job.py"
    )
    env = {**os.environ, "SHAMAL_URL": server.url, "SHAMAL_TOKEN": server.token}
    with subprocess.Popen(
        [sys.executable, "-m", "shamal", "job", "logs", "-f", "--interval", "0.1", waiter["id"]],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    ) as follower:
        try:
            assert follower.stderr is not None
            said = first_line(follower.stderr, deadline_s=60)
            assert f"job {waiter['id'][:12]} is queued: waiting for resources" in said, said
            api.cancel_job(waiter["id"])
            rest = follower.communicate(timeout=60)[1]  # until the follower exits
        finally:
            if follower.poll() is None:
                follower.kill()
    assert follower.returncode == 1, rest
    assert f"job {waiter['id'][:12]} cancelled" in rest, rest
    api.cancel_job(holder["id"])


def test_a_snapshot_too_large_for_the_server_says_how_to_leave_data_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server whose request limits are small (as the default 16 MiB is for a folder of
    data): the refusal names the snapshot and the way out, and the way out works."""
    limits = {"SHAMAL_MAX_REQUEST_BYTES": "65536", "SHAMAL_MAX_UPLOAD_BYTES": "65536"}
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "train.py").write_text("print('training')\n")
    (folder / "data.bin").write_bytes(os.urandom(256 * 1024))  # gzip cannot shrink it
    with LiveServer(tmp_path / "home", env=limits) as live:
        monkeypatch.setenv("SHAMAL_URL", live.url)
        monkeypatch.setenv("SHAMAL_TOKEN", live.token)
        monkeypatch.setenv("COLUMNS", "250")
        monkeypatch.chdir(folder)
        cli = CliRunner()
        submit = ["job", "submit", "--cpus", "0.5", "--memory", "64MiB", "--", "python", "train.py"]
        refused = cli.invoke(app, submit)
        assert refused.exit_code == 1, refused.output
        said = " ".join(refused.output.split())
        assert f"the snapshot of {folder.resolve()} is larger than this server takes" in said
        assert "with a .gitignore" in said
        with ShamalClient(live.url, live.token) as api:
            assert api.list_jobs() == []
            (folder / ".gitignore").write_text("data.bin\n")
            job = json.loads(run(cli, *submit[:2], "--json", *submit[2:]).stdout)
            assert api.get_job(job["id"])["snapshot"] == job["snapshot"]
            stop_all_jobs(api)


QUOTAS = """
[[pools]]
name = "gpu"
[[pools.nodes]]
name = "g1"
cpus = 4
memory_mib = 16384
gpus = [{ model = "A100-80GB", memory_mib = 81920, count = 2 }]

[[quotas]]
team = "vision"
pool = "gpu"
gpus = 1
borrow_gpus = 1

[[quotas]]
team = "nlp"
pool = "gpu"
gpus = 1
"""


def test_an_admin_sees_each_teams_quota_and_what_it_borrows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: Path, marks: Path
) -> None:
    cluster = tmp_path / "cluster.toml"
    cluster.write_text(QUOTAS)
    env = {"SHAMAL_SCHEDULER__TICK_S": "0.2", "SHAMAL_SCHEDULER__CLUSTER_FILE": str(cluster)}
    with LiveServer(tmp_path / "home", env=env) as live, ShamalClient(live.url, live.token) as api:
        monkeypatch.setenv("SHAMAL_URL", live.url)
        monkeypatch.setenv("SHAMAL_TOKEN", live.token)
        monkeypatch.setenv("COLUMNS", "250")
        monkeypatch.chdir(code)
        cli = CliRunner()
        try:
            for team in ("vision", "nlp"):
                run(cli, "team", "create", team)
            for name in ("a", "b"):
                submit_json(
                    cli, "--team", "vision", "--gpus", "1", "--cpus", "0.5", "--memory", "64MiB",
                    "--", "python", "job.py", str(marks), name,
                )  # fmt: skip
            for name in ("a", "b"):
                wait_for(lambda n=name: (marks / f"running-{n}-1").exists(), f"job {name} to run")
            table = run(cli, "scheduler", "quotas").stdout
            assert table_rows(table, "gpu") == [
                ["gpu", "nlp", "default", "1 GPU", "0 GPUs", "0 GPUs", "0 GPUs", "0", "0"],
                ["gpu", "vision", "default", "1 GPU", "1 GPU", "2 GPUs", "1 GPU", "2", "0"],
            ]
            shown = run(cli, "team", "show", "vision").stdout
            assert "Quotas" in shown
            assert table_rows(shown, "gpu") == [
                ["gpu", "vision", "default", "1 GPU", "1 GPU", "2 GPUs", "1 GPU", "2", "0"]
            ]
            rows = json.loads(run(cli, "scheduler", "quotas", "--json").stdout)
            assert [(row["team"], row["held"]["gpus"]) for row in rows] == [
                ("nlp", 0.0),
                ("vision", 2.0),
            ]
        finally:
            stop_all_jobs(api)


def test_without_quotas_the_quotas_command_says_where_they_go(shamal: CliRunner) -> None:
    said = " ".join(run(shamal, "scheduler", "quotas").stdout.split())
    assert "no team quotas: every team may use any idle capacity" in said
    assert "SHAMAL_SCHEDULER__CLUSTER_FILE) as [[quotas]] entries" in said


KILLED = """
import os, signal, sys
if os.environ.get("RANK", "0") == sys.argv[1]:
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        (["python", "killed.py", "0"], "killed by SIGKILL"),
        (["--workers", "2", "--", "python", "killed.py", "1"], "rank 1 killed by SIGKILL"),
        (["no-such-command-here"], "exited with code 127 (command not found)"),
    ],
)
def test_a_failed_job_says_how_its_process_ended(
    shamal: CliRunner, api: ShamalClient, code: Path, command: list[str], reason: str
) -> None:
    (code / "killed.py").write_text(KILLED)
    options = ["--pool", "cpu", "--cpus", "0.5", "--memory", "64MiB"]
    job = submit_json(shamal, *options, *([] if "--" in command else ["--"]), *command)
    done = wait_for(lambda: in_state(api, job["id"], "failed", "succeeded"), "the job to end")
    assert (done["state"], done["reason"]) == ("failed", reason)
    assert f"failed ({reason})" in run(shamal, "job", "show", job["id"]).stdout


FLAKY = """
import os, sys
print("attempt", os.environ["SHAMAL_ATTEMPT"], flush=True)
sys.exit(3 if os.environ["SHAMAL_ATTEMPT"] == "1" else 0)
"""


def test_the_log_of_a_retried_job_says_where_the_earlier_attempts_are(
    shamal: CliRunner, api: ShamalClient, code: Path
) -> None:
    (code / "flaky.py").write_text(FLAKY)
    job = submit_json(
        shamal, "--pool", "cpu", "--cpus", "0.5", "--memory", "64MiB", "--retries", "1",
        "--", "python", "flaky.py",
    )  # fmt: skip
    done = wait_for(lambda: in_state(api, job["id"], "succeeded", "failed"), "the retried job")
    assert (done["state"], done["attempt"]) == ("succeeded", 2)
    latest = run(shamal, "job", "logs", job["id"])
    assert "attempt 2" in latest.stdout
    assert "attempt 1" not in latest.stdout
    assert (
        f"--- attempt 2 (earlier ones: shamal job logs --attempt N {job['id'][:12]}, "
        "N from 1 to 1) ---" in " ".join(latest.stderr.split())
    )
    earlier = run(shamal, "job", "logs", "--attempt", "1", job["id"])
    assert "attempt 1" in earlier.stdout
    assert "--- attempt" not in earlier.stderr


def test_team_show_still_shows_the_team_when_its_quotas_cannot_be_read(
    shamal: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older server without the quotas route: the team and its members still print."""
    run(shamal, "team", "create", "legacy")

    def no_route(self: ShamalClient) -> list[dict[str, Any]]:
        raise NotFound("Endpoint not found: GET /api/v1/scheduler/quotas")

    monkeypatch.setattr(ShamalClient, "quotas", no_route)
    said = " ".join(run(shamal, "team", "show", "legacy").stdout.split())
    assert "legacy" in said
    assert "Members" in said
    assert "quotas not shown: Endpoint not found" in said
