"""Jobs: what users submit to the scheduler, and everything that happens to them.

The names below load on first use (PEP 562): ``shamal.jobs._rules`` and
``shamal.jobs._schemas``, which the CLI checks a job with, then load without the database
layer and the services.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shamal.jobs._cluster import build_cluster, effective_settings
    from shamal.jobs._entities import ACTIVE_STATES, CostLine, Job, JobEvent, JobSpec, JobState
    from shamal.jobs._lifecycle import JobLifecycle
    from shamal.jobs._service import JobService, LogChunk

_WHERE = {
    "ACTIVE_STATES": "_entities",
    "CostLine": "_entities",
    "Job": "_entities",
    "JobEvent": "_entities",
    "JobLifecycle": "_lifecycle",
    "JobService": "_service",
    "JobSpec": "_entities",
    "JobState": "_entities",
    "LogChunk": "_service",
    "build_cluster": "_cluster",
    "effective_settings": "_cluster",
}

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


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # once loaded, an ordinary attribute
    return value
