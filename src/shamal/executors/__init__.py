"""Executors: what runs a placed job (local processes, a Ray cluster).

Pick one by name with :func:`get_executor`; run several behind one with
:class:`ExecutorSet` (each job on the one it names). Each implements the :class:`Executor`
contract documented in :mod:`shamal.executors._protocol`. Implementations are imported
only when asked for, so the platform works without ``ray`` installed.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any, cast

from shamal import lazy
from shamal.errors import InvalidParameter
from shamal.executors._protocol import (
    DISK_LIMIT,
    OUT_OF_MEMORY,
    REQUEUE_EXIT_CODE,
    Executor,
    ExitReason,
    ExitStatus,
    Handle,
    LaunchFailed,
    LaunchSpec,
)

if TYPE_CHECKING:
    from shamal.executors._cgroups import limit_mode
    from shamal.executors._isolation import (
        Sandbox,
        describe,
        interpreter_paths,
        network_of,
        self_test,
    )
    from shamal.executors._nvml import detect_local_gpus
    from shamal.executors._ray_token import ensure_ray_token
    from shamal.executors._routing import ExecutorSet, check_executor

#: Names loaded on first use: a job's supervisor imports this package's light modules and
#: starts once per job, so it must not pay for NVML, the scheduler or isolation set-up.
_WHERE: dict[str, tuple[str, str | None]] = {
    "limit_mode": ("_cgroups", "limit_mode"),
    "Sandbox": ("_isolation", "Sandbox"),
    "describe": ("_isolation", "describe"),
    "interpreter_paths": ("_isolation", "interpreter_paths"),
    "network_of": ("_isolation", "network_of"),
    "self_test": ("_isolation", "self_test"),
    "detect_local_gpus": ("_nvml", "detect_local_gpus"),
    "ensure_ray_token": ("_ray_token", "ensure_ray_token"),
    "ExecutorSet": ("_routing", "ExecutorSet"),
    "check_executor": ("_routing", "check_executor"),
}

__all__ = [
    "DISK_LIMIT",
    "EXECUTORS",
    "OUT_OF_MEMORY",
    "REQUEUE_EXIT_CODE",
    "Sandbox",
    "describe",
    "interpreter_paths",
    "limit_mode",
    "network_of",
    "self_test",
    "ExitReason",
    "ExitStatus",
    "Executor",
    "ExecutorSet",
    "Handle",
    "LaunchFailed",
    "LaunchSpec",
    "detect_local_gpus",
    "check_executor",
    "ensure_ray_token",
    "get_executor",
]

logger = logging.getLogger(__name__)

EXECUTORS: dict[str, str] = {
    "local": "shamal.executors._local:LocalExecutor",
    "ray": "shamal.executors._ray:RayExecutor",
}
"""Built-in executors: name -> ``"module:attribute"``. Third parties register more under
the ``shamal.executors`` entry-point group."""


def _resolve(name: str) -> Any:
    target = EXECUTORS.get(name)
    if target is not None:
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)
    from importlib.metadata import entry_points  # only for names not built in

    for entry in entry_points(group="shamal.executors"):
        if entry.name == name:
            return entry.load()
    known = ", ".join(sorted(EXECUTORS))
    raise InvalidParameter(f"unknown executor {name!r} (known: {known})")


def get_executor(name: str, **options: Any) -> Executor:
    """Build the executor registered as ``name`` with its keyword ``options``.

    Raises:
        InvalidParameter: no executor has that name.
    """
    return cast(Executor, _resolve(name)(**options))


def __getattr__(name: str) -> Any:
    return lazy.attribute(__name__, _WHERE, name, globals())
