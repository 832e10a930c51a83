"""The live scheduler loop runs each job on the executor it names: one on local processes, one
on Ray, side by side, through the executors the server's settings build."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from shamal.config import SchedulerSettings, Settings
from shamal.jobs import JobSpec, JobState
from shamal.scheduler.core import get_policy
from shamal.scheduler.live import (
    JobLifecycle,
    SchedulerLoop,
    SchedulerParts,
    effective_settings,
    job_executors,
)
from shamal.security import AuditContext
from shamal.server._platform import Platform

pytestmark = pytest.mark.slow


@pytest.fixture
def settings(tmp_path_factory: pytest.TempPathFactory, database_url: str) -> Settings:
    """A server whose scheduler runs Ray beside its default, local executor."""
    return Settings(
        home=tmp_path_factory.mktemp("home"),
        database_url=database_url,
        allowed_hosts=("*",),
        scheduler=SchedulerSettings(executors=("ray",)),
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_loop_runs_one_job_locally_and_one_on_ray(
    platform: Platform, ray_cluster: None, tmp_path: Path
) -> None:
    admin = platform.security.authenticate(platform.admin_secret or "")
    ctx = AuditContext(action="job.submit", actor=admin.name, principal=admin)
    # Each prints where it runs: the local executor's job folder (.../attempt-N), or the
    # folder a Ray actor unpacked the job into on its node (.../shamal-rank-*/workdir).
    command = ("python", "-c", "import os; print('ran in', os.getcwd())")
    local = platform.jobs.submit(ctx, JobSpec(command=command, cpus=0.5, memory_mib=64))
    on_ray = platform.jobs.submit(
        ctx, JobSpec(command=command, cpus=0.5, memory_mib=64, executor="ray")
    )
    scheduler = effective_settings(platform.settings.scheduler)
    executors = job_executors(scheduler, None)
    parts = SchedulerParts(
        lifecycle=JobLifecycle(platform.db, platform.audit, "routing-test"),
        jobs=platform.jobs,
        artifacts=platform.artifacts,
        executor=executors,
        cluster=platform.cluster,
        settings=scheduler,
        jobs_dir=tmp_path / "jobs",
    )
    loop = SchedulerLoop(parts, get_policy("fifo"))
    loop.recover()
    ended = (JobState.SUCCEEDED, JobState.FAILED, JobState.LOST)
    handles: dict[str, str] = {}
    deadline = time.monotonic() + 90
    while any(platform.jobs.get(admin, j.id).state not in ended for j in (local, on_ray)):
        assert time.monotonic() < deadline, "the jobs did not finish in time"
        loop.tick()
        handles.update({k: t.handle.executor for k, t in loop.tracked.items()})
        time.sleep(0.05)  # the loop's tick interval, shortened; the deadline bounds the wait
    executors.close()
    for job in (local, on_ray):
        done = platform.jobs.get(admin, job.id)
        assert (done.state, done.exit_code) == (JobState.SUCCEEDED, 0), done.reason
    assert handles == {local.id: "local", on_ray.id: "ray"}
    assert platform.jobs.get(admin, on_ray.id).executor == "ray"
    assert platform.jobs.get(admin, local.id).executor is None
    local_log = platform.jobs.read_log(admin, local.id, None, 0).data.decode()
    ray_log = platform.jobs.read_log(admin, on_ray.id, None, 0).data.decode()
    attempt = platform.jobs.get(admin, local.id).attempt
    assert f"ran in {tmp_path / 'jobs' / local.id / f'attempt-{attempt}'}" in local_log, local_log
    assert "/shamal-rank-" in ray_log, ray_log
