"""The environment a worker starts with: clean base, the job's variables, the platform's.

See :mod:`shamal.executors._protocol` for the conventions; this module is pure.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from shamal.executors._protocol import LaunchFailed
from shamal.scheduler.core import GPU_MILLI, Slot

__all__ = [
    "DEFAULT_PASSTHROUGH",
    "MigResolver",
    "clean_environment",
    "compose_environment",
    "gang_layout",
    "interpreter_first_on_path",
    "platform_variables",
    "slot_visible_devices",
    "worker_environment",
]

logger = logging.getLogger(__name__)

DEFAULT_PASSTHROUGH: tuple[str, ...] = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "LC_MESSAGES",
    "TZ",
    "TMPDIR",
    "LD_LIBRARY_PATH",
)
"""The server's variables a worker inherits: nothing secret, nothing ``SHAMAL_*``."""

MigResolver = Callable[[int, int, str], str | None]
"""``(gpu_index, mig_start, mig_profile) -> MIG device UUID``; ``None`` when NVML is not available;
raises ``LookupError`` when NVML works but no such MIG device exists."""


def clean_environment(source: Mapping[str, str], passthrough: Iterable[str]) -> dict[str, str]:
    """The allow-listed subset of ``source``."""
    return {name: source[name] for name in passthrough if name in source}


def interpreter_first_on_path(path: str, *, prefix: str, base_prefix: str) -> str:
    """``PATH`` with the ``bin`` folder of the virtual environment at ``prefix`` first,
    unless ``PATH`` names it already; outside a virtual environment (``prefix ==
    base_prefix``) ``path`` as it is.

    `make run` starts ``.venv/bin/shamal server`` without activating ``.venv``: without
    this, ``python train.py`` in a job would be the system's interpreter, without torch,
    mlflow or shamal.
    """
    if prefix == base_prefix:
        return path
    scripts = str(Path(prefix) / "bin")
    if scripts in path.split(os.pathsep):
        return path
    return os.pathsep.join([scripts, path]) if path else scripts


def worker_environment(source: Mapping[str, str], passthrough: Iterable[str]) -> dict[str, str]:
    """What a worker starts from: the allow-listed part of ``source``, with the Python that
    runs Shamal first on ``PATH`` (see :func:`interpreter_first_on_path`)."""
    base = clean_environment(source, passthrough)
    if "PATH" in base:
        base["PATH"] = interpreter_first_on_path(
            base["PATH"], prefix=sys.prefix, base_prefix=sys.base_prefix
        )
    return base


def compose_environment(
    base: Mapping[str, str], user: Mapping[str, str], platform: Mapping[str, str]
) -> dict[str, str]:
    """Base, then defaults, then the job's own variables, then the platform's (which win)."""
    return {**base, "PYTHONUNBUFFERED": "1", **user, **platform}


def gang_layout(nodes: Sequence[str]) -> list[tuple[int, int]]:
    """``(LOCAL_RANK, LOCAL_WORLD_SIZE)`` per rank, from the node each rank runs on."""
    counts: dict[str, int] = {}
    local_ranks = []
    for node in nodes:
        local_ranks.append(counts.get(node, 0))
        counts[node] = counts.get(node, 0) + 1
    return [(local, counts[node]) for local, node in zip(local_ranks, nodes, strict=True)]


def platform_variables(
    job_id: str,
    attempt: int,
    *,
    rank: int,
    world_size: int,
    layout: tuple[int, int],
    master: tuple[str, int] | None,
    gpu_milli: int = 0,
) -> dict[str, str]:
    """The variables the platform owns for one worker (``CUDA_VISIBLE_DEVICES`` aside).

    Gang variables (torchrun's) are set only when ``world_size`` > 1; ``master`` is
    ``(MASTER_ADDR, MASTER_PORT)`` for them.
    """
    env = {
        "SHAMAL_JOB_ID": job_id,
        "SHAMAL_ATTEMPT": str(attempt),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    if 0 < gpu_milli < GPU_MILLI:
        env["SHAMAL_GPU_FRACTION"] = f"{gpu_milli / GPU_MILLI:g}"
    if world_size > 1:
        if master is None:
            raise ValueError("a gang needs a master address")
        env.update(
            MASTER_ADDR=master[0],
            MASTER_PORT=str(master[1]),
            WORLD_SIZE=str(world_size),
            RANK=str(rank),
            LOCAL_RANK=str(layout[0]),
            LOCAL_WORLD_SIZE=str(layout[1]),
        )
    return env


def slot_visible_devices(
    slot: Slot, override: Sequence[str] | None, resolve_mig: MigResolver | None
) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a worker placed in ``slot`` on this machine.

    Whole GPUs and fractions: their indices (NVML / PCI bus order). A MIG slice: its MIG
    device UUID, resolved with ``resolve_mig``; where NVML is absent (GPUs declared in
    config, tests) the GPU index stands in, with a warning. No GPU: ``""``.

    Raises:
        LaunchFailed: NVML is present but the slot's MIG device does not exist.
    """
    if override is not None:
        return ",".join(override)
    if slot.mig_profile is not None and slot.gpus:
        uuid = None
        if resolve_mig is not None:
            try:
                uuid = resolve_mig(slot.gpus[0], slot.mig_start, slot.mig_profile)
            except LookupError as exc:
                raise LaunchFailed(f"MIG slice not found on this node: {exc}") from None
        if uuid:
            return uuid
        logger.warning(
            "no NVML to resolve MIG slice %s at %d of GPU %d: pinning the GPU index",
            slot.mig_profile,
            slot.mig_start,
            slot.gpus[0],
        )
    return ",".join(str(index) for index in slot.gpus)
