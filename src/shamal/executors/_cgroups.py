"""Resource limits of one worker: a cgroup where the machine allows one, rlimits otherwise.

A worker's cgroup holds every process it starts, whatever session or process group they
move to, so it is what the job is limited by (memory, number of processes, CPU time per
period) and what is killed when the job ends. The cgroup is made under the caller's own
cgroup (``<own>/shamal-jobs/<name>``), so a job can never get more than the server was
given.

Both layouts are handled: cgroup v2 (one unified tree with the ``memory``, ``pids`` and
``cpu`` controllers delegated) and cgroup v1 (one tree per controller). Where neither
can be written (no privileges, or no delegation), :func:`limit_mode` says ``rlimits``
and the jail sets ``RLIMIT_AS`` (memory, as address space) and, for a job that runs as
a user of its own, ``RLIMIT_NPROC``; CPU is then not capped.

Standard library only: the supervisor imports it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Limits", "WorkerCgroup", "limit_mode"]

logger = logging.getLogger(__name__)

_ROOT = Path("/sys/fs/cgroup")
_CONTROLLERS = ("memory", "pids", "cpu")
_PERIOD_US = 100_000
_KILL_ROUNDS = 200


@dataclass(frozen=True, slots=True)
class Limits:
    """What one worker may use: bytes of memory, processes, and thousandths of a CPU
    (0: no limit of that kind)."""

    memory_bytes: int = 0
    pids: int = 0
    cpu_milli: int = 0

    def rlimits(self, *, own_user: bool) -> dict[str, int]:
        """The rlimits that stand in for a cgroup: address space, and processes when the
        job has a user of its own (``RLIMIT_NPROC`` counts every process of the user)."""
        limits = {"RLIMIT_CORE": 0}
        if self.memory_bytes:
            limits["RLIMIT_AS"] = self.memory_bytes
        if self.pids and own_user:
            limits["RLIMIT_NPROC"] = self.pids
        return limits


def _own_paths() -> dict[str, str]:
    """Controller (``""`` for the unified tree) -> this process's cgroup path in it."""
    paths: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return paths
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _v2_base() -> Path | None:
    """The unified tree's folder under which workers' cgroups go, if usable."""
    if not (_ROOT / "cgroup.controllers").exists():
        return None  # not a pure cgroup v2 machine
    own = _own_paths().get("", "/")
    base = _ROOT / own.lstrip("/") / "shamal-jobs"
    try:
        base.mkdir(exist_ok=True)
        enabled = (base / "cgroup.controllers").read_text().split()
        wanted = [c for c in _CONTROLLERS if c in enabled]
        (base / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in wanted))
    except OSError:
        return None
    return base if {"memory", "pids"} <= set(wanted) else None


def _v1_bases() -> dict[str, Path] | None:
    """Controller -> the folder under which workers' cgroups go (cgroup v1), if usable."""
    own = _own_paths()
    bases = {}
    for controller in _CONTROLLERS:
        mount = _ROOT / controller
        if not (mount / "cgroup.procs").exists() or controller not in own:
            if controller == "cpu":
                continue  # memory and pids are what matter; CPU is a bonus
            return None
        base = mount / own[controller].lstrip("/") / "shamal-jobs"
        try:
            base.mkdir(exist_ok=True)
        except OSError:
            return None
        bases[controller] = base
    return bases


def limit_mode() -> str:
    """How workers are limited on this machine, in words: ``cgroup v2 (memory, pids,
    cpu)``, ``cgroup v1 (memory, pids, cpu)`` or ``rlimits (...)``."""
    if (base := _v2_base()) is not None:
        controllers = (base / "cgroup.subtree_control").read_text().split()
        return f"cgroup v2 ({', '.join(controllers)})"
    if (bases := _v1_bases()) is not None:
        return f"cgroup v1 ({', '.join(bases)})"
    return "rlimits (memory as address space, processes per job user; CPU not capped)"


@dataclass
class WorkerCgroup:
    """The cgroup(s) of one worker: one folder per controller (v1) or one (v2)."""

    folders: Mapping[str, Path]
    unified: bool
    _removed: bool = field(default=False, repr=False)

    @classmethod
    def create(cls, name: str, limits: Limits) -> WorkerCgroup | None:
        """Make the worker's cgroup with ``limits``; ``None`` where cgroups are not usable
        (the caller then falls back to rlimits). ``name`` must be unique per worker."""
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"not a cgroup name: {name!r}")
        if (base := _v2_base()) is not None:
            group = cls({"": base / name}, unified=True)
        elif (bases := _v1_bases()) is not None:
            group = cls({c: b / name for c, b in bases.items()}, unified=False)
        else:
            return None
        try:
            for folder in group.folders.values():
                folder.mkdir(exist_ok=True)
            group._apply(limits)
        except OSError:
            logger.warning("could not set up the cgroup %s", name, exc_info=True)
            group.remove()
            return None
        return group

    def _write(self, controller: str, name: str, value: str) -> None:
        folder = self.folders["" if self.unified else controller]
        (folder / name).write_text(value)

    def _apply(self, limits: Limits) -> None:
        if self.unified:
            if limits.memory_bytes:
                self._write("", "memory.max", str(limits.memory_bytes))
                with contextlib.suppress(OSError):
                    self._write("", "memory.swap.max", "0")
            if limits.pids:
                self._write("", "pids.max", str(limits.pids))
            if limits.cpu_milli:
                with contextlib.suppress(OSError):
                    quota = limits.cpu_milli * _PERIOD_US // 1000
                    self._write("", "cpu.max", f"{quota} {_PERIOD_US}")
            return
        if limits.memory_bytes:
            self._write("memory", "memory.limit_in_bytes", str(limits.memory_bytes))
            with contextlib.suppress(OSError):  # absent without swap accounting
                self._write("memory", "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
        if limits.pids:
            self._write("pids", "pids.max", str(limits.pids))
        if limits.cpu_milli and "cpu" in self.folders:
            self._write("cpu", "cpu.cfs_period_us", str(_PERIOD_US))
            self._write("cpu", "cpu.cfs_quota_us", str(limits.cpu_milli * _PERIOD_US // 1000))

    @classmethod
    def existing(cls, name: str) -> WorkerCgroup | None:
        """The cgroup :meth:`create` made under ``name``, if it is still there (the remains
        of a worker whose supervisor vanished)."""
        if (base := _v2_base()) is not None:
            folders = {"": base / name}
            unified = True
        elif (bases := _v1_bases()) is not None:
            folders = {c: b / name for c, b in bases.items()}
            unified = False
        else:
            return None
        present = {c: f for c, f in folders.items() if f.is_dir()}
        return cls(present, unified=unified) if present else None

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a process writes its pid to, to join."""
        return [str(folder / "cgroup.procs") for folder in self.folders.values()]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for procs in self.procs_files:
            with contextlib.suppress(OSError, ValueError):
                found |= {int(pid) for pid in Path(procs).read_text().split()}
        return found

    def oom_killed(self) -> bool:
        """Did the kernel kill a process of this cgroup for want of memory?"""
        folder = self.folders["" if self.unified else "memory"]
        events = "memory.events" if self.unified else "memory.oom_control"
        try:
            lines = (folder / events).read_text().splitlines()
        except OSError:
            return False
        counters = dict(line.split(maxsplit=1) for line in lines if " " in line)
        return int(counters.get("oom_kill", "0")) > 0

    def kill_all(self, deadline_s: float = 5.0) -> bool:
        """SIGKILL every process in the cgroup until it is empty; False if some survive
        ``deadline_s`` (a process stuck in the kernel)."""
        deadline = time.monotonic() + deadline_s
        delay = 0.001
        while pids := self.pids():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)  # the kernel empties the cgroup as the processes exit
            delay = min(delay * 2, 0.05)
        return True

    def remove(self) -> None:
        """Kill what is left and delete the cgroup (idempotent)."""
        if self._removed:
            return
        self.kill_all()
        for folder in self.folders.values():
            for _ in range(_KILL_ROUNDS):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        logger.warning("could not remove cgroup %s: %s", folder, exc)
                        break
                    time.sleep(0.005)  # the last exiting process is still leaving it
        self._removed = True
