"""The executor contract, run against every executor (``local``, and ``ray`` on a local
Ray cluster). Jobs are tiny Python programs; the test and the job meet through marker
files, never through sleeps."""

from __future__ import annotations

import json
import time

import pytest

from shamal.executors import REQUEUE_EXIT_CODE, Executor, ExitReason, Handle
from shamal.scheduler.core._resources import Slot
from tests import needs
from tests.executors.conftest import Jobs, cpu_slot, python
from tests.polling import wait_until

TRAP_SIGTERM = """
    import os, pathlib, signal, sys, time
    marks = pathlib.Path(os.environ["MARK_DIR"])
    def on_term(signum, frame):
        (marks / "checkpoint").write_text("saved")
        sys.exit(int(os.environ.get("EXIT_ON_TERM", "75")))
    signal.signal(signal.SIGTERM, on_term)
    (marks / "ready").write_text("1")
    while True:
        time.sleep(0.05)
"""

IGNORE_SIGTERM = """
    import os, pathlib, signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    (pathlib.Path(os.environ["MARK_DIR"]) / "ready").write_text("1")
    while True:
        time.sleep(0.05)
"""

RUN_FOREVER = """
    import os, pathlib, time
    marks = pathlib.Path(os.environ["MARK_DIR"])
    (marks / ("ready-" + os.environ.get("RANK", "0"))).write_text("1")
    while True:
        time.sleep(0.05)
"""

REPORT_ENV = """
    import json, os
    names = ["CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "MASTER_ADDR", "MASTER_PORT",
             "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SHAMAL_JOB_ID",
             "SHAMAL_ATTEMPT", "SHAMAL_TOKEN", "SHAMAL_SERVER_SECRET", "JOB_SETTING",
             "SHAMAL_GPU_FRACTION"]
    print("ENV " + json.dumps({n: os.environ.get(n) for n in names}))
"""


def reported_env(log: str) -> dict[str, dict[str, str | None]]:
    """The ``ENV {...}`` line of each rank in a log, by rank prefix ("" for one worker)."""
    found = {}
    for line in log.splitlines():
        prefix, sep, payload = line.partition("ENV ")
        if sep:
            found[prefix.strip()] = json.loads(payload)
    return found


def test_success_and_logs(jobs: Jobs) -> None:
    spec = jobs.spec(python("import sys; print('to stdout'); print('to stderr', file=sys.stderr)"))
    status = jobs.run(spec)
    assert status.reason is ExitReason.SUCCEEDED
    assert status.exit_codes == (0,)
    assert not status.requeue
    log = spec.log_path.read_text()
    assert "to stdout\n" in log
    assert "to stderr\n" in log
    assert "[rank" not in log  # one worker: no prefixes


def test_starts_in_the_snapshot(jobs: Jobs) -> None:
    spec = jobs.spec(python("print(open('train.py').read().strip())"))
    assert jobs.run(spec).reason is ExitReason.SUCCEEDED
    assert "snapshot file" in spec.log_path.read_text()


def test_failure_reports_exit_code(jobs: Jobs) -> None:
    status = jobs.run(jobs.spec(python("import sys; sys.exit(3)")))
    assert status.reason is ExitReason.FAILED
    assert status.exit_code == 3
    assert status.culprit_rank == 0
    assert not status.requeue


def test_requeue_exit_code_asks_for_requeue(jobs: Jobs) -> None:
    status = jobs.run(jobs.spec(python(f"import sys; sys.exit({REQUEUE_EXIT_CODE})")))
    assert status.exit_code == REQUEUE_EXIT_CODE
    assert status.requeue


def test_command_not_found_fails_with_127(jobs: Jobs) -> None:
    status = jobs.run(jobs.spec(("/nonexistent/shamal-test-binary",)))
    assert status.reason is ExitReason.FAILED
    assert status.exit_code == 127


def test_time_limit_stops_the_job(jobs: Jobs) -> None:
    spec = jobs.spec(python(TRAP_SIGTERM), time_limit_s=1.0, grace_s=5.0, env={"EXIT_ON_TERM": "9"})
    started = time.monotonic()
    status = jobs.run(spec)
    assert status.reason is ExitReason.TIMEOUT
    assert not status.requeue
    assert time.monotonic() - started >= 1.0
    assert jobs.mark("checkpoint").read_text() == "saved"  # SIGTERM came first
    assert status.exit_code == 9


def test_preempt_delivers_sigterm_and_requeues(executor: Executor, jobs: Jobs) -> None:
    handle = jobs.launch(jobs.spec(python(TRAP_SIGTERM)))
    wait_until(jobs.mark("ready").exists, "the job to trap SIGTERM")
    executor.preempt(handle, grace_s=10.0)
    status = executor.wait(handle, 20)
    assert status is not None
    assert status.reason is ExitReason.PREEMPTED
    assert status.requeue
    assert status.exit_codes == (REQUEUE_EXIT_CODE,)
    assert jobs.mark("checkpoint").read_text() == "saved"


def test_preempt_kills_after_the_grace_period(executor: Executor, jobs: Jobs) -> None:
    handle = jobs.launch(jobs.spec(python(IGNORE_SIGTERM)))
    wait_until(jobs.mark("ready").exists, "the job to ignore SIGTERM")
    asked = time.monotonic()
    executor.preempt(handle, grace_s=0.5)
    status = executor.wait(handle, 20)
    assert status is not None
    assert time.monotonic() - asked >= 0.5
    assert status.reason is ExitReason.PREEMPTED
    assert status.exit_codes == (-9,)
    assert status.requeue


def test_cancel(executor: Executor, jobs: Jobs) -> None:
    handle = jobs.launch(jobs.spec(python(RUN_FOREVER)))
    wait_until(jobs.mark("ready-0").exists, "the job to start")
    executor.cancel(handle)
    status = executor.wait(handle, 20)
    assert status is not None
    assert status.reason is ExitReason.KILLED
    assert not status.requeue
    assert status.exit_codes == (-15,)


def test_control_after_the_end_changes_nothing(executor: Executor, jobs: Jobs) -> None:
    handle = jobs.launch(jobs.spec(python("pass")))
    first = executor.wait(handle, 20)
    executor.preempt(handle, grace_s=0)
    executor.cancel(handle)
    assert first is not None
    assert first.reason is ExitReason.SUCCEEDED
    assert executor.poll(handle) == first


def test_gang_environment_and_prefixed_logs(jobs: Jobs, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHAMAL_SERVER_SECRET", "must-not-leak")
    monkeypatch.setenv("SHAMAL_TOKEN", "the-servers-own")
    gpu_slot = Slot(node="node-a", cpu_milli=500, memory_mib=64, gpus=(1,))
    spec = jobs.spec(
        python(REPORT_ENV),
        slots=(gpu_slot, cpu_slot()),
        env={"JOB_SETTING": "on", "SHAMAL_TOKEN": "job-scoped"},
    )
    assert jobs.run(spec).reason is ExitReason.SUCCEEDED
    env = reported_env(spec.log_path.read_text())
    assert set(env) == {"[rank 0]", "[rank 1]"}
    rank0, rank1 = env["[rank 0]"], env["[rank 1]"]
    for rank, seen in enumerate((rank0, rank1)):
        assert seen["RANK"] == str(rank)
        assert seen["WORLD_SIZE"] == "2"
        assert seen["LOCAL_RANK"] == str(rank)  # both on one node
        assert seen["LOCAL_WORLD_SIZE"] == "2"
        assert seen["SHAMAL_JOB_ID"] == spec.job_id
        assert seen["SHAMAL_ATTEMPT"] == "0"
        assert seen["JOB_SETTING"] == "on"
        assert seen["SHAMAL_TOKEN"] == "job-scoped"  # what the job was given, not ours
        assert seen["SHAMAL_SERVER_SECRET"] is None
        assert seen["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert rank0["MASTER_ADDR"] == rank1["MASTER_ADDR"]
    assert rank0["MASTER_ADDR"]
    assert rank0["MASTER_PORT"] == rank1["MASTER_PORT"]
    assert 0 < int(rank0["MASTER_PORT"] or 0) < 65536
    # Rank 0 holds one GPU, rank 1 none: a CPU worker must not see any GPU.
    assert len((rank0["CUDA_VISIBLE_DEVICES"] or "").split(",")) == 1
    assert rank0["CUDA_VISIBLE_DEVICES"] != ""
    assert rank1["CUDA_VISIBLE_DEVICES"] == ""


GLOO_ALL_REDUCE = """
    import torch
    import torch.distributed as dist
    from shamal.train import init_distributed, shutdown
    info = init_distributed()
    total = torch.tensor([float(info.rank + 1)])
    dist.all_reduce(total)
    print(f"ALLREDUCE rank={info.rank} world={info.world_size} sum={total.item():g}")
    shutdown()
"""


def test_a_gang_joins_one_gloo_process_group(jobs: Jobs) -> None:
    """Distributed training on either executor: the ranks rendezvous through the variables
    the executor set (MASTER_ADDR/PORT, RANK, WORLD_SIZE) and all-reduce over gloo."""
    needs.module("torch")
    spec = jobs.spec(python(GLOO_ALL_REDUCE), slots=(cpu_slot(), cpu_slot()))
    status = jobs.run(spec, timeout=120.0)
    log = spec.log_path.read_text()
    assert status.reason is ExitReason.SUCCEEDED, log[-3000:]
    results = sorted(
        line.split("ALLREDUCE ", 1)[1] for line in log.splitlines() if "ALLREDUCE " in line
    )
    assert results == ["rank=0 world=2 sum=3", "rank=1 world=2 sum=3"], log[-3000:]


def test_single_worker_gets_no_gang_variables(jobs: Jobs) -> None:
    spec = jobs.spec(python(REPORT_ENV))
    assert jobs.run(spec).reason is ExitReason.SUCCEEDED
    seen = reported_env(spec.log_path.read_text())[""]
    assert seen["WORLD_SIZE"] is None
    assert seen["MASTER_ADDR"] is None
    assert seen["CUDA_VISIBLE_DEVICES"] == ""
    assert seen["SHAMAL_JOB_ID"] == spec.job_id


def test_gang_fails_together(jobs: Jobs) -> None:
    fail_when_peer_runs = """
        import os, pathlib, sys, time
        marks = pathlib.Path(os.environ["MARK_DIR"])
        if os.environ["RANK"] == "1":
            while not (marks / "ready-0").exists():
                time.sleep(0.01)
            print("giving up")
            sys.exit(3)
        (marks / "ready-0").write_text("1")
        while True:
            time.sleep(0.05)
    """
    spec = jobs.spec(python(fail_when_peer_runs), slots=(cpu_slot(), cpu_slot()), grace_s=5.0)
    status = jobs.run(spec)
    assert status.reason is ExitReason.FAILED
    assert status.culprit_rank == 1
    assert status.exit_code == 3
    assert status.exit_codes == (-15, 3)  # rank 0 was stopped with SIGTERM
    assert "[rank 1] giving up\n" in spec.log_path.read_text()


def test_launch_is_idempotent(executor: Executor, jobs: Jobs) -> None:
    count_starts = """
        import os, pathlib, time
        marks = pathlib.Path(os.environ["MARK_DIR"])
        with open(marks / "starts", "a") as fh:
            fh.write("started\\n")
        while not (marks / "release").exists():
            time.sleep(0.02)
    """
    spec = jobs.spec(python(count_starts))
    first = jobs.launch(spec)
    again = executor.launch(spec)
    assert again == first
    wait_until(jobs.mark("starts").exists, "the job to start")
    jobs.mark("release").write_text("go")
    status = executor.wait(first, 20)
    assert status is not None
    assert status.reason is ExitReason.SUCCEEDED
    assert jobs.mark("starts").read_text() == "started\n"


def test_reattach_from_json_with_a_new_executor(executor: Executor, jobs: Jobs) -> None:
    from shamal.executors import get_executor

    handle = jobs.launch(jobs.spec(python(RUN_FOREVER)))
    stored = handle.to_json()
    wait_until(jobs.mark("ready-0").exists, "the job to start")
    fresh = get_executor(executor.name)
    try:
        found = fresh.reattach(stored)
        assert found == Handle.from_json(stored)
        assert fresh.poll(found) is None  # still running
        fresh.cancel(found)
        status = fresh.wait(found, 20)
        assert status is not None
        assert status.reason is ExitReason.KILLED
        assert executor.poll(handle) == status  # the old object sees the same truth
    finally:
        fresh.close()
