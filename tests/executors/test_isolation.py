"""Jobs are untrusted code: what a sandboxed worker sees, who it runs as, what it may use.

Each test runs jobs that try something a hostile tenant would (section 12 of the
hostile-input catalogue) and print what they saw as JSON; the test reads the log. Both
executors run them: the local one, and Ray's rank actors, which confine the command the
same way on their node. Without the sandbox every probe here succeeds (the jobs would
run as this test's user, root, beside everything).
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shamal.executors import (
    DISK_LIMIT,
    OUT_OF_MEMORY,
    Executor,
    ExitReason,
    ExitStatus,
    Handle,
    LaunchSpec,
    Sandbox,
    get_executor,
)
from shamal.executors._cgroups import Limits, WorkerCgroup
from shamal.executors._isolation import (
    confine,
    jail_config,
    masked_gpu_devices,
    prepare_workdir,
    tenant_account,
)
from shamal.scheduler.core._resources import Placement, Slot
from tests import needs
from tests.live import job_command_pid
from tests.polling import wait_for


@pytest.fixture(autouse=True)
def _as_root() -> None:
    needs.root("jobs of other users need root")


DENIED = {"PermissionError", "FileNotFoundError", "ProcessLookupError", "NotADirectoryError"}

PROBE = """
import json, os, sys
def probe(action):
    try:
        return {"outcome": "ok", "value": action()}
    except Exception as exc:
        return {"outcome": type(exc).__name__}
"""


def report(log: str) -> dict[str, Any]:
    """The JSON object the job printed on its last ``REPORT`` line."""
    lines = [line for line in log.splitlines() if line.startswith("REPORT ")]
    assert lines, f"the job printed no report:\n{log}"
    found: dict[str, Any] = json.loads(lines[-1].removeprefix("REPORT "))
    return found


class Tenants:
    """Launches sandboxed jobs of named tenants, each in a working folder of its own."""

    def __init__(self, executor: Executor, root: Path, sandbox: Sandbox) -> None:
        self.executor = executor
        self.root = root
        self.sandbox = sandbox
        self.handles: list[Handle] = []

    def spec(
        self,
        tenant: str,
        code: str,
        *,
        memory_mib: int = 256,
        cpu_milli: int = 1000,
        env: dict[str, str] | None = None,
    ) -> LaunchSpec:
        job_id = f"job-{uuid.uuid4().hex[:10]}"
        workdir = self.root / "job-folders" / job_id / "attempt-0"
        workdir.mkdir(parents=True)
        (workdir / "secret.txt").write_text(f"secret of {tenant}")
        return LaunchSpec(
            job_id=job_id,
            attempt=0,
            command=(sys.executable, "-c", textwrap.dedent(PROBE + code)),
            workdir=workdir,
            env=env or {},
            placement=Placement((Slot("node-a", cpu_milli, memory_mib),)),
            log_path=self.root / "home" / "jobs" / job_id / "attempt-0.log",
            grace_s=2.0,
            tenant=tenant,
        )

    def launch(self, spec: LaunchSpec) -> Handle:
        handle = self.executor.launch(spec)
        self.handles.append(handle)
        return handle

    def run(self, spec: LaunchSpec) -> tuple[ExitStatus, str]:
        status = self.executor.wait(self.launch(spec), 60)
        assert status is not None, "the job did not end within 60 s"
        return status, spec.log_path.read_text()

    def cleanup(self) -> None:
        for handle in self.handles:
            if self.executor.poll(handle) is None:
                self.executor.cancel(handle)
                self.executor.wait(handle, 30)


def make_sandbox(root: Path, **options: Any) -> Sandbox:
    home = root / "home"
    home.mkdir(mode=0o700)
    (home / "token").write_text("the admin token")
    (home / "keys").mkdir(mode=0o700)
    (home / "keys" / "audit.key").write_text("the audit key")
    (home / "shamal.db").write_text("the database")
    (root / "job-folders").mkdir(mode=0o711)
    return Sandbox(hide=(str(home), str(root / "job-folders")), **options)


@pytest.fixture(params=["local", pytest.param("ray", marks=pytest.mark.slow)])
def executor_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def build(kind: str, request: pytest.FixtureRequest, root: Path, sandbox: Sandbox) -> Executor:
    if kind == "ray":
        request.getfixturevalue("ray_cluster")
        return get_executor(
            "ray", start_timeout_s=30.0, node_tmpdir=str(root / "node"), sandbox=sandbox
        )
    return get_executor("local", sandbox=sandbox)


@pytest.fixture
def tenants(
    executor_kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Tenants]:
    sandbox = make_sandbox(tmp_path, pids_max=64, tmp_size_mib=4)
    built = Tenants(build(executor_kind, request, tmp_path, sandbox), tmp_path, sandbox)
    try:
        yield built
    finally:
        built.cleanup()
        built.executor.close()


def host_processes_with(token: str) -> list[int]:
    """Host pids of ``sleep`` commands whose first argument starts with ``token``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes().startswith(b"sleep\0" + token.encode()):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_a_job_runs_as_its_tenants_user_and_reaches_nothing_of_the_server_or_of_others(
    tenants: Tenants, tmp_path: Path
) -> None:
    victim_code = """
import socket, time
service = socket.create_server(("127.0.0.1", 0))  # a debug port, say
print("REPORT " + json.dumps({"port": service.getsockname()[1]}), flush=True)
time.sleep(600)
"""
    victim_spec = tenants.spec("red", victim_code)
    victim = tenants.launch(victim_spec)

    def running() -> bool:
        tenants.executor.poll(victim)  # the Ray executor pulls the output as it polls
        return victim_spec.log_path.exists() and "REPORT" in victim_spec.log_path.read_text()

    wait_for(running, "the red job to run")
    victim_pid = job_command_pid(victim_spec.job_id, 0)
    victim_environ = Path(f"/proc/{victim_pid}/environ").read_bytes()
    assert b"SHAMAL_JOB_ID" in victim_environ  # readable by the server, as it must be
    victim_workdir = Path(os.readlink(f"/proc/{victim_pid}/cwd"))
    victim_port = report(victim_spec.log_path.read_text())["port"]
    home = tmp_path / "home"
    token = home / "token"
    code = f"""
import ctypes, pwd, signal, socket
token, home = {str(token)!r}, {str(home)!r}
libc = ctypes.CDLL(None, use_errno=True)
def attach(pid):
    if libc.ptrace(16, pid, None, None) != 0:  # PTRACE_ATTACH
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return "attached"
audit_key, database = {str(home / "keys" / "audit.key")!r}, {str(home / "shamal.db")!r}
victim_dir, victim_log = {str(victim_workdir)!r}, {str(victim_spec.log_path)!r}
pid, server = {victim_pid}, {os.getpid()}
relative = os.path.relpath(token, os.getcwd())
seen = {{
    "uid": os.getuid(), "user": pwd.getpwuid(os.getuid()).pw_name, "cwd": os.getcwd(),
    "token": probe(lambda: open(token).read()),
    "token_by_relative_path": probe(lambda: open(relative).read()),
    "home_listing": probe(lambda: os.listdir(home)),
    "audit_key": probe(lambda: open(audit_key).read()),
    "database": probe(lambda: open(database).read()),
    "victim_port": probe(lambda: socket.create_connection(("127.0.0.1", {victim_port}), 2)),
    "database_port": probe(lambda: socket.create_connection(("127.0.0.1", 5432), 2)),
    "victim_secret": probe(lambda: open(os.path.join(victim_dir, "secret.txt")).read()),
    "victim_folder": probe(lambda: os.listdir(victim_dir)),
    "victim_log": probe(lambda: open(victim_log).read()),
    "victim_environ": probe(lambda: open(f"/proc/{{pid}}/environ").read()),
    "server_environ": probe(lambda: open(f"/proc/{{server}}/environ").read()),
    "signal_victim": probe(lambda: os.kill(pid, signal.SIGKILL)),
    "stop_victim": probe(lambda: os.kill(pid, signal.SIGSTOP)),
    "trace_victim": probe(lambda: attach(pid)),
    "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "own_secret": probe(lambda: open("secret.txt").read()),
    "write_own_folder": probe(lambda: open("out.txt", "w").write("mine")),
}}
seen["kill_everything"] = probe(lambda: os.kill(-1, signal.SIGKILL))
print("REPORT " + json.dumps(seen), flush=True)
"""
    status, log = tenants.run(tenants.spec("blue", code))
    assert status.reason is ExitReason.SUCCEEDED, log
    seen = report(log)
    blue = pwd.getpwnam("shamal-blue")
    assert (seen["uid"], seen["user"]) == (blue.pw_uid, "shamal-blue")
    assert blue.pw_uid not in (0, os.getuid(), pwd.getpwnam("shamal-red").pw_uid)
    for probe in (
        "token",
        "token_by_relative_path",
        "audit_key",
        "database",
        "victim_secret",
        "victim_folder",
        "victim_log",
        "victim_environ",
        "server_environ",
        "signal_victim",
        "stop_victim",
        "trace_victim",
    ):
        assert seen[probe]["outcome"] in DENIED, (probe, seen[probe])
    # No network: not another job's port, not the database's (without an API to relay to).
    assert seen["victim_port"]["outcome"] == "ConnectionRefusedError"
    assert seen["database_port"]["outcome"] == "ConnectionRefusedError"
    assert seen["home_listing"] in (
        {"outcome": "ok", "value": []},
        {"outcome": "FileNotFoundError"},
    )
    assert os.getpid() not in seen["processes"]
    assert victim_pid not in seen["processes"]
    assert len(seen["processes"]) <= 3  # its init, itself, and nothing else
    assert seen["own_secret"] == {"outcome": "ok", "value": "secret of blue"}
    assert seen["write_own_folder"]["outcome"] == "ok"
    assert "the admin token" not in log
    assert "secret of red" not in log
    # The red job is untouched by all of it: still running, not stopped.
    assert tenants.executor.poll(victim) is None
    state = Path(f"/proc/{victim_pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    assert state in "RS", state


def test_a_job_over_its_memory_fails_out_of_memory(tenants: Tenants) -> None:
    code = """
chunks = []
for _ in range(64):
    chunks.append(bytearray(16 * 1024 * 1024))  # touched: bytearray zero-fills
print("REPORT {\\"survived\\": true}", flush=True)
"""
    status, log = tenants.run(tenants.spec("red", code, memory_mib=96))
    assert status.reason is ExitReason.FAILED, log
    assert status.detail == OUT_OF_MEMORY, (status, log)
    assert "survived" not in log


def test_every_process_a_job_starts_ends_with_it(tenants: Tenants) -> None:
    mark = f"{uuid.uuid4().int % 10**6}.{os.getpid()}"
    code = f"""
import subprocess, time
mark = {mark!r}
subprocess.Popen(["setsid", "sleep", mark + "1"])
nohup = "nohup sleep " + mark + "2 >/dev/null 2>&1 &"
subprocess.Popen(["sh", "-c", nohup])
if os.fork() == 0:  # a daemon by double fork
    os.setsid()
    if os.fork() == 0:
        os.execvp("sleep", ["sleep", mark + "3"])
    os._exit(0)
os.wait()
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    commands = [open(f"/proc/{{p}}/cmdline", "rb").read() for p in pids]
    alive = [c for c in commands if c.startswith(b"sleep\\0" + mark.encode())]
    if len(alive) == 3:
        break
    time.sleep(0.02)
print("REPORT " + json.dumps({{"alive": len(alive)}}), flush=True)
"""
    status, log = tenants.run(tenants.spec("red", code))
    assert status.reason is ExitReason.SUCCEEDED, log
    assert report(log) == {"alive": 3}  # all three escapees ran while the job did
    assert host_processes_with(mark) == []


def test_a_fork_bomb_stops_at_the_process_limit(tenants: Tenants) -> None:
    code = """
import time
children = []
error = None
try:
    for _ in range(200):
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        children.append(pid)
except OSError as exc:
    error = type(exc).__name__
print("REPORT " + json.dumps({"forked": len(children), "error": error}), flush=True)
"""
    status, log = tenants.run(tenants.spec("red", code))
    assert status.reason is ExitReason.SUCCEEDED, log
    seen = report(log)
    assert seen["error"] == "BlockingIOError", seen  # EAGAIN from fork
    assert seen["forked"] < tenants.sandbox.pids_max


def test_the_private_tmp_is_bounded_and_shows_nothing_of_the_hosts(
    tenants: Tenants, tmp_path: Path
) -> None:
    host_file = Path("/tmp") / f"shamal-host-{uuid.uuid4().hex}"  # noqa: S108 - the point
    host_file.write_text("host")
    try:
        code = f"""
def fill():
    with open("/tmp/fill", "wb") as fh:
        for _ in range(16):
            fh.write(b"x" * 1024 * 1024)
            fh.flush()
seen = {{"fill": probe(fill), "host_file": probe(lambda: open({str(host_file)!r}).read())}}
print("REPORT " + json.dumps(seen), flush=True)
"""
        status, log = tenants.run(tenants.spec("red", code))
    finally:
        host_file.unlink()
    assert status.reason is ExitReason.SUCCEEDED, log
    seen = report(log)
    assert seen["fill"]["outcome"] == "OSError", seen  # ENOSPC past tmp_size_mib
    assert seen["host_file"]["outcome"] == "FileNotFoundError"


def test_a_job_gets_no_more_cpu_than_its_request(tenants: Tenants) -> None:
    code = """
import resource, time
start = time.monotonic()
while time.monotonic() - start < 2.0:
    pass
used = resource.getrusage(resource.RUSAGE_SELF)
seen = {"cpu": used.ru_utime + used.ru_stime, "wall": time.monotonic() - start}
print("REPORT " + json.dumps(seen), flush=True)
"""
    status, log = tenants.run(tenants.spec("red", code, cpu_milli=200))
    assert status.reason is ExitReason.SUCCEEDED, log
    seen = report(log)
    assert seen["cpu"] / seen["wall"] < 0.35, seen  # 0.2 of a CPU, with slack


def test_a_server_that_is_not_root_still_hides_its_home_from_its_jobs(tmp_path: Path) -> None:
    """On a laptop the server runs as its user and jobs run as that user too (the operator
    asked for it): the jail then builds its namespaces inside a user namespace. Played
    here by an unprivileged "server" inside a first jail, whose own job probes."""
    laptop = tenant_account("laptop-test")
    outer = tmp_path / "laptop"
    home, work = outer / "home", outer / "work"
    home.mkdir(parents=True, mode=0o700)
    work.mkdir()
    (home / "token").write_text("the laptop's admin token")
    prepare_workdir(outer, laptop)  # the unprivileged "server" owns all of it
    code = PROBE + textwrap.dedent(
        f"""
        import socket
        seen = {{
            "uid": os.getuid(),
            "token": probe(lambda: open({str(home / "token")!r}).read()),
            "processes": len([p for p in os.listdir("/proc") if p.isdigit()]),
            "database_port": probe(lambda: socket.create_connection(("127.0.0.1", 5432), 2)),
        }}
        print("REPORT " + json.dumps(seen), flush=True)
        """
    )
    job = Sandbox(hide=(str(home),), own_users=False, network="none")
    inner = confine(
        sys.executable,
        jail_config(job, workdir=str(work), account=None),
        [sys.executable, "-c", code],
        cgroup=None,
        limits=Limits(memory_bytes=1024 * 1024 * 1024),
    )
    server = Sandbox(hide=(), network="host")
    argv = confine(
        sys.executable,
        jail_config(server, workdir=str(outer), account=laptop),
        inner,
        cgroup=None,
        limits=Limits(),
    )
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    seen = report(done.stdout)
    assert seen["uid"] == 0  # root of its own user namespace: the laptop's user outside
    assert seen["token"]["outcome"] in DENIED
    assert seen["processes"] <= 3
    assert seen["database_port"]["outcome"] == "ConnectionRefusedError"


def test_a_lost_attempt_leaves_no_process_and_no_cgroup_behind(tmp_path: Path) -> None:
    """The supervisor of a sandboxed attempt is killed (as a crash would): the attempt is
    declared lost, and nothing of it is left: not its escapees, not its cgroup."""
    sandbox = make_sandbox(tmp_path)
    executor = get_executor("local", sandbox=sandbox)
    tenants = Tenants(executor, tmp_path, sandbox)
    mark = f"{uuid.uuid4().int % 10**6}.{os.getpid()}"
    code = f"""
import subprocess, time
subprocess.Popen(["setsid", "sleep", {mark!r} + "1"])
print("REPORT {{}}", flush=True)
time.sleep(600)
"""
    spec = tenants.spec("red", code)
    handle = tenants.launch(spec)
    wait_for(lambda: "REPORT" in spec.log_path.read_text(), "the job to run")
    wait_for(lambda: host_processes_with(mark), "its escapee to start")
    name = f"{spec.job_id}-0-r0"
    assert WorkerCgroup.existing(name) is not None
    os.kill(int(handle.data["supervisor"]["pid"]), signal.SIGKILL)
    status = wait_for(lambda: executor.poll(handle), "the attempt to be declared lost")
    assert status.reason is ExitReason.LOST
    assert host_processes_with(mark) == []
    assert WorkerCgroup.existing(name) is None


def test_a_job_can_open_only_the_gpus_it_was_given(tmp_path: Path) -> None:
    """``CUDA_VISIBLE_DEVICES`` is a request a job may ignore: the device files of the
    other GPUs read as ``/dev/null`` in its sandbox (played with files, NVML's index to
    minor number map given)."""
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm"):
        (dev / name).write_text(name)
    minors = {0: 2, 1: 0, 2: 1}  # NVML's order need not be the files'
    files = [str(dev / f"nvidia{n}") for n in range(3)]
    assert masked_gpu_devices([1], minors, dev) == [files[1], files[2]]
    assert masked_gpu_devices([], minors, dev) == files  # a CPU job gets none
    assert masked_gpu_devices([0], None, dev) == []  # no map: its own must not vanish

    account = tenant_account("red")
    work = tmp_path / "work"
    work.mkdir()
    prepare_workdir(work, account)
    sandbox = Sandbox(hide=(), expose=(str(dev),), network="none")
    config = jail_config(
        sandbox, workdir=str(work), account=account, masked=masked_gpu_devices([1], minors, dev)
    )
    code = f"print([open(f).read() for f in {files!r}])"
    argv = confine(
        sys.executable, config, [sys.executable, "-c", code], cgroup=None, limits=Limits()
    )
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['nvidia0', '', '']"


def test_a_job_that_fills_its_folder_is_stopped_at_its_disk_limit(tmp_path: Path) -> None:
    """Its /tmp is bounded by its tmpfs; its working folder, on the host's disk, by the
    supervisor's measure of it: past the limit the job is stopped and fails."""
    sandbox = Sandbox(hide=make_sandbox(tmp_path).hide, disk_mib=8, network="none", pids_max=64)
    tenants = Tenants(get_executor("local", sandbox=sandbox), tmp_path, sandbox)
    code = """
import time
with open("fill", "wb") as fh:
    for _ in range(64):
        fh.write(os.urandom(1024 * 1024))
        fh.flush()
print("wrote 64 MiB", flush=True)
time.sleep(600)
"""
    status, log = tenants.run(tenants.spec("red", code))
    assert (status.reason, status.detail) == (ExitReason.FAILED, DISK_LIMIT), log
    assert "past its limit of 8 MiB" in log
