"""The scheduler's side of jobs: claims are compare-and-set, every step is recorded and audited."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from shamal.executors import get_executor
from shamal.jobs import JobSpec, JobState
from shamal.jobs._entities import Job
from shamal.jobs._store import Attempt
from shamal.scheduler.core import get_policy
from shamal.scheduler.core._admission import decayed_usage
from shamal.scheduler.live import JobLifecycle, SchedulerLoop, SchedulerParts, effective_settings
from shamal.security import AuditContext
from shamal.server._platform import Platform

PLACEMENT = {"slots": [{"node": "n1", "cpu_milli": 500, "memory_mib": 64, "gpus": []}]}


def _submit(platform: Platform, **options: object) -> Job:
    admin = platform.security.authenticate(platform.admin_secret or "")
    ctx = AuditContext(action="job.submit", actor=admin.name, principal=admin)
    spec = JobSpec(command=("true",), cpus=0.5, memory_mib=64, **options)  # type: ignore[arg-type]
    return platform.jobs.submit(ctx, spec)


def _attempt(job: Job, started: datetime) -> Attempt:
    return Attempt(
        job.id,
        job.attempt,
        job.team,
        job.user,
        "local",
        ("n1",),
        500,
        64,
        0,
        started,
        None,
        None,
        None,
    )


def _run(life: JobLifecycle, job: Job) -> Job:
    admitted = life.admit(job.id, PLACEMENT, "test")
    assert admitted is not None
    running = life.started(admitted, {"pid": 1}, _attempt(admitted, life.now()))
    assert running is not None
    return running


def local_loop(
    platform: Platform,
    life: JobLifecycle,
    jobs_dir: Path,
    policy: str = "fifo",
    *,
    clock: Callable[[], float] | None = None,
    **settings: object,
) -> SchedulerLoop:
    """A scheduler loop on the local executor, as ``life``, with ``settings`` changed."""
    effective = effective_settings(platform.settings.scheduler).model_copy(update=settings)
    parts = SchedulerParts(
        life,
        platform.jobs,
        platform.artifacts,
        get_executor("local"),
        platform.cluster,
        effective,
        jobs_dir,
    )
    if clock is None:
        return SchedulerLoop(parts, get_policy(policy))
    return SchedulerLoop(parts, get_policy(policy), clock=clock)


def test_a_job_goes_through_its_states_and_each_is_recorded(platform: Platform) -> None:
    life = JobLifecycle(platform.db, platform.audit, "s1")
    job = _run(life, _submit(platform))
    assert (job.state, job.attempt, job.claimed_by, dict(job.handle or {})) == (
        JobState.RUNNING,
        1,
        "s1",
        {"pid": 1},
    )
    assert [j.id for j in life.mine()] == [job.id]
    done = life.ended(job, JobState.SUCCEEDED, reason="exited 0", exit_code=0)
    assert done is not None
    assert (done.state, done.exit_code, done.handle, done.finished_at is not None) == (
        JobState.SUCCEEDED,
        0,
        None,
        True,
    )
    assert done.attained_s >= 0
    events = platform.jobs.events(
        platform.security.authenticate(platform.admin_secret or ""), job.id
    )
    assert [e.to_state for e in events] == [
        JobState.QUEUED,
        JobState.ADMITTED,
        JobState.RUNNING,
        JobState.SUCCEEDED,
    ]
    assert life.ended(done, JobState.FAILED, reason="late") is None  # already over
    audited = [e.action for e in platform.audit.entries(limit=20) if e.target == f"job:{job.id}"]
    assert audited[:3] == ["job.succeeded", "job.running", "job.admitted"]
    assert platform.audit.verify().ok


def test_preemption_requeues_without_using_a_retry_and_failures_retry_until_the_limit(
    platform: Platform,
) -> None:
    life = JobLifecycle(platform.db, platform.audit, "s1")
    job = _run(life, _submit(platform, retries=1))
    requeued = life.ended(job, JobState.PREEMPTED, reason="priority")
    assert requeued is not None
    assert (requeued.state, requeued.preemptions, requeued.retries_used) == (JobState.QUEUED, 1, 0)
    assert (requeued.claimed_by, requeued.placement) == (None, None)
    failed_once = life.ended(_run(life, requeued), JobState.FAILED, reason="exit 1", exit_code=1)
    assert failed_once is not None
    assert (failed_once.state, failed_once.retries_used, failed_once.attempt) == (
        JobState.QUEUED,
        1,
        2,
    )
    final = life.ended(_run(life, failed_once), JobState.FAILED, reason="exit 1", exit_code=1)
    assert final is not None
    assert (final.state, final.attempt, final.retries_used) == (JobState.FAILED, 3, 1)


def test_claims_race_and_exactly_one_scheduler_wins(platform: Platform) -> None:
    jobs = [_submit(platform) for _ in range(6)]
    names = [f"s{i}" for i in range(4)]
    wins: dict[str, list[str]] = {name: [] for name in names}
    barrier = threading.Barrier(len(names))

    def claim_all(name: str) -> None:
        life = JobLifecycle(platform.db, platform.audit, name)
        barrier.wait()
        for job in jobs:
            if life.admit(job.id, PLACEMENT, "race") is not None:
                wins[name].append(job.id)

    threads = [threading.Thread(target=claim_all, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    claimed = sorted(job_id for ids in wins.values() for job_id in ids)
    assert claimed == sorted(job.id for job in jobs)  # every job claimed exactly once
    life = JobLifecycle(platform.db, platform.audit, "check")
    for job in jobs:
        stored = life.get(job.id)
        assert stored.state is JobState.ADMITTED
        assert stored.attempt == 1
        assert job.id in wins[stored.claimed_by or ""]


def test_unclaim_gives_a_never_started_job_back(platform: Platform) -> None:
    life = JobLifecycle(platform.db, platform.audit, "s1")
    admitted = life.admit(_submit(platform).id, PLACEMENT, "test")
    assert admitted is not None
    back = life.unclaim(admitted, "scheduler restarted")
    assert back is not None
    assert (back.state, back.attempt, back.claimed_by) == (JobState.QUEUED, 0, None)
    assert life.started(back, {}, _attempt(back, life.now())) is None  # not admitted any more
    from shamal.jobs import _store

    with platform.db.unit_of_work() as s, pytest.raises(ValueError, match="cannot become"):
        _store.transition(
            s, back.id, JobState.QUEUED, JobState.RUNNING, at=life.now(), actor="x", reason=""
        )


def test_a_claim_rechecks_capacity_under_the_lock(platform: Platform) -> None:
    life = JobLifecycle(platform.db, platform.audit, "s1")
    first, second = _submit(platform), _submit(platform)

    def one_at_a_time(active: Sequence[Job]) -> bool:
        return not active

    assert life.admit(first.id, PLACEMENT, "test", fits=one_at_a_time) is not None
    assert life.admit(second.id, PLACEMENT, "test", fits=one_at_a_time) is None
    assert life.get(second.id).state is JobState.QUEUED


def test_the_predictor_report_replays_history_honestly(platform: Platform) -> None:
    life = JobLifecycle(platform.db, platform.audit, "s1")
    admin = platform.security.authenticate(platform.admin_secret or "")
    assert platform.jobs.predictor_report(admin)["n"] == 0
    for _ in range(3):
        job = _run(life, _submit(platform))
        assert life.ended(job, JobState.SUCCEEDED, reason="exited 0", exit_code=0) is not None
    failed = _run(life, _submit(platform))
    life.ended(failed, JobState.FAILED, reason="exit 1", exit_code=1)
    report = platform.jobs.predictor_report(admin)
    # The first succeeded job had no history to be predicted from; failed jobs teach nothing.
    assert (report["n"], report["unpredicted"]) == (2, 1)
    assert 0 <= report["within_2x"] <= 1


def test_fair_share_usage_decays_with_its_half_life(platform: Platform, tmp_path: Path) -> None:
    life = JobLifecycle(platform.db, platform.audit, "s1")
    loop = local_loop(platform, life, tmp_path, "fair", fair_share_half_life_h=1.0)
    job = life.admit(_submit(platform).id, PLACEMENT, "test")
    assert job is not None
    share = 500 / platform.cluster.capacity().cpu_milli  # 0.5 CPU is its dominant share
    assert loop._decayed_usage([job], 0.0) == {}
    held = loop._decayed_usage([], 3600.0)[job.team]  # held for one half-life, then released
    assert held == pytest.approx(share * 3600 / (2 * math.log(2)), rel=1e-6)
    assert loop._decayed_usage([], 7200.0)[job.team] == pytest.approx(held / 2, rel=1e-6)


def test_fair_share_usage_is_rebuilt_from_the_record_after_a_restart(
    platform: Platform, tmp_path: Path
) -> None:
    moment = [datetime(2030, 1, 1, tzinfo=UTC)]
    life = JobLifecycle(platform.db, platform.audit, "s1", lambda: moment[0])
    done = _run(life, _submit(platform))
    moment[0] += timedelta(hours=1)  # held for one half-life ...
    life.ended(done, JobState.SUCCEEDED, reason="test", exit_code=0)
    still = _run(life, _submit(platform, team=None))  # ... and another starts now
    moment[0] += timedelta(hours=1)  # ... then one more half-life passes
    restarted = local_loop(
        platform,
        life,
        tmp_path,
        "fair",
        clock=lambda: moment[0].timestamp(),
        fair_share_half_life_h=1.0,
    )
    usage = restarted.restore_usage()
    share = 500 / platform.cluster.capacity().cpu_milli
    finished = decayed_usage(decayed_usage(0.0, 3600, share, 3600), 3600, 0.0, 3600)
    running = decayed_usage(0.0, 3600, share, 3600)
    assert done.team == still.team
    assert usage[done.team] == pytest.approx(finished + running, rel=1e-6)
    # From here the loop goes on from the rebuilt figure, the running job still counting.
    later = restarted._decayed_usage([still], moment[0].timestamp() + 3600)
    assert later[done.team] == pytest.approx(
        decayed_usage(finished + running, 3600, share, 3600), rel=1e-6
    )
