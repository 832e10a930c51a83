"""How a job's workers are confined: its OS user, what it sees, what it may use.

A :class:`Sandbox` is an executor option. With one, every worker runs inside the jail
(:mod:`shamal.executors._jail`): new mount, PID and IPC namespaces, the server's folders
hidden, a private ``/tmp``, its own ``/proc``, and, when ``own_users`` is set, the OS
user of its tenant (one per team, made on first use with ``useradd``), never root and
never the server's user. Its limits come from its slot (memory, CPU) and the sandbox
(processes), through a cgroup where the machine allows one (:mod:`._cgroups`).

Everything here runs with the executor's privileges, before the job's code runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import pwd
import re
import shutil
import subprocess  # useradd, and the jail's self-test
import sys
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from shamal.executors._cgroups import Limits, WorkerCgroup, limit_mode

__all__ = [
    "JAIL_SCRIPT",
    "jail_settings",
    "Account",
    "Sandbox",
    "confine",
    "describe",
    "interpreter_paths",
    "jail_config",
    "masked_gpu_devices",
    "network_of",
    "prepare_workdir",
    "self_test",
    "tenant_account",
]

logger = logging.getLogger(__name__)

JAIL_SCRIPT = Path(__file__).with_name("_jail.py")
"""Run as a plain file with ``python -I``: see :mod:`shamal.executors._jail`."""

_NAME_MAX = 32  # useradd's limit on Linux
_USER_PREFIX = "shamal-"
_NO_TEAM_USER = "shamal-jobs"


@dataclass(frozen=True, slots=True)
class Account:
    """An OS account a job runs as."""

    name: str
    uid: int
    gid: int


@dataclass(frozen=True)
class Sandbox:
    """How an executor confines its workers.

    Attributes:
        hide: folders no job may see (the server's home, the folder of every job's
            working folder, the artifact store when local, the logs).
        expose: folders a job may read besides its own (the interpreter that runs the
            platform, its packages: :func:`interpreter_paths`).
        shared: folders every job may read and write (a shared scratch folder).
        disk_mib: the most a job's working folder may hold (0: no limit); a job past it
            is stopped (local executor).
        own_users: run each job as its tenant's OS user (needs root); otherwise as the
            executor's own user, in namespaces.
        pids_max: the most processes (and threads) one worker may have at once.
        tmp_size_mib: size of the job's private ``/tmp`` and ``/dev/shm`` (memory that
            counts against the job's own limit).
        network: ``platform``: a network namespace of its own whose only way out is a
            relay to the platform's API (at the port ``SHAMAL_URL`` names, on loopback);
            ``none``: loopback only; ``host``: the machine's network. Gangs use the
            machine's network (their ranks must reach each other).
    """

    hide: tuple[str, ...]
    shared: tuple[str, ...] = ()
    expose: tuple[str, ...] = ()
    own_users: bool = True
    pids_max: int = 4096
    tmp_size_mib: int = 1024
    network: str = "platform"
    disk_mib: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sandbox:
        return cls(
            hide=tuple(str(p) for p in data["hide"]),
            shared=tuple(str(p) for p in data.get("shared", ())),
            expose=tuple(str(p) for p in data.get("expose", ())),
            own_users=bool(data.get("own_users", True)),
            pids_max=int(data.get("pids_max", 4096)),
            tmp_size_mib=int(data.get("tmp_size_mib", 1024)),
            network=str(data.get("network", "platform")),
            disk_mib=int(data.get("disk_mib", 0)),
        )


def interpreter_paths() -> tuple[str, ...]:
    """What a job needs to read to run this platform's Python and import ``shamal``."""
    import shamal

    paths = {sys.prefix, sys.base_prefix, str(Path(shamal.__file__).resolve().parents[1])}
    paths.add(str(Path(sys.executable).resolve().parent.parent))
    return tuple(sorted(paths))


def account_name(tenant: str) -> str:
    """The OS user name of a tenant: ``shamal-<team>`` (shortened with a hash past 32
    characters, other characters than ``[a-z0-9-]`` replaced); ``shamal-jobs`` for
    jobs of no team."""
    if not tenant:
        return _NO_TEAM_USER
    slug = re.sub(r"[^a-z0-9-]", "-", tenant.lower()).strip("-") or "team"
    name = _USER_PREFIX + slug
    if len(name) > _NAME_MAX or slug != tenant:
        digest = hashlib.sha256(tenant.encode()).hexdigest()[:8]
        name = f"{_USER_PREFIX}{slug[: _NAME_MAX - len(_USER_PREFIX) - 9]}-{digest}"
    return name


def tenant_account(tenant: str) -> Account:
    """The OS account of ``tenant``'s jobs, made (``useradd --system``, a group of its
    own, no home, no login shell) when missing. Never root.

    Raises:
        PermissionError: it is missing and this process cannot make it.
    """
    name = account_name(tenant)
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        entry = _create_account(name)
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise PermissionError(f"the job account {name} is root; refusing to use it")
    return Account(name, entry.pw_uid, entry.pw_gid)


def _create_account(name: str) -> pwd.struct_passwd:
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    command = [
        useradd,
        "--system",
        "--user-group",
        "--no-create-home",
        "--home-dir",
        "/nonexistent",
        "--shell",
        "/usr/sbin/nologin",
        "--comment",
        "Shamal jobs",
        name,
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    try:
        entry = pwd.getpwnam(name)  # made now, or by a scheduler beside us meanwhile
    except KeyError:
        raise PermissionError(
            f"could not create the job account {name}: {done.stderr.strip() or done.returncode}"
        ) from None
    logger.info("created the OS account %s (uid %d) for jobs", name, entry.pw_uid)
    return entry


def prepare_workdir(workdir: Path, account: Account | None) -> None:
    """Give the job's working folder to its account (mode 0700), all of it, without
    following links; the folder was unpacked by the executor and nothing runs in it yet."""
    if account is None:
        return
    for root, dirs, files in os.walk(workdir):
        for name in (*dirs, *files):
            os.lchown(os.path.join(root, name), account.uid, account.gid)
    os.chown(workdir, account.uid, account.gid)
    workdir.chmod(0o700)


def jail_config(
    sandbox: Sandbox,
    *,
    workdir: str,
    account: Account | None,
    env: Mapping[str, str] | None = None,
    world_size: int = 1,
    masked: Sequence[str] = (),
) -> dict[str, Any]:
    """What the jail is told about one worker (see :mod:`shamal.executors._jail`), less
    its cgroup and rlimits, which :func:`confine` adds where the worker starts.

    ``env`` is the worker's environment: its ``SHAMAL_URL`` is what the ``platform``
    network relays to (without one, the job gets no network at all). ``masked`` files
    (another worker's GPUs: :func:`masked_gpu_devices`) read as ``/dev/null``."""
    network, api = network_of(sandbox.network, (env or {}).get("SHAMAL_URL"), world_size)
    return {
        "uid": None if account is None else account.uid,
        "gid": None if account is None else account.gid,
        "user": "" if account is None else account.name,
        "workdir": workdir,
        "hide": list(sandbox.hide),
        "expose": sorted({*interpreter_paths(), *sandbox.expose}),
        "shared": list(sandbox.shared),
        "tmp_size_mib": sandbox.tmp_size_mib,
        "network": network,
        "api": api,
        "mask": list(masked),
    }


def network_of(
    mode: str, api_url: str | None, world_size: int = 1
) -> tuple[str, tuple[str, int] | None]:
    """The jail's network for one worker, and the API address it relays to.

    Raises:
        ValueError: ``platform`` with an API URL that is not on loopback (the relay
            listens on the job's loopback at the API's port).
    """
    if mode != "platform":
        return mode, None
    if world_size > 1:
        return "host", None  # the ranks of a gang must reach each other
    if not api_url:
        return "none", None
    url = urllib.parse.urlsplit(api_url)
    host = url.hostname or ""
    port = url.port or (443 if url.scheme == "https" else 80)
    loopback = host == "localhost" or host.startswith("127.") or host == "::1"
    if not loopback:
        raise ValueError(
            f"the job network 'platform' relays to the API on loopback; {host} is not "
            "(set SHAMAL_SCHEDULER__JOB_NETWORK=host for a remote API)"
        )
    return "platform", ("127.0.0.1" if host == "localhost" else host, port)


def jail_settings(
    config: Mapping[str, Any], *, cgroup: WorkerCgroup | None, limits: Limits
) -> dict[str, Any]:
    """The jail's full configuration: ``config`` (:func:`jail_config`) joined to ``cgroup``,
    or with ``limits`` as rlimits when there is none."""
    own_user = config.get("uid") is not None
    return {
        **config,
        "cgroup_procs": [] if cgroup is None else cgroup.procs_files,
        "rlimits": {"RLIMIT_CORE": 0} if cgroup is not None else limits.rlimits(own_user=own_user),
    }


def confine(
    python: str,
    config: Mapping[str, Any],
    argv: Sequence[str],
    *,
    cgroup: WorkerCgroup | None,
    limits: Limits,
) -> list[str]:
    """The argv that runs ``argv`` in the jail described by ``config``
    (:func:`jail_config`), joined to ``cgroup``, or with ``limits`` as rlimits when
    there is none."""
    full = jail_settings(config, cgroup=cgroup, limits=limits)
    # -I: nothing the job controls is imported with the server's privileges; -S: nor the
    # interpreter's site packages (the jail uses the standard library only, and a step
    # starts a little sooner without their .pth files).
    return [python, "-I", "-S", str(JAIL_SCRIPT), json.dumps(full), "--", *argv]


def masked_gpu_devices(
    visible: Iterable[int], minors: Mapping[int, int] | None, dev: Path = Path("/dev")
) -> list[str]:
    """The GPU device files a worker must not open: every ``/dev/nvidia<N>`` but those of
    the GPUs it was given (``visible``, by index; ``minors`` maps an index to its file's
    number, from NVML). ``CUDA_VISIBLE_DEVICES`` alone is a request the job may ignore.

    A worker without GPUs gets none of them. One with GPUs but no map (NVML could not say)
    keeps them all, with a warning: hiding its own GPU would break it."""
    files = sorted(p for p in dev.glob("nvidia*") if p.name.removeprefix("nvidia").isdigit())
    wanted = set(visible)
    if not wanted:
        return [str(p) for p in files]
    if minors is None:
        if files:
            logger.warning("cannot tell which /dev/nvidia* files are this job's: none hidden")
        return []
    keep = {f"nvidia{minors[i]}" for i in wanted if i in minors}
    return [str(p) for p in files if p.name not in keep]


def self_test(python: str, sandbox: Sandbox, scratch: Path) -> str | None:
    """Run ``true`` in the jail as the no-team account; ``None`` when it works, else why
    not (in words). Made for the server's start, so it refuses to run jobs unconfined."""
    account = None
    try:
        if sandbox.own_users:
            account = tenant_account("")
        workdir = scratch / "sandbox-self-test"
        workdir.mkdir(parents=True, exist_ok=True)
        prepare_workdir(workdir, account)
        config = jail_config(sandbox, workdir=str(workdir), account=account)
        argv = confine(python, config, ["true"], cgroup=None, limits=Limits())
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(scratch / "sandbox-self-test")
    if done.returncode != 0:
        return done.stderr.strip().replace("[shamal] ", "") or f"exit {done.returncode}"
    return None


def describe(sandbox: Sandbox | None) -> str:
    """One line for the server's start: who jobs run as, in what, with which limits."""
    if sandbox is None:
        return "jobs run unconfined, as the server's own user"
    who = "a user per team" if sandbox.own_users else "the server's own user"
    net = {
        "platform": ", a network of their own that reaches only the platform's API",
        "none": ", no network",
        "host": ", on the machine's network",
    }.get(sandbox.network, "")
    return f"jobs run as {who} in mount, PID and IPC namespaces{net}; limits: {limit_mode()}"
