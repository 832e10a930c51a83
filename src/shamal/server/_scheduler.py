"""Run the live scheduler next to the server (or alone, with `shamal scheduler run`)."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Mapping

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
    return SchedulerLoop(parts, policy, env=env)


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
