"""The jail a job's worker runs in: ``python -I _jail.py CONFIG -- ARGV...``.

It is started by the supervisor (local executor) or the rank actor (Ray executor) in the
worker's place, as the server's user (root, or any user where unprivileged user
namespaces are allowed), and:

1. joins the worker's cgroups (made by its parent) and applies the rlimits;
2. enters new mount, PID and IPC namespaces (and a user namespace when it is not root);
3. in the child that is PID 1 of the new PID namespace, builds the job's view of the
   file system: every hidden path (the server's home, the folder of every job, the
   server's temporary files) is covered by an empty ``tmpfs``; ``/tmp`` and
   ``/dev/shm`` become private; the paths the job needs (its working folder, the
   interpreter) are bound back in at their own paths, behind an empty ``tmpfs`` on
   any parent folder the job's user could not enter; a new ``/proc`` shows only the
   job's own processes;
4. starts the command in a grandchild that drops to the job's user (no supplementary
   groups, no new privileges, no capabilities) and runs it in the working folder;
5. stays as the namespace's init: it passes SIGTERM/SIGINT/SIGHUP on to every process
   of the job, reaps them, and when the command ends it exits, which makes the kernel
   kill whatever the job left behind (``setsid``, double forks, ``nohup``).

The outer process waits for the init and ends the way the command ended (its exit code,
or the same signal), so the caller sees the command's outcome. If the outer process is
SIGKILLed, the init dies with it (parent-death signal) and takes the job with it.

It imports only the standard library and nothing from the package: ``python -I`` runs
it as a plain file, so nothing the job controls (``PYTHONPATH``, the working folder, a
``sitecustomize``) is imported with the server's privileges.

CONFIG is JSON: ``uid``, ``gid`` (``null``: stay the caller's user), ``user`` (the name
for ``USER``/``LOGNAME``), ``workdir``, ``hide`` (paths), ``shared`` (paths the job may
read and write), ``expose`` (paths the job may read), ``mask`` (files that read as
``/dev/null``: other GPUs' devices), ``tmp_size_mib``, ``cgroup_procs``
(``cgroup.procs`` files to join), ``rlimits`` (``{"RLIMIT_AS": n, ...}``), ``network``
(``host``; ``none``: a network namespace with only loopback; ``platform``: that, plus a
relay from ``127.0.0.1:<port>`` inside to ``api`` = ``[host, port]`` outside).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import resource
import signal
import socket
import stat
import struct
import sys
import threading
from pathlib import Path
from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1

JAIL_FAILED = 124
"""Exit code when the jail itself could not be set up (nothing of the job ran)."""

_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)

_libc = ctypes.CDLL(None, use_errno=True)


class JailError(Exception):
    """The jail could not be built; the job must not run."""


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise JailError(f"{what}: {os.strerror(err)}")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    _check(
        _libc.mount(
            source.encode(),
            target.encode(),
            None if fstype is None else fstype.encode(),
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {fstype or 'bind'} on {target}",
    )


def _prctl(option: int, value: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl({option})")


# ---------------------------------------------------------------------- the view
def _enterable(path: Path, uid: int | None, gid: int | None) -> bool:
    """Can the job's user enter the folder ``path`` (search permission)?"""
    if uid is None:
        return True  # the job keeps the caller's user: what it could enter, it still can
    try:
        info = path.stat()
    except OSError:
        return False
    if info.st_uid == uid:
        return bool(info.st_mode & stat.S_IXUSR)
    if info.st_gid == gid:
        return bool(info.st_mode & stat.S_IXGRP)
    return bool(info.st_mode & stat.S_IXOTH)


def _under(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def plan_view(config: dict[str, Any]) -> list[tuple[str, Path, bool]]:
    """The mounts that make the job's view, in order: ``("cover", folder, private)`` puts
    an empty tmpfs on a folder (a writable scratch one when ``private``), ``("bind", path,
    writable)`` binds a real path back at its own place.

    Pure apart from ``stat`` calls on the real file system, made before anything is
    mounted. Shallower paths come first, and at one depth covers before binds, so a
    hidden folder inside a bound-back path is hidden again after the bind.
    """
    uid, gid = config.get("uid"), config.get("gid")
    # The job's own scratch folders: each becomes a private, bounded tmpfs.
    scratch = {Path("/tmp"), Path("/dev/shm")}  # nosec B108
    covers = {Path(p) for p in config.get("hide", ()) if Path(p).is_dir()} | scratch
    needed = _needed_paths(config, uid, gid)
    for path, _ in needed:
        blocked = _outermost_blocked(path, uid, gid)
        if blocked is not None:
            covers.add(blocked)
    binds = [
        (path, writable)
        for path, writable in needed
        if path.exists() and any(_under(path, c) and c != path for c in covers)
    ]
    return _ordered_steps(covers, scratch, binds)


def _needed_paths(
    config: dict[str, Any], uid: int | None, gid: int | None
) -> list[tuple[Path, bool]]:
    """The paths the job needs (its working folder, ``shared``, ``expose``), each with
    whether it may write there, less those its user may not enter."""
    needed = [(Path(config["workdir"]), True)]
    needed += [(Path(p), True) for p in config.get("shared", ())]
    needed += [(Path(p), False) for p in config.get("expose", ())]
    # A folder the job's user may not enter is of no use to it, and bound back it would
    # block the way to what lies below it (its own working folder, say).
    return [(p, w) for p, w in needed if _enterable(p, uid, gid)]


def _outermost_blocked(path: Path, uid: int | None, gid: int | None) -> Path | None:
    """The outermost parent folder of ``path`` the job's user cannot enter, if any."""
    return next((a for a in reversed(path.parents) if not _enterable(a, uid, gid)), None)


def _ordered_steps(
    covers: set[Path], scratch: set[Path], binds: list[tuple[Path, bool]]
) -> list[tuple[str, Path, bool]]:
    """Covers and binds as mount steps: shallower paths first, at one depth covers
    before binds, then by path."""
    steps = [(len(c.parts), 0, ("cover", c, c in scratch)) for c in covers]
    steps += [(len(p.parts), 1, ("bind", p, w)) for p, w in binds]
    return [step for _, _, step in sorted(steps, key=lambda s: (s[0], s[1], str(s[2][1])))]


def build_view(config: dict[str, Any]) -> None:
    """Mount the job's view of the file system (see the module docstring)."""
    _mount("none", "/", None, MS_REC | MS_PRIVATE)
    steps = plan_view(config)
    # Open what is bound back before anything hides it.
    bound = [path for kind, path, _ in steps if kind == "bind"]
    fds = {path: os.open(path, os.O_PATH | os.O_CLOEXEC) for path in bound}
    tmp_size = int(config.get("tmp_size_mib", 512))
    for kind, path, flag in steps:
        if kind == "cover":
            if not path.is_dir():
                continue  # an outer cover hides it already
            options = f"size={tmp_size}m,mode=1777" if flag else "size=1m,mode=755"
            _mount("tmpfs", str(path), "tmpfs", MS_NOSUID | MS_NODEV, options)
            continue
        source = f"/proc/self/fd/{fds[path]}"
        if not path.exists():
            if Path(source).is_dir():
                path.mkdir(parents=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
        _mount(source, str(path), None, MS_BIND | MS_REC)
        if not flag:
            # A user namespace may not drop locked flags: the bind then stays as it was.
            with contextlib.suppress(JailError):
                _mount("none", str(path), None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)
    for fd in fds.values():
        os.close(fd)
    for masked in config.get("mask", ()):  # device files of GPUs that are not the job's
        if os.path.exists(masked):
            _mount("/dev/null", masked, None, MS_BIND)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


# ---------------------------------------------------------------------- the processes
def _join_cgroups(config: dict[str, Any]) -> None:
    for procs in config.get("cgroup_procs", ()):
        with open(procs, "w", encoding="ascii") as fh:
            fh.write(str(os.getpid()))


def _apply_rlimits(config: dict[str, Any]) -> None:
    for name, value in config.get("rlimits", {}).items():
        limit = getattr(resource, name)
        soft, hard = resource.getrlimit(limit)
        cap = int(value) if hard == resource.RLIM_INFINITY else min(int(value), hard)
        resource.setrlimit(limit, (cap, cap))


def _enter_user_namespace() -> None:
    """Not root: a user namespace in which this user is root, so mounts are allowed."""
    uid, gid = os.getuid(), os.getgid()
    _check(_libc.unshare(CLONE_NEWUSER), "unshare(user)")
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
    Path("/proc/self/gid_map").write_text(f"0 {gid} 1")


def _drop_privileges(config: dict[str, Any]) -> None:
    uid, gid = config.get("uid"), config.get("gid")
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    if uid is None or gid is None:
        return
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)  # also clears every capability


def _run_command(config: dict[str, Any], argv: list[str]) -> None:
    """The grandchild: become the job's user and exec the command. Never returns."""
    try:
        for sig in _FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.setsid()  # signals reach the command once, through the init, not by group
        _drop_privileges(config)
        os.chdir(config["workdir"])
        env = dict(os.environ)
        env.update(HOME=config["workdir"], TMPDIR="/tmp")  # nosec B108
        if config.get("user"):
            env.update(USER=config["user"], LOGNAME=config["user"])
    except (OSError, JailError) as exc:
        os.write(2, f"[shamal] the job could not be confined: {exc}\n".encode())
        os._exit(JAIL_FAILED)
    try:
        os.execvpe(argv[0], argv, env)
    except PermissionError as exc:
        os.write(2, f"[shamal] could not start: {exc.strerror}: {argv[0]}\n".encode())
        os._exit(126)
    except OSError as exc:
        os.write(2, f"[shamal] could not start: {exc.strerror}: {argv[0]}\n".encode())
        os._exit(127)


def _init(config: dict[str, Any], argv: list[str], report: int) -> None:
    """PID 1 of the job's namespace: build the view, start the command, reap, forward
    signals; write the command's wait status to ``report``. Never returns."""
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        build_view(config)
    except (OSError, JailError) as exc:
        os.write(2, f"[shamal] the job's sandbox could not be built: {exc}\n".encode())
        os._exit(JAIL_FAILED)
    for sig in _FORWARDED:  # PID 1 gets only the signals it handles
        signal.signal(sig, lambda signum, _frame: _forward(signum))
    command = os.fork()
    if command == 0:
        _run_command(config, argv)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(JAIL_FAILED)
        except InterruptedError:
            continue
        if pid == command:
            os.write(report, status.to_bytes(4, "little"))
            os._exit(0)  # the kernel now kills what the job left behind


def _forward(signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signum)  # every process of the namespace but this one


# ---------------------------------------------------------------------- the network
def _loopback_up() -> None:
    """Bring up ``lo`` in a new network namespace (it starts down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(sock, SIOCGIFFLAGS, request)[:18])[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def _start_relay(config: dict[str, Any]) -> socket.socket:
    """Fork the relay, which stays in the host's network (this process is about to leave
    it); returns the channel on which it waits for the job's listening socket."""
    ours, theirs = socket.socketpair()
    if os.fork() == 0:
        ours.close()
        _relay(theirs, (str(config["api"][0]), int(config["api"][1])), config)
    theirs.close()
    return ours


def _hand_over_listener(channel: socket.socket, port: int) -> None:
    """In the job's network: listen where the job expects the API (loopback, the API's
    port) and hand the socket to the relay, which answers from the host's network."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(128)
        socket.send_fds(channel, [b"L"], [listener.fileno()])
    channel.close()


def _relay(channel: socket.socket, api: tuple[str, int], config: dict[str, Any]) -> None:
    """The job's only way out: every connection to the API's port inside the job's network
    is joined to the API itself. Bytes only, nothing parsed; as the job's user. Survives
    the job's stop signals (a preempted job still saves its checkpoint through it) and
    dies with the jail. Never returns."""
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        for sig in _FORWARDED:
            signal.signal(sig, signal.SIG_IGN)
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)  # the job's log is the job's
        _, fds, _, _ = socket.recv_fds(channel, 16, 1)
        channel.close()
        if not fds:
            os._exit(0)
        listener = socket.socket(fileno=fds[0])
        _drop_privileges(config)
        while True:
            inside, _ = listener.accept()
            threading.Thread(target=_bridge, args=(inside, api), daemon=True).start()
    except BaseException:  # noqa: BLE001 - a relay that fails ends quietly; the job sees it
        os._exit(0)


def _bridge(inside: socket.socket, api: tuple[str, int]) -> None:
    # A plain connect to the numeric address: no name lookup (which would import codecs
    # the relay's user may not be able to read any more).
    outside = socket.socket(socket.AF_INET6 if ":" in api[0] else socket.AF_INET)
    try:
        outside.settimeout(10)
        outside.connect(api)
        outside.settimeout(None)
    except OSError:
        inside.close()
        outside.close()
        return
    back = threading.Thread(target=_pump, args=(outside, inside), daemon=True)
    back.start()
    _pump(inside, outside)
    back.join()
    inside.close()
    outside.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def _end_like(status: int) -> None:
    """End this process the way the command ended (exit code or signal)."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else JAIL_FAILED)


def main(args: list[str]) -> None:
    if len(args) < 3 or args[1] != "--":
        os.write(2, b"usage: _jail.py CONFIG -- ARGV...\n")
        os._exit(2)
    run(json.loads(args[0]), args[2:])


def run(config: dict[str, Any], argv: list[str]) -> None:
    """Confine and run ``argv`` as the module docstring says, in this process: the command
    gets this process's environment. Never returns; ends the way the command ended.

    The local executor's supervisor calls it in a forked child (no interpreter to start:
    the supervisor imports nothing the job controls either); the Ray executor runs this
    file with ``python -I``."""
    network = config.get("network", "host")
    try:
        _join_cgroups(config)
        _apply_rlimits(config)
        if os.geteuid() != 0:
            _enter_user_namespace()
        flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC
        channel = None
        if network in ("none", "platform"):
            flags |= CLONE_NEWNET
        if network == "platform":
            channel = _start_relay(config)
        _check(_libc.unshare(flags), "unshare")
        if flags & CLONE_NEWNET:
            _loopback_up()
        if channel is not None:
            _hand_over_listener(channel, int(config["api"][1]))
    except (OSError, JailError) as exc:
        os.write(2, f"[shamal] the job's sandbox could not be built: {exc}\n".encode())
        os._exit(JAIL_FAILED)
    read_end, write_end = os.pipe()
    init = os.fork()
    if init == 0:
        os.close(read_end)
        _init(config, argv, write_end)
    os.close(write_end)
    for sig in _FORWARDED:  # the init is in our process group: it gets them too
        signal.signal(sig, signal.SIG_IGN)
    _, init_status = os.waitpid(init, 0)
    report = os.read(read_end, 4)
    if len(report) == 4:
        _end_like(int.from_bytes(report, "little"))
    _end_like(init_status)


if __name__ == "__main__":
    main(sys.argv[1:])
