"""A hostile tenant's jobs against a real server: what issue 18's attacker did, tried again.

A member of team blue once ran ``cat ../../../token`` in a job and got the admin token,
re-signed the audit chain with the key next to it, read team red's job log and job token,
and killed red's job. Here a blue job tries each of those (and the rest of section 12 of
the hostile-input catalogue that a job can try on its own) while a red job runs, and
reports what it saw; the server's scheduler runs both, confined, as ``shamal-blue`` and
``shamal-red``.
"""

from __future__ import annotations

import json
import os
import pwd
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shamal.client import ShamalClient
from shamal.config import Settings
from shamal.errors import InvalidParameter
from shamal.scheduler.live._thread import job_sandbox
from tests import needs
from tests.jobs.test_scheduling import FAST, state_is, stop_all_jobs
from tests.live import LiveServer, exchange_folder, job_command_pid
from tests.polling import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _as_root() -> None:
    needs.root("a user per team needs root")


DENIED = {"PermissionError", "FileNotFoundError", "ProcessLookupError", "NotADirectoryError"}

VICTIM = """
import os, socket, sys, time
exchange = sys.argv[1]
open("secret.txt", "w").write("red's secret")
service = socket.create_server(("127.0.0.1", 0))  # a debug port, say
open(os.path.join(exchange, "red-port"), "w").write(str(service.getsockname()[1]))
open(os.path.join(exchange, "red-running"), "w").close()
while not os.path.exists(os.path.join(exchange, "done")):
    time.sleep(0.05)
"""

ATTACKER = """
import json, os, signal, socket, sqlite3, sys, urllib.error, urllib.request
exchange = sys.argv[1]
api = os.environ["SHAMAL_URL"]
t = json.load(open(os.path.join(exchange, "targets.json")))
def probe(action):
    try:
        return {"outcome": "ok", "value": repr(action())[:300]}
    except Exception as exc:
        return {"outcome": type(exc).__name__}
def call(path, token=None, method="GET"):
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = "Bearer " + token
    body = b'{"name": "stolen"}' if method == "POST" else None
    request = urllib.request.Request(api + path, headers=headers, method=method, data=body)
    try:
        return urllib.request.urlopen(request, timeout=10).status
    except urllib.error.HTTPError as exc:
        return exc.code
token = os.environ["SHAMAL_TOKEN"]
def rewrite_audit():
    db = sqlite3.connect(f"file:{t['database']}?mode=rw", uri=True)
    db.execute("UPDATE audit_log SET action = 'nothing'")
    db.commit()
seen = {
    "user": os.getuid(),
    "admin_token": probe(lambda: open(t["token"]).read()),
    "admin_token_relative": probe(lambda: open(os.path.relpath(t["token"])).read()),
    "key_ring": probe(lambda: os.listdir(t["keys"])),
    "audit_key": probe(lambda: open(t["audit_key"], "rb").read()),
    "master_key": probe(lambda: open(t["master_key"], "rb").read()),
    "database": probe(lambda: open(t["database"], "rb").read(64)),
    "rewrite_audit": probe(rewrite_audit),
    "server_environ": probe(lambda: open(f"/proc/{t['server_pid']}/environ").read()),
    "red_folder": probe(lambda: os.listdir(t["red_folder"])),
    "red_secret": probe(lambda: open(os.path.join(t["red_folder"], "secret.txt")).read()),
    "red_log": probe(lambda: open(t["red_log"]).read()),
    "red_environ": probe(lambda: open(f"/proc/{t['red_pid']}/environ").read()),
    "kill_red": probe(lambda: os.kill(t["red_pid"], signal.SIGKILL)),
    "stop_red": probe(lambda: os.kill(t["red_pid"], signal.SIGSTOP)),
    "artifacts": probe(lambda: os.listdir(t["artifacts"])),
    "database_port": probe(lambda: socket.create_connection(("127.0.0.1", 5432), 2).close()),
    "red_service": probe(lambda: socket.create_connection(("127.0.0.1", t["red_port"]), 2)),
    "api_health": call("/health"),
    "api_without_token": call("/api/v1/whoami"),
    "api_as_itself": call("/api/v1/whoami", token),
    "red_job": call("/api/v1/jobs/" + t["red_job"], token),
    "mint_token": call("/api/v1/tokens", token, "POST"),
}
seen["kill_all"] = probe(lambda: os.kill(-1, signal.SIGKILL))
json.dump(seen, open(os.path.join(exchange, "report.json"), "w"))
"""

HOG = """
chunks = [bytearray(16 * 1024 * 1024) for _ in range(32)]
print("still here")
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with LiveServer(tmp_path / "home", env=FAST) as live:
        yield live


@pytest.fixture
def api(server: LiveServer) -> Iterator[ShamalClient]:
    with ShamalClient(server.url, server.token) as client:
        for team in ("red", "blue"):
            client.create_team(team)
        try:
            yield client
        finally:
            stop_all_jobs(client)


@pytest.fixture
def mallory(server: LiveServer, api: ShamalClient) -> Iterator[ShamalClient]:
    """A member of team blue, and of no other team."""
    api.create_user("mallory")
    api.set_member("blue", "mallory", "member")
    secret = api.create_token("laptop", user="mallory")["secret"]
    with ShamalClient(server.url, secret) as client:
        yield client


def submit(api: ShamalClient, folder: Path, script: str, team: str, *args: str) -> str:
    folder.mkdir()
    (folder / "job.py").write_text(script)
    digest = api.upload_snapshot(folder)
    job = api.submit_job(
        ["python", "job.py", *args], snapshot=digest, team=team, cpus=0.5, memory_mib=128
    )
    return str(job["id"])


def test_a_tenants_job_reaches_no_secret_of_the_server_and_nothing_of_another_team(
    server: LiveServer, api: ShamalClient, mallory: ShamalClient, tmp_path: Path
) -> None:
    exchange = exchange_folder(tmp_path / "exchange")
    red = submit(api, tmp_path / "red", VICTIM, "red", str(exchange))
    wait_for(lambda: (exchange / "red-running").exists(), "red's job to run")
    red_pid = job_command_pid(red, 1)
    home = server.home
    assert server.process is not None
    targets: dict[str, Any] = {
        "token": str(home / "token"),
        "keys": str(home / "keys"),
        "audit_key": str(home / "keys" / "audit.key"),
        "master_key": str(home / "keys" / "master.json"),
        "database": str(home / "shamal.db"),
        "artifacts": str(home / "artifacts"),
        "server_pid": server.process.pid,
        "red_folder": os.readlink(f"/proc/{red_pid}/cwd"),
        "red_log": str(home / "jobs" / red / "attempt-1.log"),
        "red_pid": red_pid,
        "red_port": int((exchange / "red-port").read_text()),
        "red_job": red,
    }
    for path in ("token", "audit_key", "database", "red_log"):
        assert Path(targets[path]).exists(), path  # each target is real
    (exchange / "targets.json").write_text(json.dumps(targets))
    blue = submit(mallory, tmp_path / "blue", ATTACKER, "blue", str(exchange))
    job = wait_for(state_is(api, blue, "succeeded", "failed"), "blue's job to end")
    assert job["state"] == "succeeded", api.job_log(blue)
    seen = json.loads((exchange / "report.json").read_text())

    assert seen["user"] == pwd.getpwnam("shamal-blue").pw_uid
    for probe in (
        "admin_token",
        "admin_token_relative",
        "audit_key",
        "master_key",
        "database",
        "rewrite_audit",
        "server_environ",
        "red_secret",
        "red_folder",
        "red_log",
        "red_environ",
        "kill_red",
        "stop_red",
        "database_port",
        "red_service",
    ):
        assert seen[probe]["outcome"] in DENIED | {"OperationalError", "ConnectionRefusedError"}, (
            probe,
            seen[probe],
        )
    # Its one way out is the platform's API, which holds it to its token's scope.
    assert (seen["api_health"], seen["api_without_token"], seen["api_as_itself"]) == (200, 401, 200)
    assert (seen["red_job"], seen["mint_token"]) == (404, 403)
    for folder in ("key_ring", "artifacts"):  # an empty folder hides them, or none at all
        assert seen[folder] in ({"outcome": "ok", "value": "[]"}, {"outcome": "FileNotFoundError"})
    report = (exchange / "report.json").read_text()
    assert server.token not in report
    assert "red's secret" not in report

    # Red's job ran on untouched, and ends as it means to.
    assert api.get_job(red)["state"] == "running"
    (exchange / "done").write_text("")
    assert wait_for(state_is(api, red, "succeeded", "failed"), "red's job")["state"] == "succeeded"
    assert api.verify_audit()["ok"] is True


def test_a_job_over_its_memory_request_fails_out_of_memory(
    server: LiveServer, api: ShamalClient, tmp_path: Path
) -> None:
    job_id = submit(api, tmp_path / "hog", HOG, "red")
    job = wait_for(state_is(api, job_id, "succeeded", "failed"), "the job to end")
    assert (job["state"], job["reason"]) == ("failed", "out of memory")
    assert "still here" not in api.job_log(job_id)
    assert "limits: cgroup" in server.log.read_text()  # the mode in use, said at start


def test_jobs_never_run_as_root_nor_as_the_servers_user_unasked(tmp_path: Path) -> None:
    def settings(**scheduler: Any) -> Settings:
        return Settings(home=tmp_path / "home", scheduler=scheduler)

    with pytest.raises(InvalidParameter, match="needs the scheduler to run as root"):
        job_sandbox(settings(), euid=1000)
    with pytest.raises(InvalidParameter, match="jobs would run as root"):
        job_sandbox(settings(run_jobs_as="server-user"), euid=0)
    with pytest.raises(InvalidParameter, match="unconfined"):
        job_sandbox(settings(sandbox=False), euid=0)
    assert job_sandbox(settings(run_jobs_as="server-user", sandbox=False), euid=1000) is None
    sandbox = job_sandbox(settings(), euid=0)
    assert sandbox is not None
    assert sandbox.own_users
    assert str(tmp_path / "home") in sandbox.hide
    assert str(tmp_path / "home-jobs") in sandbox.hide


def test_job_folders_inside_the_servers_home_are_refused(tmp_path: Path) -> None:
    inside = Settings(home=tmp_path / "home", scheduler={"job_folders": tmp_path / "home" / "j"})
    with pytest.raises(InvalidParameter, match="outside SHAMAL_HOME"):
        job_sandbox(inside, euid=0)
