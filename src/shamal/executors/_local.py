"""The ``local`` executor: every attempt as processes on this machine.

Each attempt gets one supervisor (:mod:`shamal.executors._supervise`), forked from a
zygote the executor keeps (an interpreter that has imported the supervisor once), in a
session of its own and detached from the server, that runs every worker in its own
process group. All state lives in files next to the attempt's log:

========================  ===============================================================
``<log>``                 the workers' output (``[rank N] `` prefixes for gangs)
``<log>.launched``        created exclusively by :meth:`LocalExecutor.launch` (at most one
                          supervisor per attempt, whoever calls)
``<log>.supervisor.json`` the supervisor's and workers' identities (pid, start time, boot)
``<log>.status.json``     the final :class:`ExitStatus`, written atomically
``<log>.preempt`` /       a stop request (with its grace period), read by the supervisor
``<log>.cancel``          when the executor sends it SIGTERM
========================  ===============================================================

So a new server process (a new :class:`LocalExecutor`) finds an attempt again from its
handle alone: it reads the status file, or finds the supervisor alive by pid *and* start
time (a reused pid is not mistaken for it), or declares the attempt lost, after
killing what is left of its workers so that a retry cannot run beside them.

Under systemd, run the server with ``KillMode=process``: the default (``control-group``)
stops the supervisors with the server, which then preempts every running job.

Limits: Linux (``/proc``, ``pidfd``); a worker that escapes its process group (calls
``setsid`` itself) is not stopped with it; the node is this machine whatever the slots'
node names say (they only shape ``LOCAL_RANK``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import subprocess  # starting the supervisor is the point
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from shamal.errors import InvalidParameter
from shamal.executors._cgroups import Limits, WorkerCgroup
from shamal.executors._env import (
    DEFAULT_PASSTHROUGH,
    MigResolver,
    clean_environment,
    compose_environment,
    gang_layout,
    platform_variables,
    slot_visible_devices,
    worker_environment,
)
from shamal.executors._isolation import (
    Account,
    Sandbox,
    jail_config,
    masked_gpu_devices,
    prepare_workdir,
    tenant_account,
)
from shamal.executors._procfs import (
    ProcessIdentity,
    atomic_write_json,
    free_port,
    kill_group_of,
    read_json,
)
from shamal.executors._protocol import (
    ExitReason,
    ExitStatus,
    Handle,
    LaunchFailed,
    LaunchSpec,
    poll_until,
)

__all__ = ["LocalExecutor"]

logger = logging.getLogger(__name__)

_SUPERVISOR_MODULE = "shamal.executors._supervise"
_MIB = 1024 * 1024


def _nvml_mig_resolver(gpu_index: int, mig_start: int, mig_profile: str) -> str | None:
    from shamal.executors._nvml import mig_device_uuid

    return mig_device_uuid(gpu_index, mig_start, mig_profile)


class _RunFiles:
    """The files of one attempt, named after its log."""

    def __init__(self, log: Path) -> None:
        self.log = log

    def _sibling(self, suffix: str) -> Path:
        return self.log.with_name(self.log.name + suffix)

    @property
    def launched(self) -> Path:
        return self._sibling(".launched")

    @property
    def supervisor(self) -> Path:
        return self._sibling(".supervisor.json")

    @property
    def status(self) -> Path:
        return self._sibling(".status.json")

    def request(self, action: str) -> Path:
        return self._sibling(f".{action}")


class LocalExecutor:
    """Runs attempts as local processes; see the module docstring.

    Thread-safe. Every call reads the truth from the attempt's files; the one thing held
    is the zygote that supervisors are forked from (a process started on the first launch,
    ended by :meth:`close` or when the executor is collected; jobs outlive it).

    Args:
        python: the interpreter that runs the supervisor (default: this one).
        cancel_grace_s: seconds between SIGTERM and SIGKILL on :meth:`cancel`.
        start_timeout_s: how long :meth:`launch` waits for the supervisor to report.
        poll_interval_s: the longest pause between two polls in :meth:`wait`.
        passthrough_env: names of the server's variables that workers inherit.
        resolve_mig: finds a MIG slot's device UUID (default: NVML on this node).
        sandbox: confine every worker (its tenant's OS user, namespaces, cgroup limits);
            ``None`` runs workers as this process's user, unconfined.
    """

    name = "local"

    def __init__(
        self,
        *,
        python: str | None = None,
        cancel_grace_s: float = 5.0,
        start_timeout_s: float = 30.0,
        poll_interval_s: float = 0.2,
        passthrough_env: Sequence[str] = DEFAULT_PASSTHROUGH,
        resolve_mig: MigResolver | None = _nvml_mig_resolver,
        sandbox: Sandbox | None = None,
    ) -> None:
        self._python = python or sys.executable
        self._cancel_grace_s = cancel_grace_s
        self._start_timeout_s = start_timeout_s
        self._poll_interval_s = poll_interval_s
        self._passthrough = tuple(passthrough_env)
        self._resolve_mig = resolve_mig
        self._sandbox = sandbox
        self._minors: dict[int, int] | None = None
        self._minors_asked = False
        self._zygote: subprocess.Popen[bytes] | None = None
        self._zygote_finalizer: (
            weakref.finalize[[subprocess.Popen[bytes]], LocalExecutor] | None
        ) = None
        self._zygote_lock = threading.Lock()

    # ------------------------------------------------------------------ launch
    def launch(self, spec: LaunchSpec) -> Handle:
        """Start the attempt's supervisor; see :meth:`Executor.launch`."""
        files = _RunFiles(spec.log_path)
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            marker = os.open(files.launched, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            logger.info("job %s attempt %d was launched already", spec.job_id, spec.attempt)
            return self._await_started(spec, files)
        os.close(marker)
        try:
            self._start_supervisor(self._plan(spec), spec.log_path)
        except BaseException:
            files.launched.unlink(missing_ok=True)  # nothing runs: a retry may launch
            raise
        return self._await_started(spec, files)

    def _gpu_minors(self) -> dict[int, int] | None:
        """NVML's GPU index -> ``/dev/nvidia<N>``, asked once."""
        if not self._minors_asked:
            from shamal.executors._nvml import gpu_minor_numbers

            self._minors = gpu_minor_numbers()
            self._minors_asked = True
        return self._minors

    def _account(self, spec: LaunchSpec) -> Account | None:
        """The OS account the attempt runs as (``None``: this process's user); its working
        folder is handed to it."""
        if self._sandbox is None:
            return None
        try:
            account = tenant_account(spec.tenant) if self._sandbox.own_users else None
            prepare_workdir(spec.workdir, account)
        except OSError as exc:
            raise LaunchFailed(f"could not prepare the job's OS account: {exc}") from None
        return account

    def _plan(self, spec: LaunchSpec) -> dict[str, Any]:
        account = self._account(spec)
        base = worker_environment(os.environ, self._passthrough)
        layout = gang_layout([slot.node for slot in spec.placement.slots])
        master = ("127.0.0.1", free_port()) if spec.world_size > 1 else None
        workers = []
        for rank, slot in enumerate(spec.placement.slots):
            platform = platform_variables(
                spec.job_id,
                spec.attempt,
                rank=rank,
                world_size=spec.world_size,
                layout=layout[rank],
                master=master,
                gpu_milli=slot.gpu_milli,
            )
            override = spec.device_ids.get(rank)
            platform["CUDA_VISIBLE_DEVICES"] = slot_visible_devices(
                slot, override, self._resolve_mig
            )
            env = compose_environment(base, spec.env, platform)
            worker: dict[str, Any] = {"argv": list(spec.command), "env": env}
            if self._sandbox is not None:
                try:
                    worker["jail"] = jail_config(
                        self._sandbox,
                        workdir=str(spec.workdir),
                        account=account,
                        env=env,
                        world_size=spec.world_size,
                        masked=masked_gpu_devices(slot.gpus, self._gpu_minors()),
                    )
                except ValueError as exc:
                    raise LaunchFailed(str(exc)) from None
                worker["limits"] = asdict(
                    Limits(slot.memory_mib * _MIB, self._sandbox.pids_max, slot.cpu_milli)
                )
                worker["cgroup"] = _cgroup_name(spec.job_id, spec.attempt, rank)
            workers.append(worker)
        return {
            "job_id": spec.job_id,
            "attempt": spec.attempt,
            "workdir": str(spec.workdir),
            "disk_limit_bytes": self._sandbox.disk_mib * _MIB if self._sandbox else 0,
            "log_path": str(spec.log_path),
            "time_limit_s": spec.time_limit_s,
            "grace_s": spec.grace_s,
            "workers": workers,
        }

    def _supervisor_env(self) -> dict[str, str]:
        import shamal

        env = clean_environment(os.environ, ("PATH", "LANG", "LC_ALL", "TZ"))
        env["PYTHONPATH"] = str(Path(shamal.__file__).resolve().parents[1])
        return env

    def _start_supervisor(self, plan: dict[str, Any], log_path: Path) -> None:
        """Have the zygote fork the attempt's supervisor. The plan (which may hold the job's
        tokens) travels on a pipe, never on disk.

        Raises:
            LaunchFailed: no supervisor runs (the zygote could not start, or refused).
        """
        request = json.dumps(plan).encode() + b"\n"
        with self._zygote_lock:
            zygote = self._zygote_process()
            try:
                assert zygote.stdin is not None
                zygote.stdin.write(request)
                zygote.stdin.flush()
            except OSError:  # it died since its last answer: it started nothing of this one
                self._drop_zygote()
                zygote = self._zygote_process()
                assert zygote.stdin is not None
                zygote.stdin.write(request)
                zygote.stdin.flush()
            answer = self._answer(zygote)
            if answer is None:
                # It died with the request in hand: a supervisor may run or not, and the
                # files say which (:meth:`_await_started`); the next launch gets a new zygote.
                self._drop_zygote()
                return
        if answer != b"ok":
            raise LaunchFailed("the job's supervisor failed to start; see its log")

    def _zygote_process(self) -> subprocess.Popen[bytes]:
        """The running zygote (``_supervise --zygote``), started when there is none."""
        if self._zygote is not None and self._zygote.poll() is None:
            return self._zygote
        self._drop_zygote()
        zygote = subprocess.Popen(  # our own interpreter and module
            # -S: a supervisor needs the standard library and this package (on PYTHONPATH)
            # only; site's .pth files would cost every start.
            # -P: nor the working folder (a supervisor's lazy imports come from here only).
            [self._python, "-S", "-P", "-m", _SUPERVISOR_MODULE, "--zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd="/",
            env=self._supervisor_env(),
            start_new_session=True,
            close_fds=True,
        )
        self._zygote = zygote
        self._zygote_finalizer = weakref.finalize(self, _stop_zygote, zygote)
        if self._answer(zygote) != b"ready":
            self._drop_zygote()
            raise LaunchFailed("the job's supervisor failed to start")
        return zygote

    def _answer(self, zygote: subprocess.Popen[bytes]) -> bytes | None:
        """The zygote's next answer line; None when it ended or said nothing in time."""
        assert zygote.stdout is not None
        ready, _, _ = select.select([zygote.stdout], [], [], self._start_timeout_s)
        if not ready:
            return None
        line = zygote.stdout.readline()
        return line.strip() if line.endswith(b"\n") else None

    def _drop_zygote(self) -> None:
        if self._zygote_finalizer is not None:
            self._zygote_finalizer()  # stops it; runs once
        self._zygote = None
        self._zygote_finalizer = None

    def _await_started(self, spec: LaunchSpec, files: _RunFiles) -> Handle:
        deadline = time.monotonic() + self._start_timeout_s
        delay = 0.005
        while True:
            ready = read_json(files.supervisor)
            if ready is not None and _started_or_gone(ready, files):
                return Handle(
                    executor=self.name,
                    job_id=spec.job_id,
                    attempt=spec.attempt,
                    log_path=spec.log_path,
                    data={
                        "supervisor": ready["supervisor"],
                        "world_size": spec.world_size,
                        "grace_s": spec.grace_s,
                    },
                )
            if time.monotonic() >= deadline:
                raise LaunchFailed("the job's supervisor did not report in time")
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    # ------------------------------------------------------------------ observe
    def poll(self, handle: Handle) -> ExitStatus | None:
        """See :meth:`Executor.poll`."""
        files, supervisor = self._open(handle)
        status = _read_status(files)
        if status is not None:
            return status
        if supervisor.is_alive():
            return None
        status = _read_status(files)  # it may have written it just before exiting
        if status is not None:
            return status
        return self._declare_lost(handle, files)

    def wait(self, handle: Handle, timeout: float | None = None) -> ExitStatus | None:
        """See :meth:`Executor.wait`."""
        return poll_until(
            self.poll, handle, timeout, first_delay=0.01, max_delay=self._poll_interval_s
        )

    def reattach(self, handle_json: str) -> Handle | None:
        """See :meth:`Executor.reattach`."""
        handle = Handle.from_json(handle_json)
        status = self.poll(handle)
        if status is not None and status.reason is ExitReason.LOST:
            return None
        return handle

    # ------------------------------------------------------------------ control
    def preempt(self, handle: Handle, grace_s: float | None = None) -> None:
        """See :meth:`Executor.preempt`; returns once the supervisor has the request."""
        grace = float(handle.data.get("grace_s", 30.0)) if grace_s is None else grace_s
        self._request(handle, "preempt", grace)

    def cancel(self, handle: Handle) -> None:
        """See :meth:`Executor.cancel`."""
        self._request(handle, "cancel", self._cancel_grace_s)

    def close(self) -> None:
        """Stop the zygote (supervisors it started run on, on their own)."""
        with self._zygote_lock:
            self._drop_zygote()

    def _request(self, handle: Handle, action: str, grace_s: float) -> None:
        files, supervisor = self._open(handle)
        if files.status.exists():
            return
        atomic_write_json(files.request(action), {"grace_s": max(grace_s, 0.0)})
        _signal(supervisor, signal.SIGTERM)

    # ------------------------------------------------------------------ helpers
    def _open(self, handle: Handle) -> tuple[_RunFiles, ProcessIdentity]:
        if handle.executor != self.name:
            raise InvalidParameter(f"a {handle.executor!r} handle given to the local executor")
        try:
            supervisor = ProcessIdentity.from_dict(handle.data["supervisor"])
        except (KeyError, TypeError, ValueError):
            raise InvalidParameter("the handle does not name a supervisor") from None
        return _RunFiles(handle.log_path), supervisor

    def _declare_lost(self, handle: Handle, files: _RunFiles) -> ExitStatus:
        """Kill the remains of an attempt whose supervisor vanished; record it lost."""
        ready = read_json(files.supervisor) or {}
        for worker in ready.get("workers", []):
            with contextlib.suppress(KeyError, TypeError, ValueError):
                if kill_group_of(ProcessIdentity.from_dict(worker), signal.SIGKILL):
                    logger.warning(
                        "job %s attempt %d: killed orphaned rank %s",
                        handle.job_id,
                        handle.attempt,
                        worker.get("rank"),
                    )
        world_size = int(handle.data.get("world_size", 1))
        for rank in range(world_size):  # what left its process group, and the cgroup itself
            leftover = WorkerCgroup.existing(_cgroup_name(handle.job_id, handle.attempt, rank))
            if leftover is not None:
                leftover.remove()
        status = ExitStatus(
            ExitReason.LOST, (None,) * world_size, False, None, "the supervisor vanished"
        )
        files.status.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(files.status, {**status.to_dict(), "finished_at": time.time()})
        logger.warning("job %s attempt %d is lost", handle.job_id, handle.attempt)
        return status


def _stop_zygote(zygote: subprocess.Popen[bytes]) -> None:
    """End a zygote: its input ends, so it does; killed if it lingers."""
    with contextlib.suppress(OSError):
        if zygote.stdin is not None:
            zygote.stdin.close()
    try:
        zygote.wait(timeout=5)
    except subprocess.TimeoutExpired:
        zygote.kill()
        zygote.wait()
    if zygote.stdout is not None:
        zygote.stdout.close()


def _cgroup_name(job_id: str, attempt: int, rank: int) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in job_id)
    return f"{safe}-{attempt}-r{rank}"


def _started_or_gone(ready: dict[str, Any], files: _RunFiles) -> bool:
    """The supervisor started every worker, or ended, or died before it could."""
    if ready.get("state") == "running" or files.status.exists():
        return True
    try:
        return not ProcessIdentity.from_dict(ready["supervisor"]).is_alive()
    except (KeyError, TypeError, ValueError):
        return False


def _read_status(files: _RunFiles) -> ExitStatus | None:
    data = read_json(files.status)
    if data is None:
        return None
    try:
        return ExitStatus.from_dict(data)
    except ValueError:
        logger.error("unreadable status file %s", files.status)
        return ExitStatus(ExitReason.LOST, detail="unreadable status file")


def _signal(process: ProcessIdentity, sig: int) -> bool:
    """Signal ``process`` if it is still that process (a pidfd closes the reuse race)."""
    try:
        pidfd = os.pidfd_open(process.pid)
    except ProcessLookupError:
        return False
    except OSError:  # a kernel without pidfds (< 5.3): check, then signal by pid
        if not process.is_alive():
            return False
        os.kill(process.pid, sig)
        return True
    try:
        if not process.is_alive():
            return False
        signal.pidfd_send_signal(pidfd, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(pidfd)
