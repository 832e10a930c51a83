"""The live scheduler loop drives the same jobs through either executor (local, Ray)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from shamal.executors import Executor, get_executor
from shamal.jobs import JobSpec, JobState, snapshot
from shamal.scheduler.core import get_policy
from shamal.scheduler.live import JobLifecycle, SchedulerLoop, SchedulerParts, effective_settings
from shamal.security import AuditContext
from shamal.server._platform import Platform


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_loop_runs_a_snapshot_job_to_success(
    platform: Platform, executor: Executor, tmp_path: Path
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("import os\nprint('trained', os.environ['SHAMAL_JOB_ID'])\n")
    built = snapshot.build(code, tmp_path)
    admin = platform.security.authenticate(platform.admin_secret or "")
    ctx = AuditContext(action="job.snapshot", actor=admin.name, principal=admin)
    with built.path.open("rb") as handle:
        platform.jobs.store_snapshot(ctx, built.digest, iter(lambda: handle.read(65536), b""))
    ctx = AuditContext(action="job.submit", actor=admin.name, principal=admin)
    spec = JobSpec(command=("python", "train.py"), cpus=0.5, memory_mib=64, snapshot=built.digest)
    job = platform.jobs.submit(ctx, spec)
    parts = SchedulerParts(
        lifecycle=JobLifecycle(platform.db, platform.audit, "loop-test"),
        jobs=platform.jobs,
        artifacts=platform.artifacts,
        executor=executor,
        cluster=platform.cluster,
        settings=effective_settings(platform.settings.scheduler),
        jobs_dir=tmp_path / "jobs",
    )
    loop = SchedulerLoop(parts, get_policy("fifo"))
    loop.recover()
    deadline = time.monotonic() + 60
    while platform.jobs.get(admin, job.id).state not in (JobState.SUCCEEDED, JobState.FAILED):
        assert time.monotonic() < deadline, "the job did not finish in time"
        loop.tick()
        time.sleep(0.05)  # the loop's tick interval, shortened; the deadline bounds the wait
    done = platform.jobs.get(admin, job.id)
    assert (done.state, done.exit_code) == (JobState.SUCCEEDED, 0)
    log = platform.jobs.read_log(admin, job.id, None, 0)
    assert f"trained {job.id}" in log.data.decode()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_jobs_of_one_snapshot_share_its_unpacked_tree_and_never_change_it(
    platform: Platform, tmp_path: Path
) -> None:
    """The snapshot is unpacked once, in the server's folder; each job gets a copy of its
    own: a job that rewrites its code leaves the next job's untouched."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(
        "print('original')\nopen('train.py', 'w').write('raise SystemExit(3)\\n')\n"
    )
    built = snapshot.build(code, tmp_path)
    admin = platform.security.authenticate(platform.admin_secret or "")
    ctx = AuditContext(action="job.snapshot", actor=admin.name, principal=admin)
    with built.path.open("rb") as handle:
        platform.jobs.store_snapshot(ctx, built.digest, iter(lambda: handle.read(65536), b""))
    ctx = AuditContext(action="job.submit", actor=admin.name, principal=admin)
    spec = JobSpec(command=("python", "train.py"), cpus=0.5, memory_mib=64, snapshot=built.digest)
    jobs_dir = tmp_path / "jobs"
    executor = get_executor("local")
    parts = SchedulerParts(
        lifecycle=JobLifecycle(platform.db, platform.audit, "loop-test"),
        jobs=platform.jobs,
        artifacts=platform.artifacts,
        executor=executor,
        cluster=platform.cluster,
        settings=effective_settings(platform.settings.scheduler),
        jobs_dir=jobs_dir,
    )
    loop = SchedulerLoop(parts, get_policy("fifo"))
    loop.recover()
    try:
        for _ in range(2):  # one after the other: the second starts from the shared tree
            job = platform.jobs.submit(ctx, spec)
            deadline = time.monotonic() + 60
            while platform.jobs.get(admin, job.id).state not in (
                JobState.SUCCEEDED,
                JobState.FAILED,
            ):
                assert time.monotonic() < deadline, "the job did not finish in time"
                loop.tick()
                time.sleep(0.05)  # the loop's tick interval, shortened; bounded by the deadline
            done = platform.jobs.get(admin, job.id)
            assert (done.state, done.exit_code) == (JobState.SUCCEEDED, 0)
            assert "original" in platform.jobs.read_log(admin, job.id, None, 0).data.decode()
    finally:
        executor.close()
    shared = jobs_dir / ".snapshots" / built.digest / "train.py"
    assert shared.read_text() == (code / "train.py").read_text()
