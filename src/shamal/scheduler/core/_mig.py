"""MIG (Multi-Instance GPU) profiles and the slot arithmetic of placing them.

Facts from NVIDIA's *Multi-Instance GPU User Guide* (sections "Supported MIG Profiles"
and "Placement of GPU instances"), restated here as data:

* A MIG-capable GPU is cut into GPU instances. Each profile ``<c>g.<m>gb`` has ``c``
  compute slices and ``m`` GB of memory; a GPU has 7 compute slices (A100, H100, H200)
  or 4 (A30).
* Instances may only start at fixed *placement* positions, and each occupies a fixed
  span of positions (``nvidia-smi mig -lgipp`` prints them as ``{starts}:span``). On
  the 7-slice GPUs there are 8 positions (0-7, one per memory slice):

  ======== =============== ======
  compute  allowed starts  span
  ======== =============== ======
  1g       0,1,2,3,4,5,6   1
  1g (2x memory, e.g. 1g.20gb on 80 GB)  0,2,4,6   2
  2g       0,2,4           2
  3g       0,4             4
  4g       0               4
  7g       0               8
  ======== =============== ======

  So ``3g + 4g``, ``3g + 3g`` or ``4g + 2g + 1g`` fit one GPU, but a ``3g`` at 0 and
  a ``4g`` cannot coexist (both need positions 0-3).
* The A30 (24 GB) has 4 compute slices on 4 positions: ``1g.6gb`` at 0-3 (span 1),
  ``2g.12gb`` at 0 or 2 (span 2), ``4g.24gb`` at 0 (span 4).
* Profile names by memory size: A100 40 GB ``1g.5gb, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb,
  7g.40gb``; A100/H100 80 GB ``1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb``;
  H100 NVL 94 GB ``1g.12gb, 1g.24gb, 2g.24gb, 3g.47gb, 4g.47gb, 7g.94gb``; GH200 96 GB
  ``1g.12gb, 1g.24gb, 2g.24gb, 3g.48gb, 4g.48gb, 7g.96gb``; H200 141 GB ``1g.18gb,
  1g.35gb, 2g.35gb, 3g.71gb, 4g.71gb, 7g.141gb``. The ``+me`` variants (one 1g instance
  with the media engines) have the placement of their base profile.

A GPU's MIG layout is a bit mask over its positions (:attr:`Gpu.mig_used`); a slice is
free to place at ``start`` when none of the bits of its span are set.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from shamal.scheduler.core._resources import GPU_MILLI, Gpu, Request

__all__ = [
    "MigProfile",
    "device_memory_mib",
    "MigTable",
    "free_starts",
    "profile_mask",
    "profiles_for",
    "table_for",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU-instance profile: its compute slices, allowed starts and span."""

    name: str
    compute: int
    starts: tuple[int, ...]
    span: int


@dataclass(frozen=True, slots=True)
class MigTable:
    """The profiles of one GPU memory size (one GPU model family)."""

    memory_gb: int
    compute_slices: int
    positions: int
    profiles: dict[str, MigProfile]


_SEVEN_SLICE: tuple[tuple[int, tuple[int, ...], int], ...] = (
    # (compute slices, starts, span) per column of the table in the docstring;
    # the two 1g rows are the single-memory and double-memory variants.
    (1, (0, 1, 2, 3, 4, 5, 6), 1),
    (1, (0, 2, 4, 6), 2),
    (2, (0, 2, 4), 2),
    (3, (0, 4), 4),
    (4, (0,), 4),
    (7, (0,), 8),
)


def _seven_slice(memory_gb: int, names: tuple[str, ...]) -> MigTable:
    profiles: dict[str, MigProfile] = {}
    for name, (compute, starts, span) in zip(names, _SEVEN_SLICE, strict=True):
        profiles[name] = MigProfile(name, compute, starts, span)
    # The media-engine variant is one 1g instance placed like its base profile.
    base = profiles[names[0]]
    me = f"{names[0]}+me"
    profiles[me] = MigProfile(me, base.compute, base.starts, base.span)
    return MigTable(memory_gb, 7, 8, profiles)


def _a30() -> MigTable:
    rows = {
        "1g.6gb": (1, (0, 1, 2, 3), 1),
        "1g.6gb+me": (1, (0, 1, 2, 3), 1),
        "2g.12gb": (2, (0, 2), 2),
        "2g.12gb+me": (2, (0, 2), 2),
        "4g.24gb": (4, (0,), 4),
    }
    profiles = {n: MigProfile(n, c, s, w) for n, (c, s, w) in rows.items()}
    return MigTable(24, 4, 4, profiles)


TABLES: tuple[MigTable, ...] = (
    _a30(),
    _seven_slice(40, ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")),
    _seven_slice(80, ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")),
    _seven_slice(94, ("1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb")),
    _seven_slice(96, ("1g.12gb", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb")),
    _seven_slice(141, ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb")),
)
"""The known MIG tables, by GPU memory size in GB."""


def table_for(gpu: Gpu) -> MigTable | None:
    """The MIG table of a GPU, chosen by its memory size (nearest within 10%).

    ``None`` when the GPU is not partitioned (``mig_slices == 0``) or its memory size
    matches no known MIG-capable GPU. A 7-slice table is used only for a GPU declared
    with 7 slices, the A30 table only for one declared with 4.
    """
    if gpu.mig_slices <= 0:
        return None
    gb = gpu.memory_mib / 1024
    best: MigTable | None = None
    for table in TABLES:
        if table.compute_slices != gpu.mig_slices:
            continue
        if abs(gb - table.memory_gb) <= 0.1 * table.memory_gb and (
            best is None or abs(gb - table.memory_gb) < abs(gb - best.memory_gb)
        ):
            best = table
    return best


def profiles_for(gpu: Gpu) -> dict[str, MigProfile]:
    """The profiles a partitioned GPU offers (empty when it has no known table)."""
    table = table_for(gpu)
    return {} if table is None else table.profiles


def profile_mask(profile: MigProfile, start: int) -> int:
    """The bit mask of positions an instance of ``profile`` at ``start`` occupies."""
    if start not in profile.starts:
        raise ValueError(f"MIG profile {profile.name} cannot start at slot {start}")
    return ((1 << profile.span) - 1) << start


def free_starts(gpu: Gpu, profile_name: str) -> list[int]:
    """The starts at which a ``profile_name`` instance fits on ``gpu`` now, in order."""
    profile = profiles_for(gpu).get(profile_name)
    if profile is None:
        return []
    return [s for s in profile.starts if not gpu.mig_used & profile_mask(profile, s)]


def device_memory_mib(gpu: Gpu, request: Request) -> int:
    """The memory one worker of ``request`` would have on ``gpu``, in MiB.

    A whole GPU: all of its memory. A fraction: that share of it. A MIG slice: its memory
    slices' share (a ``3g.40gb`` slice holds 4 of an 80 GB GPU's 8 memory slices: 40 GB);
    0 when the GPU offers no such slice. A CPU-only request: 0.
    """
    if request.mig_profile is not None:
        table = table_for(gpu)
        profile = None if table is None else table.profiles.get(request.mig_profile)
        if table is None or profile is None:
            return 0
        return gpu.memory_mib * profile.span // table.positions
    if request.gpu_milli:
        return gpu.memory_mib * request.gpu_milli // GPU_MILLI
    return gpu.memory_mib if request.gpus else 0
