"""A scheduler that never comes back is not waited for: a live one adopts its jobs.

Every scheduler beats a heartbeat; the jobs of one silent for longer than the lease are
adopted (a compare-and-set under the scheduling lock, audited) and then re-attached, or
declared lost and retried. Clocks are injected: no test waits for a lease to run out.
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from shamal.jobs import JobSpec, JobState
from shamal.scheduler.live import JobLifecycle, SchedulerLoop, effective_settings
from shamal.security import AuditContext
from shamal.server._platform import Platform
from tests.scheduler.live.test_lifecycle import PLACEMENT, _run, _submit, local_loop


class Clock:
    """A clock that stands still until moved."""

    def __init__(self) -> None:
        self.now = datetime(2030, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def test_only_a_silent_schedulers_jobs_are_adopted_and_by_one_survivor(
    platform: Platform,
) -> None:
    clock = Clock()
    a, b, c = (JobLifecycle(platform.db, platform.audit, n, clock) for n in ("a", "b", "c"))
    for life in (a, b, c):
        life.heartbeat()
    running = _run(a, _submit(platform))
    admitted = a.admit(_submit(platform).id, PLACEMENT, "test")
    assert admitted is not None
    mine = b.admit(_submit(platform).id, PLACEMENT, "test")
    assert mine is not None
    clock.now += timedelta(seconds=59)  # a is silent from here on
    assert b.adopt_orphans(60) == []  # a is within its lease
    clock.now += timedelta(seconds=2)
    b.heartbeat()
    adopted = b.adopt_orphans(60)
    assert sorted(job.id for job in adopted) == sorted([running.id, admitted.id])
    assert {(job.claimed_by, job.state) for job in adopted} == {
        ("b", JobState.RUNNING),
        ("b", JobState.ADMITTED),
    }
    assert all(job.attempt == 1 for job in adopted)  # the attempt goes on: nothing restarted
    c.heartbeat()
    assert c.adopt_orphans(60) == []  # b is alive: its jobs, old and adopted, stay its own
    assert a.mine() == []  # a, coming back, finds they are no longer its jobs
    audited = [e for e in platform.audit.entries(limit=50) if e.action == "job.adopted"]
    assert sorted(e.target for e in audited) == sorted(f"job:{j.id}" for j in adopted)
    assert {e.detail["from"] for e in audited} == {"a"}
    assert platform.audit.verify().ok


def test_a_claim_from_before_leases_is_adopted(platform: Platform) -> None:
    clock = Clock()
    old = JobLifecycle(platform.db, platform.audit, "never-beat", clock)
    job = _run(old, _submit(platform))
    survivor = JobLifecycle(platform.db, platform.audit, "b", clock)
    survivor.heartbeat()
    assert [j.id for j in survivor.adopt_orphans(60)] == [job.id]


@pytest.mark.slow
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_survivor_reattaches_to_the_running_job_and_finishes_it(
    platform: Platform, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    script = tmp_path / "wait.py"
    script.write_text(
        "import pathlib, sys, time\n"
        f"go = pathlib.Path({str(go)!r})\n"
        "while not go.exists():\n"
        "    time.sleep(0.02)\n"
        "print('finished by whoever watches')\n"
    )
    admin = platform.security.authenticate(platform.admin_secret or "")
    ctx = AuditContext(action="job.submit", actor=admin.name, principal=admin)
    spec = JobSpec(command=(sys.executable, str(script)), cpus=0.5, memory_mib=64)
    job = platform.jobs.submit(ctx, spec)
    settings = effective_settings(platform.settings.scheduler)

    def loop(name: str, clock: Clock | None) -> SchedulerLoop:
        life = JobLifecycle(platform.db, platform.audit, name, *([clock] if clock else []))
        return local_loop(platform, life, tmp_path / "jobs")

    first = loop("first", None)
    first.recover()
    deadline = time.monotonic() + 60
    while platform.jobs.get(admin, job.id).state is not JobState.RUNNING:
        assert time.monotonic() < deadline, "the job did not start"
        first.tick()
    # `first` dies here: it never ticks again. A survivor whose clock is past the lease:
    later = Clock()
    later.now = datetime.now(UTC) + timedelta(seconds=settings.lease_s + 5)
    survivor = loop("survivor", later)
    survivor.recover()
    assert survivor.adopt_orphans() == [job.id]
    assert job.id in survivor.tracked  # re-attached to the running attempt, not restarted
    first.tick()  # were `first` only slow, not dead, it now lets go of the job
    assert job.id not in first.tracked
    go.touch()
    while platform.jobs.get(admin, job.id).state is not JobState.SUCCEEDED:
        assert time.monotonic() < deadline, "the adopted job did not finish"
        survivor.tick()
        time.sleep(0.05)  # the loop's tick interval, shortened; the deadline bounds the wait
    done = platform.jobs.get(admin, job.id)
    assert (done.attempt, done.claimed_by, done.exit_code) == (1, "survivor", 0)
    log = platform.jobs.read_log(admin, job.id, None, 0).data.decode()
    assert "finished by whoever watches" in log
