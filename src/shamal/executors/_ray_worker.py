"""One worker of a Ray attempt: the body of a named, detached Ray actor.

The actor (one per rank, in the attempt's placement-group bundle) runs the command as a
subprocess in its own process group, in a copy of the snapshot on its node, and keeps
its output (whole lines, rank-prefixed for gangs) in a file on that node for the
executor to pull. It enforces the time limit and the grace periods itself, and when
its worker fails on its own it asks its peers to stop: the gang's fate does not wait
for the server.

This module does not import ``ray`` at load time; :mod:`shamal.executors._ray` wraps
:class:`RankProcess` with ``ray.remote`` when it is first needed.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import shutil
import signal
import subprocess  # starting the job's own process is the point
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from shamal.executors._cgroups import Limits, WorkerCgroup
from shamal.executors._env import compose_environment, worker_environment
from shamal.executors._isolation import (
    Sandbox,
    confine,
    jail_config,
    masked_gpu_devices,
    prepare_workdir,
    tenant_account,
)
from shamal.executors._logs import LineFramer
from shamal.executors._nvml import gpu_minor_numbers
from shamal.executors._outcome import StopCause, stronger
from shamal.executors._procfs import free_port, kill_group

__all__ = ["RankProcess"]

logger = logging.getLogger(__name__)

_PUMP_JOIN_S = 2.0  # how long to wait for output after the process exited


class RankProcess:
    """The process of one rank; every method returns promptly (see module docs).

    Args:
        namespace: the attempt's Ray namespace.
        peers: actor names of every rank (its own included), rank order.
        rank: this actor's rank.
        placement_group: the hex id of the attempt's placement group (kept for the
            executor, which may have forgotten it).
        tmp_root: where on the node to keep the snapshot copy and the output (default:
            the node's temporary folder); removed by :meth:`terminate`.
    """

    def __init__(
        self,
        namespace: str,
        peers: Sequence[str],
        rank: int,
        placement_group: str,
        tmp_root: str | None = None,
    ) -> None:
        self._namespace = namespace
        self._placement_group = placement_group
        self._peers = list(peers)
        self._rank = rank
        self._lock = threading.RLock()
        self._out_lock = threading.Lock()
        if tmp_root is not None:
            os.makedirs(tmp_root, exist_ok=True)
        self._dir = Path(tempfile.mkdtemp(prefix="shamal-rank-", dir=tmp_root))
        self._out_path = self._dir / "output.log"
        self._out: IO[bytes] = open(self._out_path, "ab")  # noqa: SIM115 - lives with the actor
        self._prefix = f"[rank {rank}] ".encode() if len(peers) > 1 else b""
        self._framer = LineFramer(self._prefix)
        self._proc: subprocess.Popen[bytes] | None = None
        self._code: int | None = None
        self._failed_at: float | None = None
        self._cause: StopCause | None = None
        self._grace_s = 30.0
        self._term_sent = False
        self._kill_at: float | None = None
        self._timers: list[threading.Timer] = []
        self._done = threading.Event()
        self._cgroup: WorkerCgroup | None = None
        self._out_of_memory = False

    # ------------------------------------------------------------------ queries
    def node(self) -> dict[str, Any]:
        """Where this actor runs: node IP and id, and the GPU ids Ray gave it."""
        import ray

        context = ray.get_runtime_context()
        gpus = [str(g) for g in context.get_accelerator_ids().get("GPU", [])]
        return {
            "ip": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
            "node_id": context.get_node_id(),
            "gpus": gpus,
        }

    def placement_group(self) -> str:
        return self._placement_group

    def free_port(self) -> int:
        """A port free on this node's address (rank 0's: ``MASTER_PORT``)."""
        return free_port(str(self.node()["ip"]))

    def status(self) -> dict[str, Any]:
        """Exit code (``None`` while running), cause, failure time, whether output ended."""
        with self._lock:
            return {
                "exit_code": self._code,
                "cause": None if self._cause is None else self._cause.value,
                "failed_at": self._failed_at,
                "done": self._done.is_set(),
                "started": self._proc is not None or self._code is not None,
                "out_of_memory": self._out_of_memory,
            }

    def read_output(self, offset: int, max_bytes: int) -> tuple[bytes, int]:
        """Output from ``offset``: whole lines only until the stream has ended."""
        done = self._done.is_set()
        with open(self._out_path, "rb") as fh:
            fh.seek(offset)
            data = fh.read(max_bytes)
        if not done:  # lines are at most MAX_LINE long, so a chunk holds a newline
            data = data[: data.rfind(b"\n") + 1]
        return data, offset + len(data)

    # ------------------------------------------------------------------ control
    def start(
        self,
        argv: Sequence[str],
        env: Mapping[str, Mapping[str, str]],
        passthrough: Sequence[str],
        workdir: str | None,
        archive: bytes | None,
        limits: tuple[float | None, float],
        confinement: Mapping[str, Any] | None = None,
    ) -> None:
        """Start the process (idempotent). ``env`` has ``user`` and ``platform`` parts;
        ``limits`` is ``(time_limit_s, grace_s)``; ``archive`` a tar of the snapshot;
        ``confinement`` (``sandbox``, ``tenant``, ``limits``) runs it in the jail."""
        with self._lock:
            if self._proc is not None or self._done.is_set():
                return  # started already, or stopped before it could start
            self._grace_s = limits[1]
            cwd = self._unpack(archive) if archive is not None else Path(workdir or ".")
            platform = dict(env["platform"])
            platform["CUDA_VISIBLE_DEVICES"] = ",".join(self.node()["gpus"])
            full_env = compose_environment(
                worker_environment(os.environ, passthrough), env["user"], platform
            )
            try:
                command = self._confined(list(argv), cwd, confinement, full_env)
                self._proc = subprocess.Popen(  # argv, no shell
                    command,
                    cwd=cwd,
                    env=full_env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as exc:
                self._note(f"could not start: {exc.strerror}: {exc.filename}")
                self._exited(126 if isinstance(exc, PermissionError) else 127)
                self._done.set()
                return
            pump = threading.Thread(target=self._pump, name="shamal-pump", daemon=True)
            pump.start()
            threading.Thread(target=self._watch, args=(pump,), daemon=True).start()
            if limits[0] is not None:
                self._after(limits[0], self._time_limit)

    def stop(self, cause: str, grace_s: float) -> None:
        """SIGTERM the process group (once), SIGKILL after ``grace_s`` (the earliest
        deadline asked for wins). No-op once the process has exited."""
        with self._lock:
            if self._code is not None or self._done.is_set():
                return
            new = StopCause(cause)
            if stronger(self._cause, new):
                self._cause = new
            if self._proc is None:  # asked to stop before it started: it never will
                self._done.set()
                return
            if not self._term_sent:
                self._term_sent = True
                self._note(f"{new.value}: SIGTERM, grace {grace_s:g}s")
                kill_group(self._proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            if self._kill_at is None or deadline < self._kill_at:
                self._kill_at = deadline
                self._after(grace_s, self._kill)

    def terminate(self) -> None:
        """Kill whatever is left and delete this actor's files (before ``ray.kill``)."""
        with self._lock:
            for timer in self._timers:
                timer.cancel()
            if self._proc is not None:
                kill_group(self._proc.pid, signal.SIGKILL)
            if self._cgroup is not None:
                self._cgroup.remove()
        with self._out_lock:
            self._out.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    # ------------------------------------------------------------------ internals
    def _confined(
        self,
        argv: list[str],
        cwd: Path,
        confinement: Mapping[str, Any] | None,
        env: Mapping[str, str],
    ) -> list[str]:
        """``argv`` in the jail, as the tenant's user, in a cgroup with the slot's limits
        (see :mod:`shamal.executors._isolation`); ``argv`` itself without a sandbox."""
        if confinement is None:
            return argv
        sandbox = Sandbox.from_dict(confinement["sandbox"])
        # Every actor's folder on this node is hidden; this one's working folder is bound back.
        sandbox = dataclasses.replace(sandbox, hide=(*sandbox.hide, str(self._dir.parent)))
        account = tenant_account(str(confinement["tenant"])) if sandbox.own_users else None
        prepare_workdir(cwd, account)
        limits = Limits(**confinement["limits"])
        name = f"ray-{self._dir.name}"
        self._cgroup = WorkerCgroup.create(name, limits)
        config = jail_config(
            sandbox,
            workdir=str(cwd),
            account=account,
            env=env,
            world_size=len(self._peers),
            masked=masked_gpu_devices(
                [int(g) for g in self.node()["gpus"] if str(g).isdigit()], gpu_minor_numbers()
            ),
        )
        return confine(sys.executable, config, argv, cgroup=self._cgroup, limits=limits)

    def _unpack(self, archive: bytes) -> Path:
        target = self._dir / "workdir"
        target.mkdir()
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tar:
            tar.extractall(target, filter="data")
        return target

    def _after(self, delay_s: float, action: Any) -> None:
        timer = threading.Timer(max(delay_s, 0.0), action)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def _time_limit(self) -> None:
        self._note("time limit reached")
        self.stop(StopCause.TIMEOUT.value, self._grace_s)

    def _kill(self) -> None:
        with self._lock:
            if self._proc is None or self._code is not None:
                return
            if self._kill_at is not None and time.monotonic() + 0.01 < self._kill_at:
                return  # superseded by a later timer with the same deadline
            self._note("grace period over: SIGKILL")
            kill_group(self._proc.pid, signal.SIGKILL)

    def _note(self, text: str) -> None:
        # Not through the framer: the pump thread may hold half a line of the worker's.
        self._write(self._prefix + f"[shamal] {text}\n".encode())

    def _write(self, data: bytes) -> None:
        if data:
            with self._out_lock:
                if not self._out.closed:
                    self._out.write(data)
                    self._out.flush()

    def _pump(self) -> None:
        assert self._proc is not None
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while chunk := os.read(fd, 65536):
            self._write(self._framer.feed(chunk))
        self._write(self._framer.flush())

    def _watch(self, pump: threading.Thread) -> None:
        assert self._proc is not None
        code = self._proc.wait()
        kill_group(self._proc.pid, signal.SIGKILL)  # what its own children left behind
        if self._cgroup is not None:
            if self._cgroup.oom_killed():
                self._out_of_memory = True
                self._note("ran out of memory")
            self._cgroup.remove()
        self._exited(code)
        pump.join(_PUMP_JOIN_S)  # a process that escaped its group may hold the pipe
        self._done.set()

    def _exited(self, code: int) -> None:
        with self._lock:
            self._code = code
            for timer in self._timers:
                timer.cancel()
            on_its_own = code != 0 and self._cause is None
            if on_its_own:
                self._failed_at = time.time()
        if on_its_own:
            self._note(f"exited with {code}: stopping the gang")
            self._stop_peers()

    def _stop_peers(self) -> None:
        import ray

        for rank, name in enumerate(self._peers):
            if rank == self._rank:
                continue
            try:
                ray.get_actor(name, namespace=self._namespace).stop.remote(
                    StopCause.GANG.value, self._grace_s
                )
            except Exception:  # a peer that is gone is the executor's to report
                logger.warning("could not reach rank %d to stop it", rank, exc_info=True)
