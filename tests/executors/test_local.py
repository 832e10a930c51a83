"""What only the local executor promises: surviving the server, pinning GPUs exactly,
cleaning up after a lost supervisor."""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shamal.errors import InvalidParameter
from shamal.executors import ExitReason, Handle, LaunchFailed, get_executor
from shamal.executors._local import LocalExecutor
from shamal.executors._procfs import ProcessIdentity
from shamal.scheduler.core._resources import Slot
from tests.executors.conftest import Jobs, cpu_slot, python
from tests.executors.test_contract import REPORT_ENV, reported_env
from tests.polling import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]

COUNT_STARTS_THEN_WAIT = """
    import os, pathlib, time
    marks = pathlib.Path(os.environ["MARK_DIR"])
    with open(marks / "starts", "a") as fh:
        fh.write("started\\n")
    (marks / "pid").write_text(str(os.getpid()))
    while not (marks / "release").exists():
        time.sleep(0.02)
    print("released")
"""


@pytest.fixture
def local_jobs(tmp_path: Path) -> Iterator[Jobs]:
    helper = Jobs(LocalExecutor(), tmp_path)
    yield helper
    helper.cleanup()


def _alive(pid: str) -> ProcessIdentity:
    identity = ProcessIdentity.of(int(pid))
    assert identity is not None, "the job's process should be running"
    return identity


def test_job_outlives_a_discarded_executor(local_jobs: Jobs) -> None:
    spec = local_jobs.spec(python(COUNT_STARTS_THEN_WAIT))
    stored = LocalExecutor().launch(spec).to_json()  # the launching object is dropped here
    gc.collect()
    wait_until(local_jobs.mark("pid").exists, "the job to start")
    restarted = LocalExecutor()
    handle = restarted.reattach(stored)
    assert handle is not None
    local_jobs.handles.append(handle)
    assert restarted.poll(handle) is None
    local_jobs.mark("release").write_text("go")
    status = restarted.wait(handle, 20)
    assert status is not None
    assert status.reason is ExitReason.SUCCEEDED
    assert local_jobs.mark("starts").read_text() == "started\n"
    assert "released" in spec.log_path.read_text()


def test_job_outlives_its_server_process_being_killed(local_jobs: Jobs) -> None:
    spec = local_jobs.spec(python(COUNT_STARTS_THEN_WAIT))
    request = {
        "job_id": spec.job_id,
        "command": list(spec.command),
        "workdir": str(spec.workdir),
        "log_path": str(spec.log_path),
        "env": dict(spec.env),
        "grace_s": spec.grace_s,
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.executors._launcher", json.dumps(request)],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert server.stdout is not None
    assert server.stdin is not None
    stored = server.stdout.readline().decode()
    server.kill()  # SIGKILL: no cleanup of any kind
    server.wait()
    server.stdout.close()
    server.stdin.close()
    assert stored, "the launcher printed no handle"

    wait_until(local_jobs.mark("pid").exists, "the job to start")
    restarted = LocalExecutor()
    handle = restarted.reattach(stored)
    assert handle is not None
    local_jobs.handles.append(handle)
    assert restarted.poll(handle) is None
    # A restarted server that launches the same attempt again gets the same run.
    assert restarted.launch(spec) == handle
    local_jobs.mark("release").write_text("go")
    status = restarted.wait(handle, 20)
    assert status is not None
    assert status.reason is ExitReason.SUCCEEDED
    assert local_jobs.mark("starts").read_text() == "started\n"


def test_preemption_grace_runs_without_the_server(local_jobs: Jobs) -> None:
    ignore_term = """
        import os, pathlib, signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        (pathlib.Path(os.environ["MARK_DIR"]) / "ready").write_text("1")
        while True:
            time.sleep(0.05)
    """
    first = LocalExecutor()
    handle = first.launch(local_jobs.spec(python(ignore_term)))
    local_jobs.handles.append(handle)
    wait_until(local_jobs.mark("ready").exists, "the job to ignore SIGTERM")
    first.preempt(handle, grace_s=0.3)
    del first
    status = LocalExecutor().wait(handle, 20)
    assert status is not None
    assert status.reason is ExitReason.PREEMPTED
    assert status.exit_codes == (-9,)


def test_killed_supervisor_means_lost_and_no_orphans(local_jobs: Jobs) -> None:
    handle = local_jobs.launch(local_jobs.spec(python(COUNT_STARTS_THEN_WAIT)))
    worker = _alive(local_jobs.written("pid", "the job to start"))
    supervisor = ProcessIdentity.from_dict(handle.data["supervisor"])
    os.kill(supervisor.pid, signal.SIGKILL)
    wait_until(lambda: not supervisor.is_alive(), "the supervisor to die")
    assert worker.is_alive()  # orphaned, still running

    restarted = LocalExecutor()
    assert restarted.reattach(handle.to_json()) is None
    wait_until(lambda: not worker.is_alive(), "the orphaned worker to be killed")
    status = restarted.poll(handle)
    assert status is not None
    assert status.reason is ExitReason.LOST
    assert status.exit_codes == (None,)
    assert restarted.reattach(handle.to_json()) is None  # and stays lost


def test_leftover_children_are_killed_at_the_end(local_jobs: Jobs) -> None:
    leave_a_child = """
        import os, pathlib, subprocess, sys
        forever = "import time\\nwhile True: time.sleep(0.05)"
        child = subprocess.Popen([sys.executable, "-c", forever])
        (pathlib.Path(os.environ["MARK_DIR"]) / "pid").write_text(str(child.pid))
    """
    status = local_jobs.run(local_jobs.spec(python(leave_a_child)))
    assert status.reason is ExitReason.SUCCEEDED
    pid = int(local_jobs.mark("pid").read_text())
    identity = ProcessIdentity.of(pid)
    wait_until(lambda: identity is None or not identity.is_alive(), "the grandchild to die")


def test_gpu_pinning_follows_the_slots(tmp_path: Path) -> None:
    def fake_mig(gpu: int, start: int, profile: str) -> str:
        return f"MIG-fake-{gpu}-{start}-{profile}"

    jobs = Jobs(LocalExecutor(resolve_mig=fake_mig), tmp_path)
    slots = (
        Slot("node-a", 500, 64, gpus=(1, 3)),
        Slot("node-a", 500, 64, gpus=(2,), gpu_milli=250),
        Slot("node-b", 500, 64, gpus=(0,), mig_profile="1g.10gb", mig_start=3),
        cpu_slot("node-b"),
    )
    spec = jobs.spec(python(REPORT_ENV), slots=slots)
    assert jobs.run(spec).reason is ExitReason.SUCCEEDED
    env = reported_env(spec.log_path.read_text())
    assert [env[f"[rank {r}]"]["CUDA_VISIBLE_DEVICES"] for r in range(4)] == [
        "1,3",
        "2",
        "MIG-fake-0-3-1g.10gb",
        "",
    ]
    assert env["[rank 1]"]["SHAMAL_GPU_FRACTION"] == "0.25"
    assert env["[rank 0]"]["SHAMAL_GPU_FRACTION"] is None
    # Two nodes, two workers each: local ranks restart on each node.
    assert [env[f"[rank {r}]"]["LOCAL_RANK"] for r in range(4)] == ["0", "1", "0", "1"]
    assert {env[f"[rank {r}]"]["LOCAL_WORLD_SIZE"] for r in range(4)} == {"2"}


def test_device_ids_override_the_slot(tmp_path: Path) -> None:
    jobs = Jobs(LocalExecutor(), tmp_path)
    base = jobs.spec(python(REPORT_ENV), slots=(Slot("node-a", 500, 64, gpus=(0,)),))
    spec = dataclasses.replace(base, device_ids={0: ("GPU-1234",)})
    assert jobs.run(spec).reason is ExitReason.SUCCEEDED
    assert reported_env(spec.log_path.read_text())[""]["CUDA_VISIBLE_DEVICES"] == "GPU-1234"


def test_missing_mig_slice_fails_the_launch_and_leaves_nothing(tmp_path: Path) -> None:
    def no_such_slice(gpu: int, start: int, profile: str) -> str:
        raise LookupError(f"no {profile} at {start} of GPU {gpu}")

    jobs = Jobs(LocalExecutor(resolve_mig=no_such_slice), tmp_path)
    mig = Slot("node-a", 500, 64, gpus=(0,), mig_profile="2g.20gb", mig_start=2)
    spec = jobs.spec(python("print('ran')"), slots=(mig,))
    with pytest.raises(LaunchFailed, match="MIG"):
        jobs.executor.launch(spec)
    retry = Jobs(LocalExecutor(resolve_mig=lambda g, s, p: "MIG-ok"), tmp_path / "retry")
    assert retry.run(spec).reason is ExitReason.SUCCEEDED  # the failed launch left no marker


def test_supervisor_that_cannot_start_fails_the_launch(local_jobs: Jobs) -> None:
    spec = local_jobs.spec(python("print('ran')"))
    with pytest.raises(LaunchFailed):
        LocalExecutor(python="/bin/false").launch(spec)
    assert local_jobs.run(spec).reason is ExitReason.SUCCEEDED


def test_foreign_or_malformed_handles_are_refused() -> None:
    executor = LocalExecutor()
    with pytest.raises(InvalidParameter):
        executor.reattach("{not json")
    ray_handle = Handle("ray", "j", 0, Path("/tmp/x.log"), {"namespace": "n", "actors": []})
    with pytest.raises(InvalidParameter):
        executor.reattach(ray_handle.to_json())
    with pytest.raises(InvalidParameter):
        executor.poll(Handle("local", "j", 0, Path("/tmp/x.log"), {}))


def test_get_executor_by_name() -> None:
    assert get_executor("local").name == "local"
    with pytest.raises(InvalidParameter, match="unknown executor"):
        get_executor("slurm-of-the-future")
