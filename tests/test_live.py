"""Tests against a real server process: faults, streaming, draining, workers, the CLI."""

from __future__ import annotations

import hashlib
import io
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from shamal.cli.server import access_log_choice
from shamal.client import ShamalClient
from shamal.errors import ServiceUnavailable, ShamalError
from tests.live import LiveServer
from tests.polling import wait_for

pytestmark = pytest.mark.slow


def _rss_peak_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def server_env(request: pytest.FixtureRequest) -> dict[str, str]:
    if request.param == "sqlite":
        return {}
    return {"SHAMAL_DATABASE_URL": request.getfixturevalue("fresh_pg_url")}


def test_kill_mid_write_leaves_a_consistent_database(
    tmp_path: Path, server_env: dict[str, str]
) -> None:
    server = LiveServer(tmp_path / "home", server_env).start()
    token = server.token
    with ShamalClient(server.url, token) as admin:
        admin.create_team("fault")
    acked_teams: set[str] = set()
    acked_files: dict[str, str] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def writer(i: int) -> None:
        with ShamalClient(server.url, token, timeout=10) as client:
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    client.create_team(f"t-{i}-{n}")
                    with lock:
                        acked_teams.add(f"t-{i}-{n}")
                    data = os.urandom(64 * 1024 + n)
                    client.upload_artifact("fault", f"w{i}/f{n}.bin", io.BytesIO(data))
                    with lock:
                        acked_files[f"w{i}/f{n}.bin"] = hashlib.sha256(data).hexdigest()
                except (ServiceUnavailable, ShamalError):
                    return

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(acked_files) < 40 and time.monotonic() < deadline:
        time.sleep(0.01)  # polling progress with a deadline
    server.kill()  # SIGKILL while the writers are mid-request
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert len(acked_files) >= 40

    db_file = tmp_path / "home" / "shamal.db"
    if not server_env:
        with sqlite3.connect(db_file) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"

    with LiveServer(tmp_path / "home", server_env) as again, ShamalClient(again.url, token) as c:
        report = c.verify_audit()
        assert report["ok"], report
        teams = {t["name"] for t in c.list_teams()} - {"fault"}
        assert acked_teams <= teams  # nothing acknowledged was lost
        # Each change committed together with its audit entry: neither exists alone.
        created = {
            e["target"].removeprefix("team:")
            for e in c.audit_entries(limit=1000, action="team.create")
            if e["outcome"] == "ok"
        }
        assert created - {"fault"} == teams
        listed = {f["path"]: f["digest"] for f in c.list_artifacts("fault")}
        for path, digest in acked_files.items():
            assert listed[path] == digest
        for path, digest in listed.items():  # every index entry has its verified bytes
            body = b"".join(c.download_artifact("fault", path))
            assert hashlib.sha256(body).hexdigest() == digest


def test_large_uploads_stream_without_buffering(tmp_path: Path) -> None:
    size = 200 * 1024 * 1024
    block = os.urandom(1024 * 1024)

    class Generated(io.RawIOBase):
        """200 MB produced on the fly: the test holds only one block either."""

        def __init__(self) -> None:
            self.left = size

        def readable(self) -> bool:
            return True

        def read(self, n: int = -1) -> bytes:
            if self.left <= 0:
                return b""
            chunk = block[: min(len(block), self.left, n if n > 0 else len(block))]
            self.left -= len(chunk)
            return chunk

    expected = hashlib.sha256()
    for _ in range(size // len(block)):
        expected.update(block)
    with LiveServer(tmp_path / "home") as server, ShamalClient(server.url, server.token) as c:
        assert server.process is not None
        c.create_team("big")
        before = _rss_peak_kib(server.process.pid)
        stored = c.upload_artifact("big", "blob.bin", Generated())  # type: ignore[arg-type]
        assert stored["size"] == size
        assert stored["digest"] == expected.hexdigest()
        got = hashlib.sha256()
        for chunk in c.download_artifact("big", "blob.bin"):
            got.update(chunk)
        assert got.hexdigest() == expected.hexdigest()
        growth_mib = (_rss_peak_kib(server.process.pid) - before) / 1024
    assert growth_mib < 64, f"server peak memory grew {growth_mib:.0f} MiB for a 200 MiB file"


def test_sigterm_lets_in_flight_requests_finish(tmp_path: Path) -> None:
    server = LiveServer(tmp_path / "home").start()
    sent_half = threading.Event()
    signalled = threading.Event()
    result: dict[str, object] = {}

    def body() -> Iterator[bytes]:
        for i in range(8):
            if i == 4:  # hold the rest back until the server has been told to stop
                sent_half.set()
                signalled.wait(timeout=60)
            yield b"z" * 256 * 1024

    def upload() -> None:
        with httpx.Client(
            base_url=server.url, timeout=30, headers={"Authorization": f"Bearer {server.token}"}
        ) as client:
            r = client.put("/api/v1/artifacts/drain/x.bin", content=body())
            result["status"] = r.status_code

    with ShamalClient(server.url, server.token) as c:
        c.create_team("drain")
    thread = threading.Thread(target=upload)
    thread.start()
    assert sent_half.wait(timeout=30)
    # In flight means the server is writing the body, not that the kernel has buffered it:
    # the store's temporary file shows the handler has begun.
    staging = tmp_path / "home" / "artifacts" / ".tmp"
    wait_for(lambda: staging.is_dir() and any(staging.iterdir()), "the upload to reach the store")
    assert server.process is not None
    server.process.send_signal(15)  # SIGTERM with the upload half sent
    signalled.set()
    thread.join(timeout=60)
    # uvicorn drains, then re-raises the signal it caught, which unwinds the process: exit 0.
    assert server.process.wait(timeout=60) == 0
    assert result.get("status") == 201  # the in-flight upload was finished, not cut off
    with LiveServer(tmp_path / "home") as again, ShamalClient(again.url, again.token) as c:
        assert c.list_artifacts("drain")[0]["size"] == 8 * 256 * 1024


def test_sigterm_closes_the_database_and_runs_exit_handlers(tmp_path: Path) -> None:
    """After its drain a SIGTERMed server unwinds instead of dying where it stands: its
    ``finally`` closes the database, so SQLite folds its log back and removes it, and it exits
    0. (The same unwinding runs the exit handler that stops the quickstart's model server;
    killed where it stood, the server left that child running and the log behind.)"""
    home = tmp_path / "home"
    server = LiveServer(home).start()
    with ShamalClient(server.url, server.token) as c:
        c.create_team("written")  # a commit: the log holds pages now
    wal = home / "shamal.db-wal"
    assert wal.exists()
    assert server.process is not None
    server.process.send_signal(15)
    assert server.process.wait(timeout=60) == 0
    assert not wal.exists() or wal.stat().st_size == 0, "the database was not closed"
    assert "Finished server process" in server.log.read_text()


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shamal", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=60,
        check=False,
    )


def test_cli_drives_a_live_server(tmp_path: Path) -> None:
    with LiveServer(tmp_path / "home") as server:
        env = {
            **os.environ,
            "SHAMAL_URL": server.url,
            "SHAMAL_TOKEN": server.token,
            "COLUMNS": "200",
        }
        assert _cli(env, "team", "create", "cv").returncode == 0
        listed = _cli(env, "team", "list", "--json")
        assert [t["name"] for t in json.loads(listed.stdout)] == ["cv"]
        assert _cli(env, "user", "create", "ci-bot", "--service").returncode == 0
        assert _cli(env, "team", "add-member", "cv", "ci-bot", "--role", "member").returncode == 0
        secret = _cli(env, "token", "create", "ci", "--user", "ci-bot", "-q").stdout.strip()
        bot_env = {**env, "SHAMAL_TOKEN": secret}
        assert _cli(bot_env, "team", "list", "--json").returncode == 0
        denied = _cli(bot_env, "team", "create", "nope")
        assert denied.returncode == 1
        assert "PERMISSION_DENIED" in denied.stderr
        shown = _cli(env, "team", "show", "cv")
        assert "ci-bot" in shown.stdout
        assert "member" in shown.stdout
        verify = _cli(env, "audit", "verify")
        assert verify.returncode == 0
        assert "intact" in verify.stdout
        folder = tmp_path / "model"
        (folder / "sub").mkdir(parents=True)
        (folder / "config.json").write_text('{"layers": 2}')
        (folder / "sub" / "weights.bin").write_bytes(os.urandom(3 * 1024 * 1024))
        put = _cli(env, "artifacts", "put", "cv", str(folder), "--to", "models/v1")
        assert put.returncode == 0, put.stderr
        assert "uploaded 2 file(s)" in put.stdout
        listed = json.loads(_cli(env, "artifacts", "ls", "cv", "--json").stdout)
        assert [f["path"] for f in listed] == ["models/v1/config.json", "models/v1/sub/weights.bin"]
        out = tmp_path / "w.bin"
        got = _cli(env, "artifacts", "get", "cv", "models/v1/sub/weights.bin", "-o", str(out))
        assert got.returncode == 0, got.stderr
        assert out.read_bytes() == (folder / "sub" / "weights.bin").read_bytes()
        assert _cli(env, "artifacts", "rm", "cv", "models/v1/config.json").returncode == 0
        hostile = _cli(env, "artifacts", "get", "cv", "%2e%2e/%2e%2e/etc/passwd")
        assert hostile.returncode == 1
        bad = _cli({**env, "SHAMAL_TOKEN": "shm_" + "x" * 43}, "team", "list")
        assert bad.returncode == 1
        assert "hint:" in bad.stderr
    down = _cli({**env}, "team", "list")
    assert down.returncode == 1
    assert "cannot reach Shamal" in down.stderr


def test_two_workers_answer_keep_alive_requests_without_nagle_stalls(tmp_path: Path) -> None:
    """uvicorn's pre-bound worker socket lacks TCP_NODELAY: ~44 ms per keep-alive request."""
    with (
        LiveServer(tmp_path / "home", workers=2) as server,
        httpx.Client(base_url=server.url) as client,
    ):
        latencies = []
        for _ in range(40):
            start = time.perf_counter()
            assert client.get("/health").status_code == 200
            latencies.append(time.perf_counter() - start)
    median_ms = statistics.median(latencies[5:]) * 1000
    assert median_ms < 20, f"keep-alive median {median_ms:.1f} ms: TCP_NODELAY missing?"


@pytest.mark.parametrize(
    ("args", "env", "workers", "logged"),
    [
        ((), {}, 1, True),
        (("--no-access-log",), {}, 1, False),
        (("--access-log",), {"SHAMAL_ACCESS_LOG": "false"}, 1, True),
        ((), {"SHAMAL_ACCESS_LOG": "false"}, 2, False),
    ],
    ids=["default", "flag-off", "flag-beats-env", "env-off-reaches-workers"],
)
def test_access_log_follows_the_flag_and_the_setting(
    tmp_path: Path, args: tuple[str, ...], env: dict[str, str], workers: int, logged: bool
) -> None:
    server = LiveServer(tmp_path / "home", env=env, workers=workers, args=args)
    with server:
        assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    log = server.log.read_text()
    assert "Application startup complete" in log  # the server's own log is kept either way
    assert ('"GET /health HTTP/1.1" 200' in log) is logged


@pytest.mark.parametrize(
    ("flag", "quickstart", "chosen"),
    [(None, False, None), (None, True, False), (True, True, True), (False, False, False)],
)
def test_the_quickstart_turns_the_access_log_off_unless_asked(
    flag: bool | None, quickstart: bool, chosen: bool | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SHAMAL_ACCESS_LOG", raising=False)
    assert access_log_choice(flag, quickstart=quickstart) is chosen
    monkeypatch.setenv("SHAMAL_ACCESS_LOG", "true")  # the setting, asked for explicitly
    assert access_log_choice(flag, quickstart=quickstart) is flag
