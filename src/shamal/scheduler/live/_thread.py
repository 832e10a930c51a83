"""Run the live scheduler next to the server (or alone, with `shamal scheduler run`)."""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

from shamal.artifacts import ArtifactService
from shamal.config import LocalArtifactSettings, SchedulerSettings, Settings
from shamal.db import Database
from shamal.errors import InvalidParameter
from shamal.executors import (
    Executor,
    ExecutorSet,
    Sandbox,
    describe,
    get_executor,
    network_of,
    self_test,
)
from shamal.jobs import Job, JobService
from shamal.scheduler.core import DEFAULT_POLICY, Cluster, get_policy
from shamal.scheduler.live._cluster import effective_settings
from shamal.scheduler.live._lifecycle import JobLifecycle
from shamal.scheduler.live._loop import SchedulerLoop, SchedulerParts
from shamal.security import AuditLog, SecurityService, job_token_name

logger = logging.getLogger(__name__)


class Services(Protocol):
    """What the live scheduler takes from the platform it runs in (the server's
    :class:`~shamal.server.Platform` is one)."""

    settings: Settings
    db: Database
    audit: AuditLog
    security: SecurityService
    artifacts: ArtifactService
    jobs: JobService
    cluster: Cluster


def scheduler_name(platform: Services) -> str:
    """This process's scheduler name: configured, else the host name."""
    return platform.settings.scheduler.name or socket.gethostname() or "scheduler"


def build_loop(
    platform: Services, *, name: str | None = None, api_url: str | None = None
) -> SchedulerLoop:
    """A scheduler loop over the platform's database, artifact store and cluster.

    Args:
        api_url: where jobs reach the API (``scheduler.api_url`` wins when set); with
            neither, jobs get no platform credentials.
    """
    settings = effective_settings(platform.settings.scheduler)
    sandbox = job_sandbox(platform.settings)
    logger.info("%s", describe(sandbox))
    parts = SchedulerParts(
        lifecycle=JobLifecycle(platform.db, platform.audit, name or scheduler_name(platform)),
        jobs=platform.jobs,
        artifacts=platform.artifacts,
        executor=job_executors(settings, sandbox),
        cluster=platform.cluster,
        settings=settings,
        jobs_dir=platform.settings.jobs_dir,
        work_root=job_folders(platform.settings),
    )
    try:
        policy = get_policy(settings.policy or DEFAULT_POLICY, **settings.policy_options)
    except ValueError as exc:
        raise InvalidParameter(f"scheduler settings: {exc}") from None
    url = settings.api_url or api_url
    try:
        network_of(settings.job_network, url)
    except ValueError as exc:
        raise InvalidParameter(str(exc)) from None
    credentials = JobCredentials(platform, url) if url else None
    return SchedulerLoop(parts, policy, credentials=credentials)


def job_executors(settings: SchedulerSettings, sandbox: Sandbox | None) -> ExecutorSet:
    """Every executor the scheduler runs (``executor`` first, then ``executors``), each
    confining jobs in ``sandbox`` exactly as it would alone; a job runs on the one it names.
    """
    built: list[Executor] = []
    try:
        for name in settings.executor_names:
            options: dict[str, Any] = {"sandbox": sandbox}
            if name == "ray":
                options["address"] = settings.ray_address
            built.append(get_executor(name, **options))
        logger.info(
            "jobs run on %s (default %s)", ", ".join(settings.executor_names), built[0].name
        )
        return ExecutorSet(*built)
    except Exception:
        for executor in built:
            executor.close()
        raise


def job_folders(settings: Settings) -> Path:
    """The folder of jobs' working folders, made (mode 0711: job users may enter it, not
    list it) and checked: owned by this user, not a link, outside ``SHAMAL_HOME``."""
    root = settings.job_folders.absolute()
    home = settings.home.absolute()
    if root == home or home in root.parents or root in home.parents:
        raise InvalidParameter(
            f"the job folders ({root}) must lie outside SHAMAL_HOME ({home}) and not hold it: "
            "set SHAMAL_SCHEDULER__JOB_FOLDERS elsewhere"
        )
    root.mkdir(mode=0o711, parents=True, exist_ok=True)
    info = root.lstat()
    if root.is_symlink() or info.st_uid != os.geteuid():
        raise InvalidParameter(
            f"{root} is not a folder of this user's: refusing to put jobs there "
            "(set SHAMAL_SCHEDULER__JOB_FOLDERS to a folder of the server's)"
        )
    root.chmod(0o711)
    return root


def hidden_from_jobs(settings: Settings) -> tuple[str, ...]:
    """What no job may see: the server's home, every job's folder, the local artifact
    store, the key ring, a SQLite database, wherever each lies."""
    paths = {settings.home, settings.job_folders, settings.keys_dir}
    paths.add(settings.resolved_master_key_file.parent)
    if isinstance(settings.artifacts, LocalArtifactSettings):
        paths.add(settings.artifact_root)
    url = settings.resolved_database_url
    if url.startswith("sqlite:///"):
        paths.add(Path(url.removeprefix("sqlite:///")).parent)
    if settings.scheduler.cluster_file is not None:
        paths.add(settings.scheduler.cluster_file.parent)
    return tuple(sorted(str(p.absolute()) for p in paths))


def job_sandbox(settings: Settings, *, euid: int | None = None) -> Sandbox | None:
    """The sandbox jobs run in, after checking that this process may run them so.

    Args:
        euid: the user the scheduler runs as (default: this process's).

    Raises:
        InvalidParameter: jobs would run as root, or as the server's user without the
            operator asking for it, or the sandbox does not work on this machine.
    """
    scheduler = settings.scheduler
    root = (os.geteuid() if euid is None else euid) == 0
    if scheduler.run_jobs_as == "team-users" and not root:
        raise InvalidParameter(
            "jobs run as an OS user per team, which needs the scheduler to run as root. On "
            "a single-user laptop, run them as your own user instead (hidden from "
            "SHAMAL_HOME by namespaces): SHAMAL_SCHEDULER__RUN_JOBS_AS=server-user"
        )
    if scheduler.run_jobs_as == "server-user" and root:
        raise InvalidParameter(
            "the server runs as root, so jobs would run as root: keep "
            "SHAMAL_SCHEDULER__RUN_JOBS_AS=team-users (a user per team)"
        )
    if not scheduler.sandbox:
        if scheduler.run_jobs_as != "server-user":
            raise InvalidParameter(
                "SHAMAL_SCHEDULER__SANDBOX=false runs jobs unconfined: only with "
                "SHAMAL_SCHEDULER__RUN_JOBS_AS=server-user, on a single-user machine"
            )
        logger.warning("jobs run unconfined: they can read everything the server can")
        return None
    sandbox = Sandbox(
        hide=hidden_from_jobs(settings),
        shared=tuple(str(p.absolute()) for p in scheduler.job_shared_folders),
        own_users=scheduler.run_jobs_as == "team-users",
        pids_max=scheduler.job_pids_max,
        tmp_size_mib=scheduler.job_tmp_mib,
        network=scheduler.job_network,
        disk_mib=scheduler.job_disk_mib,
    )
    problem = self_test(sys.executable, sandbox, job_folders(settings))
    if problem is not None:
        raise InvalidParameter(
            f"jobs cannot be confined on this machine ({problem}). Where the kernel allows "
            "no namespaces, and only on a single-user machine: SHAMAL_SCHEDULER__SANDBOX=false "
            "with SHAMAL_SCHEDULER__RUN_JOBS_AS=server-user"
        )
    return sandbox


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

    def __init__(self, platform: Services, api_url: str) -> None:
        self._security = platform.security
        self._api_url = api_url

    @staticmethod
    def token_name(job: Job) -> str:
        return job_token_name(job.id, job.attempt)

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
        self.loop.wake.set()
        self._thread.join(timeout)
