"""The parallelism plan for the job this process runs in: its devices and their memory.

The scheduler tells each worker of a job how many workers the gang has (``WORLD_SIZE``)
and how much memory each worker's device has (``SHAMAL_DEVICE_MEMORY_MIB``: the smallest
device of the placement; a GPU fraction or MIG slice counts its share of the GPU's
memory; a worker without a GPU counts its memory request). Outside the scheduler the
memory comes from the visible GPU, else from the machine's RAM.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from shamal.train._plan import Plan, choose_parallelism

__all__ = ["DEVICE_MEMORY_ENV", "device_memory_bytes", "plan_for_job"]

logger = logging.getLogger(__name__)

DEVICE_MEMORY_ENV = "SHAMAL_DEVICE_MEMORY_MIB"
"""The variable the scheduler sets: memory per device of the job's placement, in MiB."""

_MIB = 1024 * 1024


def _positive_int(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name}={text[:32]!r} is not a whole number") from None
    if value <= 0:
        raise ValueError(f"{name} must be > 0, not {value}")
    return value


def device_memory_bytes() -> int:
    """Memory of one of this job's devices, in bytes (see the module's docs)."""
    text = os.environ.get(DEVICE_MEMORY_ENV, "").strip()
    if text:
        return _positive_int(DEVICE_MEMORY_ENV, text) * _MIB
    try:
        import torch

        if torch.cuda.is_available():
            total = int(torch.cuda.get_device_properties(0).total_memory)
            fraction = float(os.environ.get("SHAMAL_GPU_FRACTION", "") or 1.0)
            return int(total * fraction)
    except ImportError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _count(model: Any) -> int:
    if isinstance(model, int):
        return model
    parameters = getattr(model, "parameters", None)
    if parameters is None:
        raise TypeError("give a parameter count or a module with .parameters()")
    return sum(int(p.numel()) for p in parameters())


def plan_for_job(
    model: Any,
    *,
    devices: int | None = None,
    memory_per_device: int | None = None,
    bytes_per_param: int = 16,
    activation_fraction: float = 0.25,
) -> Plan:
    """:func:`choose_parallelism` for ``model`` (a module or a parameter count) on this
    job's devices: ``WORLD_SIZE`` of them (1 outside a gang) with
    :func:`device_memory_bytes` each, unless given. Logs the plan and its reason.

    Raises:
        ValueError: malformed environment, or no plan fits (the message says by how much).
    """
    count = _count(model)
    n = (
        devices
        if devices is not None
        else _positive_int("WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))
    )
    memory = memory_per_device if memory_per_device is not None else device_memory_bytes()
    plan = choose_parallelism(
        count,
        n,
        memory,
        bytes_per_param=bytes_per_param,
        activation_fraction=activation_fraction,
    )
    logger.info("parallelism plan: %s x%d: %s", plan.strategy, plan.stages, plan.reason)
    return plan
