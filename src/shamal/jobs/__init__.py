"""Jobs: what users submit to the scheduler, and everything that happens to them."""

from __future__ import annotations

from shamal.jobs._cluster import build_cluster, effective_settings
from shamal.jobs._entities import ACTIVE_STATES, CostLine, Job, JobEvent, JobSpec, JobState
from shamal.jobs._lifecycle import JobLifecycle
from shamal.jobs._service import JobService, LogChunk

__all__ = [
    "ACTIVE_STATES",
    "CostLine",
    "Job",
    "JobEvent",
    "JobLifecycle",
    "JobService",
    "JobSpec",
    "JobState",
    "LogChunk",
    "build_cluster",
    "effective_settings",
]
