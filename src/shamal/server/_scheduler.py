"""Run the live scheduler next to the server (or alone, with `shamal scheduler run`)."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Mapping
from datetime import timedelta

from shamal.errors import InvalidParameter
from shamal.executors import get_executor
from shamal.jobs import Job, JobLifecycle, effective_settings
from shamal.jobs._loop import SchedulerLoop, SchedulerParts
from shamal.scheduler import DEFAULT_POLICY, get_policy
from shamal.server._platform import Platform

logger = logging.getLogger(__name__)


def scheduler_name(platform: Platform) -> str:
    """This process's scheduler name: configured, else the host name."""
    return platform.settings.scheduler.name or socket.gethostname() or "scheduler"


def build_loop(
    platform: Platform,
    *,
    name: str | None = None,
    env: Callable[[Job], Mapping[str, str]] | None = None,
) -> SchedulerLoop:
    """A scheduler loop over the platform's database, artifact store and cluster."""
    settings = effective_settings(platform.settings.scheduler)
    options = {"address": settings.ray_address} if settings.executor == "ray" else {}
    parts = SchedulerParts(
        lifecycle=JobLifecycle(platform.db, platform.audit, name or scheduler_name(platform)),
        jobs=platform.jobs,
        artifacts=platform.artifacts,
        executor=get_executor(settings.executor, **options),
        cluster=platform.cluster,
        settings=settings,
        jobs_dir=platform.settings.jobs_dir,
    )
    try:
        policy = get_policy(settings.policy or DEFAULT_POLICY, **settings.policy_options)
    except ValueError as exc:
        raise InvalidParameter(f"scheduler settings: {exc}") from None
    loop = SchedulerLoop(parts, policy, env=env)
    loop.periodic.append((10.0, platform.tune.fail_stale_trials))
    # A canary whose traffic stopped still moves on (or back) after its interval.
    loop.periodic.append((10.0, platform.deployments.check_rollouts))
    return loop


JOB_TOKEN_MAX = timedelta(days=7)


def job_env(platform: Platform, base_url: str) -> Callable[[Job], dict[str, str]]:
    """What every job is told about the platform that runs it.

    A job gets a token of its own, acting as the user who submitted it, so that its code
    can log to tracking (``MLFLOW_TRACKING_*``) and call the API (``SHAMAL_URL``,
    ``SHAMAL_TOKEN``; ``SHAMAL_TEAM`` is the job's team, empty for none). The token
    expires an hour after the job's time limit (at most seven days after the start).
    """

    def env(job: Job) -> dict[str, str]:
        limit = timedelta(seconds=job.time_limit_s) if job.time_limit_s else JOB_TOKEN_MAX
        lifetime = min(limit + timedelta(hours=1), JOB_TOKEN_MAX)
        name = f"job-{job.id[:12]}-{job.attempt}"
        secret = platform.security.issue_job_token(job.user, name, lifetime).secret
        return {
            "SHAMAL_URL": base_url,
            "SHAMAL_TOKEN": secret,
            "SHAMAL_TEAM": job.team,
            "MLFLOW_TRACKING_URI": base_url,
            "MLFLOW_TRACKING_TOKEN": secret,
        }

    return env


class SchedulerThread:
    """The scheduler loop in a daemon thread of the server process."""

    def __init__(self, loop: SchedulerLoop) -> None:
        self.loop = loop
        self._stop = threading.Event()
        self._thread = threading.Thread(target=loop.run, args=(self._stop,), daemon=True)

    def start(self) -> None:
        self._thread.start()
        logger.info("scheduler started with policy %s", self.loop.policy.name)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop scheduling; running jobs keep running and are re-attached on restart."""
        self._stop.set()
        self._thread.join(timeout)
