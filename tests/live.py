"""A real `shamal server` process for tests that need one (faults, CLI, peer clients)."""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

from shamal.db import open_database, upgrade
from shamal.executors._procfs import free_port  # below the ephemeral range

__all__ = ["LiveServer", "free_port", "migrated_sqlite"]


@functools.cache
def migrated_sqlite() -> Path:
    """A SQLite database migrated once per test process, for tests and live servers to copy
    (migrating a new file takes ~0.3 s, more under load; a copy ~1 ms). The migrations
    themselves are tested from an empty database in ``tests/test_db.py``."""
    folder = tempfile.mkdtemp(prefix="shamal-live-template-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = Path(folder) / "shamal.db"
    db = open_database(f"sqlite:///{path}")
    upgrade(db)
    db.dispose()
    return path


class _PortTaken(RuntimeError):
    """The chosen port was taken before the server could bind it."""


class LiveServer:
    """Start `python -m shamal server` with ``env`` and wait until /ready answers 200.

    On a new home with the default database (SQLite in the home), the server starts on a
    copy of :func:`migrated_sqlite`."""

    def __init__(
        self,
        home: Path,
        env: Mapping[str, str] | None = None,
        workers: int = 1,
        args: Sequence[str] = (),
    ) -> None:
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # Jobs see the folder beside the home (where the tests' exchange folders lie) and
        # nothing else of the test's: the home and the job folders stay hidden.
        shared = json.dumps([str(home.parent)])
        self.env = {
            **os.environ,
            "SHAMAL_HOME": str(home),
            "SHAMAL_SCHEDULER__JOB_SHARED_FOLDERS": shared,
            **(env or {}),
        }
        self.workers = workers
        self.args = tuple(args)
        self.process: subprocess.Popen[bytes] | None = None
        self.log = home / f"server-{self.port}.log"

    def start(self, deadline_s: float | None = None) -> LiveServer:
        """Start and wait until ready (within ``deadline_s``: by default 60 s, and 180 s for
        several workers, each of which imports every domain before it answers; under a
        loaded machine that took over a minute). The port was free when chosen, but another
        process (a test in another worker) may take it first: then try another, up to 3
        times."""
        if deadline_s is None:
            deadline_s = 60.0 if self.workers == 1 else 180.0
        tries = 3
        while True:
            try:
                return self._start(deadline_s)
            except _PortTaken:
                tries -= 1
                if not tries:
                    raise
                self.port = free_port()
                self.url = f"http://127.0.0.1:{self.port}"

    def _start(self, deadline_s: float) -> LiveServer:
        self.home.mkdir(parents=True, exist_ok=True)
        self._copy_migrated()
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "shamal",
                    "server",
                    "--port",
                    str(self.port),
                    "--workers",
                    str(self.workers),
                    *self.args,
                ],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self.process.poll() is not None:
                told = self.log.read_text()[-3000:]
                if "Address already in use" in told:
                    raise _PortTaken(told)
                raise RuntimeError(f"server exited early:\n{told}")
            try:
                if httpx.get(f"{self.url}/ready", timeout=1.0).status_code == 200 and self._ours():
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)  # polling with a deadline, not synchronising on a sleep
        self.stop()
        raise RuntimeError(f"server did not become ready:\n{self.log.read_text()[-3000:]}")

    def _copy_migrated(self) -> None:
        """Put a migrated database where the server's default one goes, when it would make
        a new one there (the server migrates it to head all the same: nothing to do)."""
        if self.env.get("SHAMAL_DATABASE_URL"):
            return
        target = Path(self.env["SHAMAL_HOME"]) / "shamal.db"
        if target.exists():
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(migrated_sqlite(), target)

    def _ours(self) -> bool:
        """The server on the port is this one: it takes the token written in our home (a
        server of another test would refuse it)."""
        token = self.home / "token"
        if not token.exists():
            return False
        headers = {"Authorization": f"Bearer {token.read_text().strip()}"}
        return httpx.get(f"{self.url}/api/v1/whoami", headers=headers, timeout=1.0).is_success

    @property
    def token(self) -> str:
        return (self.home / "token").read_text().strip()

    def kill(self) -> None:
        """SIGKILL the whole process group: no shutdown code runs."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (graceful drain) and wait; returns the exit code."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    def __enter__(self) -> LiveServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def exchange_folder(path: Path) -> Path:
    """Make ``path``, a folder that a test and its jobs both write: jobs run as an OS
    user of their team's, not the test's, so it is writable by all, and the folders
    above it (pytest makes them 0700) may be entered (not listed) by all."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o777)
    for parent in path.parents:
        if parent in (Path("/"), Path(tempfile.gettempdir())):
            break
        parent.chmod(parent.stat().st_mode | stat.S_IXOTH)
    return path


def job_command_pid(job_id: str, attempt: int) -> int:
    """The host pid of a running job attempt's command. The job cannot tell it (its PID
    namespace numbers it 2): it is the process with the attempt's variables that runs as
    another OS user than the test's (the jail's own processes run as ours) inside a PID
    namespace of its own (its network relay, the job's user too, stays outside)."""
    wanted = {f"SHAMAL_JOB_ID={job_id}".encode(), f"SHAMAL_ATTEMPT={attempt}".encode()}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = set((entry / "environ").read_bytes().split(b"\0"))
            status = (entry / "status").read_text()
            uid = int(status.split("\nUid:")[1].split()[0])
            nested = status.split("\nNSpid:")[1].split("\n")[0].split()[1:] == ["2"]
        except (OSError, IndexError, ValueError):
            continue
        if wanted <= environ and uid != os.getuid() and nested:
            return int(entry.name)
    raise LookupError(f"no process of job {job_id} attempt {attempt}")
