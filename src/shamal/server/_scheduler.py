"""Run the live scheduler next to the server (or alone, with `shamal scheduler run`)."""

from __future__ import annotations

import logging
import socket
import threading
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
    platform: Platform, *, name: str | None = None, api_url: str | None = None
) -> SchedulerLoop:
    """A scheduler loop over the platform's database, artifact store and cluster.

    Args:
        api_url: where jobs reach the API (``scheduler.api_url`` wins when set); with
            neither, jobs get no platform credentials.
    """
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
    url = settings.api_url or api_url
    credentials = JobCredentials(platform, url) if url else None
    loop = SchedulerLoop(parts, policy, credentials=credentials)
    loop.periodic.append((10.0, platform.tune.fail_stale_trials))
    # A canary whose traffic stopped still moves on (or back) after its interval.
    loop.periodic.append((10.0, platform.deployments.check_rollouts))
    return loop


JOB_TOKEN_MAX = timedelta(days=7)


class JobCredentials:
    """What every job attempt is told about the platform that runs it, and its token.

    An attempt gets a token of its own (scope ``job``: acting as the user who submitted
    the job, but taking no admin action and managing no tokens, accounts or teams), so
    that its code can log to tracking (``MLFLOW_TRACKING_*``) and call the API
    (``SHAMAL_URL``, ``SHAMAL_TOKEN``; ``SHAMAL_TEAM`` is the job's team, empty for none).
    The loop calls :meth:`release` when the attempt ends, which revokes the token; it
    would expire on its own an hour after the job's time limit (at most seven days after
    the start) in any case.

    Args:
        api_url: the URL jobs reach the API at.
    """

    def __init__(self, platform: Platform, api_url: str) -> None:
        self._security = platform.security
        self._api_url = api_url

    @staticmethod
    def token_name(job: Job) -> str:
        return f"job-{job.id[:12]}-{job.attempt}"

    def env(self, job: Job) -> dict[str, str]:
        limit = timedelta(seconds=job.time_limit_s) if job.time_limit_s else JOB_TOKEN_MAX
        lifetime = min(limit + timedelta(hours=1), JOB_TOKEN_MAX)
        secret = self._security.issue_job_token(job.user, self.token_name(job), lifetime).secret
        return {
            "SHAMAL_URL": self._api_url,
            "SHAMAL_TOKEN": secret,
            "SHAMAL_TEAM": job.team,
            "MLFLOW_TRACKING_URI": self._api_url,
            "MLFLOW_TRACKING_TOKEN": secret,
        }

    def release(self, job: Job) -> None:
        self._security.revoke_job_tokens(job.user, self.token_name(job))


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
