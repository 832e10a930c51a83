"""Server processes for the benchmarks: Shamal, a stock `mlflow server`, and their databases.

Each server runs in its own process group with its log in a file, so that a benchmark can stop
everything it started (SIGTERM, then SIGKILL after a deadline) and show the last lines of a log
when a request fails. Nothing here sleeps except the polls for readiness and for a quiet
process group, which have deadlines.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
MLFLOW_VERSION = "3.17.2"
MLFLOW_VENV = REPO / "bench" / ".mlflow-venv"
PG_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
PG_HOST = "postgres@127.0.0.1:5432"

# Both servers and the client run with the same switches: no usage telemetry leaves the machine.
QUIET_ENV = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}

Say = Callable[[str], None]


def free_port() -> int:
    """A TCP port on loopback that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class ServerProcess:
    """One server command in its own process group, logging to ``log``.

    Args:
        name: what the tables call it ("Shamal", "MLflow").
        argv: the command line; ``env`` is added to this process's environment.
        ready_path: the path that answers 200 once the server takes requests.
    """

    name: str
    argv: Sequence[str]
    env: Mapping[str, str]
    log: Path
    port: int
    ready_path: str
    token_file: Path | None = None
    token: str | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, deadline_s: float = 180.0) -> None:
        """Start the command and poll ``ready_path`` until it answers 200.

        Raises:
            RuntimeError: the process exited, or was not ready within ``deadline_s``.
        """
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                list(self.argv),
                env={**os.environ, **QUIET_ENV, **self.env},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        end = time.monotonic() + deadline_s
        with httpx.Client(timeout=2.0) as http:
            while time.monotonic() < end:
                if self.process.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"{self.name} exited early:\n{self.log_tail()}")
                try:
                    if http.get(self.url + self.ready_path).status_code == 200:
                        if self.token_file is not None:
                            self.token = self.token_file.read_text().strip()
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.1)  # readiness poll, bounded by the deadline
        self.stop()
        raise RuntimeError(f"{self.name} not ready after {deadline_s:.0f} s:\n{self.log_tail()}")

    def settle(
        self, window_s: float = 1.0, busy_share: float = 0.05, deadline_s: float = 120.0
    ) -> float:
        """Wait until the server's processes, all of them, use less than ``busy_share`` of one
        CPU over a ``window_s`` window, and return the seconds waited.

        Ready is not quiet: ``mlflow server`` answers /health while the seven job consumers
        it starts beside it still import mlflow, about 20 CPU-seconds on this machine, and a
        measurement in those seconds times the machine, not the server. Where ``/proc`` is
        missing it returns at once; past ``deadline_s`` it returns as well (the caller prints
        the wait, so a server that never settles shows).
        """
        if self.process is None or not Path("/proc").is_dir():
            return 0.0
        start = time.monotonic()
        ticks = os.sysconf("SC_CLK_TCK")
        before = _group_cpu_ticks(self.process.pid)
        while time.monotonic() - start < deadline_s:
            time.sleep(window_s)  # the window the CPU time is measured over, bounded above
            after = _group_cpu_ticks(self.process.pid)
            # A process that ended takes its ticks along: a drop is not quiet, measure again.
            if 0 <= (after - before) / ticks < busy_share * window_s:
                break
            before = after
        return time.monotonic() - start

    def pause(self) -> None:
        """Freeze every process of the server (SIGSTOP to its group) until :meth:`resume`."""
        if self.process is not None:
            _signal_group(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None:
            _signal_group(self.process.pid, signal.SIGCONT)

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the process group, then SIGKILL what is left of it after ``grace_s``."""
        if self.process is None:
            return
        process, self.process = self.process, None
        _signal_group(process.pid, signal.SIGCONT)  # a paused server takes SIGTERM only awake
        _signal_group(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)
        # A stuck leader, or workers it forked that outlived it.
        _signal_group(process.pid, signal.SIGKILL)
        process.wait()

    def log_tail(self, lines: int = 25) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def _group_cpu_ticks(pgid: int) -> int:
    """User + system CPU ticks of every live process in the process group ``pgid``."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # Fields after the command name, which may hold spaces: state is field 3 of stat(5).
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[2]) == pgid:  # pgrp
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def shamal_server(home: Path, workers: int, database_url: str | None) -> ServerProcess:
    """``python -m shamal server`` on a fresh ``SHAMAL_HOME``; the admin token is read on start."""
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {"SHAMAL_HOME": str(home)}
    if database_url:
        env["SHAMAL_DATABASE_URL"] = database_url
    return ServerProcess(
        name="Shamal",
        argv=[
            str(REPO / ".venv" / "bin" / "python"),
            "-m",
            "shamal",
            "server",
            "--port",
            str(port),
            "--workers",
            str(workers),
        ],
        env=env,
        log=home / "server.log",
        port=port,
        ready_path="/ready",
        token_file=home / "token",
    )


def mlflow_server(home: Path, workers: int, backend_uri: str | None) -> ServerProcess:
    """A stock ``mlflow server`` from :data:`MLFLOW_VENV` on ``backend_uri`` (default SQLite)."""
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    store = backend_uri or f"sqlite:///{home / 'mlflow.db'}"
    return ServerProcess(
        name="MLflow",
        argv=[
            str(MLFLOW_VENV / "bin" / "mlflow"),
            "server",
            "--backend-store-uri",
            store,
            "--artifacts-destination",
            str(home / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(workers),
        ],
        env={},
        log=home / "server.log",
        port=port,
        ready_path="/health",
    )


def replay_server(home: Path, pages: Path) -> ServerProcess:
    """``bench/_replay.py``: the recorded history pages in ``pages``, answered from memory."""
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    return ServerProcess(
        name="replay",
        argv=[sys.executable, str(REPO / "bench" / "_replay.py"), str(port), str(pages)],
        env={},
        log=home / "replay.log",
        port=port,
        ready_path="/health",
    )


def _venv_has(python: Path, code: str) -> bool:
    done = subprocess.run([str(python), "-c", code], capture_output=True, check=False)
    return done.returncode == 0


def _pip_install(python: Path, requirements: Sequence[str], say: Say) -> None:
    argv = [str(python), "-m", "pip", "install", *requirements]
    say("running: " + " ".join(argv))
    subprocess.run(argv, check=True)


def ensure_mlflow_venv(say: Say, *, postgres: bool) -> None:
    """Create :data:`MLFLOW_VENV` with ``mlflow==MLFLOW_VERSION`` when it is missing or wrong.

    With ``postgres`` the venv also needs a PostgreSQL driver (psycopg 3), which stock mlflow
    does not install.

    Raises:
        subprocess.CalledProcessError: venv creation or pip failed.
    """
    python = MLFLOW_VENV / "bin" / "python"
    if not python.exists():
        base = shutil.which("python3") or sys.executable
        say(f"creating the stock MLflow venv: {base} -m venv {MLFLOW_VENV}")
        subprocess.run([base, "-m", "venv", str(MLFLOW_VENV)], check=True)
    check = f"import mlflow.server, sys; sys.exit(mlflow.__version__ != {MLFLOW_VERSION!r})"
    if not (MLFLOW_VENV / "bin" / "mlflow").exists() or not _venv_has(python, check):
        say(f"installing mlflow=={MLFLOW_VERSION} into {MLFLOW_VENV} (a few minutes)")
        _pip_install(python, [f"mlflow=={MLFLOW_VERSION}"], say)
    if postgres and not _venv_has(python, "import psycopg"):
        say(f"installing the PostgreSQL driver psycopg into {MLFLOW_VENV}")
        _pip_install(python, ["psycopg[binary]"], say)


class PostgresDatabases:
    """Fresh PostgreSQL databases on the local server, dropped by :meth:`drop_all`."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.names: list[str] = []

    def _execute(self, sql: str, database: str | None = None) -> Any:
        import psycopg  # only the postgres backend needs it

        dsn = f"postgresql://{PG_HOST}/{database}" if database else PG_ADMIN_DSN
        with psycopg.connect(dsn, autocommit=True) as conn:
            cursor = conn.execute(sql)  # type: ignore[arg-type]  # names are ours: [a-z0-9_]
            return cursor.fetchall() if cursor.description else None

    def analyze_if_autovacuum_is_off(self) -> bool:
        """ANALYZE every database when the server's autovacuum is off, as autovacuum would
        have after the seeding (without it both servers' planners estimate from empty
        tables); returns whether it did."""
        if self._execute("SHOW autovacuum") == [("on",)]:
            return False
        for name in self.names:
            self._execute("ANALYZE", name)
        return True

    def create(self, suffix: str) -> str:
        """Create ``<prefix>_<suffix>`` and return a SQLAlchemy URL for psycopg 3."""
        name = f"{self.prefix}_{suffix}"
        self._execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self._execute(f'CREATE DATABASE "{name}"')
        self.names.append(name)
        return f"postgresql+psycopg://{PG_HOST}/{name}"

    def drop_all(self) -> None:
        while self.names:
            self._execute(f'DROP DATABASE IF EXISTS "{self.names.pop()}" WITH (FORCE)')
