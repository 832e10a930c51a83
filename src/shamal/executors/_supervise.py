"""The supervisor of one local attempt: ``python -m shamal.executors._supervise``.

It reads the attempt's plan (JSON) on stdin, detaches (forks; the first process exits
at once, so the server never holds a child that outlives it), then:

- starts every worker in its own process group (``start_new_session``) in the workdir,
  with the environment given in the plan;
- appends their output to the log, whole lines, ``[rank N] ``-prefixed for gangs, and
  its own notes as ``[shamal] ...`` lines;
- enforces the time limit, and stops the whole gang when one worker fails: SIGTERM to
  every live worker's group, the grace period, then SIGKILL;
- obeys SIGTERM (and SIGINT): the executor writes ``<log>.cancel`` or ``<log>.preempt``
  (holding the grace period) before signalling; a bare SIGTERM means preempt;
- when every worker has exited, kills what is left of their groups, and writes the
  outcome atomically to ``<log>.status.json``.

``<log>.supervisor.json`` (written before the workers start and again after) names the
supervisor and its workers by (pid, start time, boot), which is how a restarted server
finds them again, or cleans up after a supervisor that was killed.

It imports nothing heavy: it must start fast and depend on little. The local executor
keeps one ``--zygote`` process of it (:func:`zygote`) and forks each supervisor from it,
so a job pays neither an interpreter's start nor these imports.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import resource
import selectors
import signal
import subprocess  # starting the job's own processes is the point
import sys
import time
from pathlib import Path
from typing import Any

from shamal.executors import _jail as jail
from shamal.executors._cgroups import Limits, WorkerCgroup
from shamal.executors._isolation import jail_settings
from shamal.executors._logs import LineFramer
from shamal.executors._outcome import StopCause, decide_outcome, stronger
from shamal.executors._procfs import ProcessIdentity, atomic_write_json, kill_group, read_json
from shamal.executors._protocol import DISK_LIMIT, OUT_OF_MEMORY, ExitReason, ExitStatus

__all__ = ["main"]

_TICK_S = 1.0  # longest sleep of the loop: deadlines are checked at least this often
_EXITING_POLL_S = 0.005
_DRAIN_S = 2.0  # how long to read leftover output after the last worker exited
_DISK_CHECK_S = 2.0  # the shortest pause between two measures of a job's folder


def folder_bytes(folder: Path) -> int:
    """Bytes a folder's files take on disk (allocated blocks: a sparse file counts what it
    uses), without following links; what vanishes meanwhile counts nothing."""
    total = 0
    pending = [folder]
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += info.st_blocks * 512
            if entry.is_dir(follow_symlinks=False):
                pending.append(Path(entry.path))
    return total


class _Worker:
    """One rank: its process, output pipe and exit code."""

    def __init__(self, rank: int, spec: dict[str, Any], prefix: bytes) -> None:
        self.rank = rank
        self.argv = list(spec["argv"])
        self.env = dict(spec["env"])
        self.jail: dict[str, Any] | None = spec.get("jail")
        self.limits = Limits(**spec.get("limits", {}))
        self.cgroup_name = str(spec.get("cgroup", f"worker-{os.getpid()}-{rank}"))
        self.cgroup: WorkerCgroup | None = None
        self.out_of_memory = False
        self.proc: subprocess.Popen[bytes] | None = None
        self.identity: ProcessIdentity | None = None
        self.framer = LineFramer(prefix)
        self.code: int | None = None
        #: When its output ended (monotonic): it is exiting, or closed its output and runs on.
        self.eof_at: float | None = None

    @property
    def live(self) -> bool:
        return self.proc is not None and self.code is None


class Supervisor:
    """Runs one attempt's workers to the end; see the module docstring."""

    def __init__(self, plan: dict[str, Any], log_fd: int) -> None:
        self.plan = plan
        self.log_fd = log_fd
        base = Path(plan["log_path"])
        self.ready_path = base.with_name(base.name + ".supervisor.json")
        self.status_path = base.with_name(base.name + ".status.json")
        self.cancel_path = base.with_name(base.name + ".cancel")
        self.preempt_path = base.with_name(base.name + ".preempt")
        self.grace_s = float(plan["grace_s"])
        gang = len(plan["workers"]) > 1
        self.workers = [
            _Worker(r, w, f"[rank {r}] ".encode() if gang else b"")
            for r, w in enumerate(plan["workers"])
        ]
        self.sel = selectors.DefaultSelector()
        self.cause: StopCause | None = None
        self.culprit: int | None = None
        self.term_sent = False
        self.kill_at: float | None = None
        limit = plan.get("time_limit_s")
        self.limit_at = None if limit is None else time.monotonic() + float(limit)
        self.disk_limit = int(plan.get("disk_limit_bytes") or 0)
        self.disk_check_at = time.monotonic() + _DISK_CHECK_S
        self.disk_exceeded = False

    # ------------------------------------------------------------------ plumbing
    def note(self, text: str) -> None:
        self.write(f"[shamal] {text}\n".encode())

    def write(self, data: bytes) -> None:
        while data:
            data = data[os.write(self.log_fd, data) :]

    def _install_signals(self) -> None:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, lambda *_: None)  # the wakeup fd carries the signal number
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        self.sel.register(wake_r, selectors.EVENT_READ, None)

    def _write_ready(self, state: str) -> None:
        me = ProcessIdentity.of(os.getpid())
        assert me is not None  # we are alive
        workers = [
            {"rank": w.rank, **w.identity.to_dict()} for w in self.workers if w.identity is not None
        ]
        atomic_write_json(
            self.ready_path, {"state": state, "supervisor": me.to_dict(), "workers": workers}
        )

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> int:
        self._install_signals()
        self._write_ready("starting")
        for worker in self.workers:
            if self.cause is None:
                self._spawn(worker)
        self._write_ready("running")
        while any(w.live for w in self.workers):
            self._step()
        self._finish()
        return 0

    def _spawn(self, worker: _Worker) -> None:
        argv = worker.argv
        enter_jail = None
        try:
            if worker.jail is not None:
                worker.cgroup = WorkerCgroup.create(worker.cgroup_name, worker.limits)
                settings = jail_settings(worker.jail, cgroup=worker.cgroup, limits=worker.limits)
                # The jail runs in the forked child itself (no interpreter to start): it
                # never returns to exec the placeholder below.
                enter_jail = functools.partial(_enter_jail, settings, list(argv), worker.env)
                argv = ["/bin/false"]
            worker.proc = subprocess.Popen(  # argv, no shell
                argv,
                preexec_fn=enter_jail,  # noqa: PLW1509 - this process runs no threads
                cwd=self.plan["workdir"],
                env=worker.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            worker.code = 126 if isinstance(exc, PermissionError) else 127
            self.note(f"rank {worker.rank} could not start: {exc.strerror}: {exc.filename}")
            self._failed(worker)
            return
        worker.identity = ProcessIdentity.of(worker.proc.pid)
        assert worker.proc.stdout is not None
        os.set_blocking(worker.proc.stdout.fileno(), False)
        self.sel.register(worker.proc.stdout.fileno(), selectors.EVENT_READ, worker)

    def _step(self) -> None:
        for key, _ in self.sel.select(self._timeout()):
            if key.data is None:
                self._on_wakeup(int(key.fd))
            else:
                self._pump(key.data)
        self._reap()
        self._check_deadlines()

    def _timeout(self) -> float:
        now = time.monotonic()
        due = [t for t in (self.kill_at, self.limit_at) if t is not None]
        if any(w.live and w.eof_at is not None and now - w.eof_at < 2.0 for w in self.workers):
            # A worker whose output just ended is about to exit: reap it within milliseconds
            # rather than a whole tick (the job's end is what the scheduler waits for).
            due.append(now + _EXITING_POLL_S)
        return max(0.0, min([_TICK_S, *(t - now for t in due)]))

    def _pump(self, worker: _Worker) -> bool:
        """Move what the worker wrote to the log; False at end of stream."""
        assert worker.proc is not None
        assert worker.proc.stdout is not None
        fd = worker.proc.stdout.fileno()
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return True
        if data:
            self.write(worker.framer.feed(data))
            return True
        self.sel.unregister(fd)
        worker.eof_at = time.monotonic()
        self.write(worker.framer.flush())
        return False

    def _on_wakeup(self, fd: int) -> None:
        with contextlib.suppress(BlockingIOError):
            signums = os.read(fd, 512)
            if int(signal.SIGTERM) in signums or int(signal.SIGINT) in signums:
                self._on_stop_request()

    def _on_stop_request(self) -> None:
        cancel = read_json(self.cancel_path)
        preempt = read_json(self.preempt_path)
        if cancel is not None:
            self._stop(StopCause.CANCEL, float(cancel.get("grace_s", self.grace_s)))
        if preempt is not None or cancel is None:
            grace = float((preempt or {}).get("grace_s", self.grace_s))
            self._stop(StopCause.PREEMPT, grace)

    def _reap(self) -> None:
        for worker in self.workers:
            if worker.live:
                assert worker.proc is not None
                code = worker.proc.poll()
                if code is not None:
                    worker.code = code
                    if worker.cgroup is not None and worker.cgroup.oom_killed():
                        worker.out_of_memory = True
                        mib = worker.limits.memory_bytes // (1024 * 1024)
                        self.note(f"rank {worker.rank} ran out of memory (limit {mib} MiB)")
                    if code != 0:
                        self._failed(worker)

    def _failed(self, worker: _Worker) -> None:
        """A worker ended badly: unless we were stopping it anyway, it fails the gang."""
        if self.cause is None and self.culprit is None:
            self.culprit = worker.rank
            if any(w.live for w in self.workers):
                self.note(f"rank {worker.rank} exited with {worker.code}: stopping the gang")
            self._stop(StopCause.GANG, self.grace_s)

    def _check_disk(self, now: float) -> None:
        """Stop the job when its working folder holds more than its disk limit (checked
        every few seconds, more rarely when the walk itself takes long)."""
        if not self.disk_limit or self.cause is not None or now < self.disk_check_at:
            return
        used = folder_bytes(Path(self.plan["workdir"]))
        self.disk_check_at = time.monotonic() + max(_DISK_CHECK_S, 20 * (time.monotonic() - now))
        if used > self.disk_limit:
            mib = 1024 * 1024
            self.disk_exceeded = True
            self.note(
                f"the job's folder holds {used // mib} MiB, past its limit of "
                f"{self.disk_limit // mib} MiB: stopping it"
            )
            self._stop(StopCause.GANG, self.grace_s)

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        self._check_disk(now)
        if self.limit_at is not None and now >= self.limit_at:
            self.limit_at = None
            self.note("time limit reached")
            self._stop(StopCause.TIMEOUT, self.grace_s)
        if self.kill_at is not None and now >= self.kill_at:
            self.kill_at = None
            live = [w for w in self.workers if w.live]
            if live:
                self.note(f"grace period over: SIGKILL to {len(live)} worker(s)")
            for worker in live:
                assert worker.proc is not None
                kill_group(worker.proc.pid, signal.SIGKILL)

    def _stop(self, cause: StopCause, grace_s: float) -> None:
        """SIGTERM every live worker's group (once); SIGKILL after ``grace_s``."""
        live = [w for w in self.workers if w.live]
        if stronger(self.cause, cause):
            self.cause = cause
        if not self.term_sent and live:
            self.term_sent = True
            self.note(f"{cause.value}: SIGTERM to {len(live)} worker(s), grace {grace_s:g}s")
            for worker in live:
                assert worker.proc is not None
                kill_group(worker.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        self.kill_at = deadline if self.kill_at is None else min(self.kill_at, deadline)

    def _finish(self) -> None:
        for worker in self.workers:
            if worker.proc is not None:  # what its own children left behind
                kill_group(worker.proc.pid, signal.SIGKILL)
            if worker.cgroup is not None:  # even those that left the group
                worker.cgroup.remove()
        self._drain()
        status = decide_outcome([w.code for w in self.workers], self.cause, self.culprit)
        if any(w.out_of_memory for w in self.workers) and status.reason is ExitReason.FAILED:
            status = dataclasses.replace(status, detail=OUT_OF_MEMORY)
        if self.disk_exceeded and status.reason in (ExitReason.FAILED, ExitReason.SUCCEEDED):
            status = ExitStatus(ExitReason.FAILED, status.exit_codes, False, None, DISK_LIMIT)
        self._write_status(status)

    def _drain(self) -> None:
        """Read what is left in the pipes (briefly: a stray process may hold one open)."""
        deadline = time.monotonic() + _DRAIN_S
        while self._open_pipes() and (remaining := deadline - time.monotonic()) > 0:
            for key, _ in self.sel.select(remaining):
                if key.data is None:  # signals no longer matter: the attempt is over
                    with contextlib.suppress(BlockingIOError):
                        os.read(int(key.fd), 512)
                else:
                    self._pump(key.data)
        for worker in self._open_pipes():
            self.write(worker.framer.flush())

    def _open_pipes(self) -> list[_Worker]:
        return [key.data for key in self.sel.get_map().values() if key.data is not None]

    def _write_status(self, status: ExitStatus) -> None:
        codes = ", ".join(str(c) for c in status.exit_codes)
        self.note(f"attempt ended: {status.reason.value} (exit codes {codes})")
        atomic_write_json(self.status_path, {**status.to_dict(), "finished_at": time.time()})

    def abandon(self, exc: BaseException) -> None:
        """The supervisor itself broke: kill the workers and report the attempt lost."""
        for worker in self.workers:
            if worker.proc is not None:
                kill_group(worker.proc.pid, signal.SIGKILL)
            if worker.cgroup is not None:
                worker.cgroup.remove()
        self.note(f"supervisor error ({type(exc).__name__}): workers killed")
        codes = tuple(w.code for w in self.workers)
        self._write_status(ExitStatus(ExitReason.LOST, codes, False, None, "supervisor error"))


def _enter_jail(settings: dict[str, Any], argv: list[str], env: dict[str, str]) -> None:
    """In the worker's forked child (its output, working folder and session already set):
    forget the supervisor's signal handling, take the worker's environment, and become the
    jail (:func:`shamal.executors._jail.run`). Never returns."""
    try:
        # Every descriptor of the supervisor's goes (its log, its selector, the other
        # workers' pipes), and with them the pipe on which Popen waits for an exec that
        # never comes: it returns now, as it would once a command started.
        os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(env)
        jail.run(settings, argv)
    finally:
        os._exit(jail.JAIL_FAILED)  # only if the jail itself broke


def supervise(plan: dict[str, Any]) -> int:
    """Run one attempt to its end in this (detached) process."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    log_fd = os.open(plan["log_path"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    supervisor = Supervisor(plan, log_fd)
    try:
        return supervisor.run()
    except BaseException as exc:
        supervisor.abandon(exc)
        raise


def zygote() -> int:
    """``--zygote``: start supervisors on request, each forked from this process, which has
    imported what a supervisor needs once (an interpreter start and these imports cost
    every job tens of milliseconds of CPU otherwise).

    Says ``ready`` once on stdout, then reads one plan (JSON, one line) at a time on stdin
    and answers one line: ``ok`` once the supervisor runs detached (in a session of its own,
    its output to the attempt's log, a grandchild this process does not wait for), else
    ``error``. Ends at the end of its input (the server is gone or closed the executor).
    """
    answers = sys.stdout.buffer
    answers.write(b"ready\n")
    answers.flush()
    for line in sys.stdin.buffer:
        try:
            plan = json.loads(line)
            child = os.fork()
        except (ValueError, OSError):
            answers.write(b"error\n")
            answers.flush()
            continue
        if child == 0:
            _detach(plan)
        _, status = os.waitpid(child, 0)
        answers.write(b"ok\n" if status == 0 else b"error\n")
        answers.flush()
    return 0


def _detach(plan: dict[str, Any]) -> None:
    """In the zygote's child: leave its session and pipes, fork the supervisor and exit
    (the zygote reaps this process; the supervisor is nobody's child). Never returns."""
    try:
        os.setsid()
        os.chdir(Path(plan["log_path"]).parent)
        log_fd = os.open(plan["log_path"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.dup2(log_fd, 1)  # in place of the zygote's answers: the supervisor's output
        os.dup2(log_fd, 2)
        os.close(log_fd)
        if os.fork():
            os._exit(0)
    except BaseException:  # noqa: BLE001 - the zygote answers 'error'
        os._exit(1)
    try:
        code = supervise(plan)
    except BaseException:  # noqa: BLE001 - abandon() reported it in the log
        os._exit(1)
    os._exit(code)


def main() -> int:
    if sys.argv[1:] == ["--zygote"]:
        return zygote()
    plan = json.loads(sys.stdin.buffer.read())
    if os.fork():  # the server waits for this first process; the child carries on
        os._exit(0)
    return supervise(plan)


if __name__ == "__main__":
    sys.exit(main())
