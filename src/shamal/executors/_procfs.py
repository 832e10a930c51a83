"""Small POSIX helpers: process identity that survives pid reuse, atomic files, ports.

A pid alone does not name a process for long: after it exits the kernel may give the
number to another one. A process is therefore named by ``(pid, start_ticks, boot_id)``
where ``start_ticks`` is field 22 of ``/proc/<pid>/stat`` (its start time in clock
ticks since boot) and ``boot_id`` names the boot. Linux only (``/proc``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import signal
import socket
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ProcessIdentity",
    "atomic_write_json",
    "boot_id",
    "ephemeral_ports",
    "free_port",
    "kill_group",
    "kill_group_of",
    "read_json",
]

logger = logging.getLogger(__name__)

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str:
    """This boot's id ("" when the kernel does not say)."""
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return ""


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (field 3 is index 0)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself hold spaces or ')'.
    return raw[raw.rfind(b")") + 2 :].decode("ascii", "replace").split()


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """A process named so that a reused pid cannot be mistaken for it."""

    pid: int
    start_ticks: int
    boot: str

    @classmethod
    def of(cls, pid: int) -> ProcessIdentity | None:
        """The identity of the live process ``pid`` now, or ``None`` if there is none."""
        fields = _stat_fields(pid)
        if fields is None or len(fields) < 20:
            return None
        return cls(pid, int(fields[19]), boot_id())

    def is_alive(self) -> bool:
        """True while this very process exists and is not a zombie."""
        fields = _stat_fields(self.pid)
        if fields is None or len(fields) < 20:
            return False
        if fields[0] in ("Z", "X", "x"):
            return False
        return int(fields[19]) == self.start_ticks and boot_id() == self.boot

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "start_ticks": self.start_ticks, "boot": self.boot}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProcessIdentity:
        return cls(int(data["pid"]), int(data["start_ticks"]), str(data["boot"]))


def kill_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid``; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        logger.warning("not allowed to signal process group %d", pgid)
        return False
    return True


def kill_group_of(identity: ProcessIdentity, sig: int = signal.SIGKILL) -> bool:
    """Signal the group led by ``identity`` if that very process still leads it.

    Used on the remains of a lost attempt: the worker is checked by identity first, so
    a reused pid is never signalled. When the leader is gone altogether, its group may
    still hold its children; the kernel does not hand out a pid that still names a
    process group, so signalling the group is then safe too.
    """
    if identity.boot != boot_id():
        return False  # nothing survives a reboot
    current = ProcessIdentity.of(identity.pid)
    if current is not None and current.start_ticks != identity.start_ticks:
        return False
    return kill_group(identity.pid, sig)


def atomic_write_json(path: Path, data: Mapping[str, Any], mode: int = 0o600) -> None:
    """Write ``data`` as JSON so that readers see the old file or the new one, whole."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(dict(data), fh, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or ``None`` when missing or not (yet) an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Ports below this are left alone: fixed service ports live there, and so does 10002-19999,
# the worker port range commonly given to Ray.
_LOWEST_CHOSEN_PORT = 20_000
_PORT_TRIES = 64


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for ports it picks itself (Linux's default when it does not say)."""
    try:
        low, high = (int(x) for x in _EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        return 32_768, 60_999
    return low, high


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now, for a server that binds it a little later
    (rank 0's ``MASTER_PORT``).

    Chosen at random below the kernel's ephemeral range where that leaves room: a port from
    that range can be taken meanwhile by any outgoing connection on the machine (the kernel
    hands them out), which made a gang's rendezvous fail with EADDRINUSE; below it only a
    server that binds that very port can take it. Falls back to a port the kernel picks.
    """
    low, _ = ephemeral_ports()
    chooser = random.SystemRandom()
    if low - _LOWEST_CHOSEN_PORT >= _PORT_TRIES:
        for _ in range(_PORT_TRIES):
            port = chooser.randrange(_LOWEST_CHOSEN_PORT, low)
            if _bindable(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True
