"""Choosing how to spread a model over devices: DDP, FSDP or pipeline stages (pure).

The estimate is the usual one for mixed-precision Adam training: each parameter costs its
weights, its gradient and two optimizer moments (``bytes_per_param``, 16 by default for
fp32 master weights with Adam), plus a share for activations. No torch needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Strategy = Literal["ddp", "fsdp", "pipeline"]


@dataclass(frozen=True)
class Plan:
    """The chosen strategy, the stages for a pipeline (1 otherwise), and why."""

    strategy: Strategy
    stages: int
    reason: str


def choose_parallelism(
    params: int,
    devices: int,
    memory_per_device: int,
    *,
    bytes_per_param: int = 16,
    activation_fraction: float = 0.25,
) -> Plan:
    """Pick DDP when a full replica fits one device, FSDP when a shard fits, else stages.

    ``memory_per_device`` is in bytes; ``activation_fraction`` of each device is kept for
    activations. Raises ValueError on impossible inputs or when no plan fits.
    """
    if params <= 0 or devices <= 0 or memory_per_device <= 0 or bytes_per_param <= 0:
        raise ValueError("params, devices, memory_per_device and bytes_per_param must be > 0")
    if not 0.0 <= activation_fraction < 1.0:
        raise ValueError("activation_fraction must be in [0, 1)")
    usable = int(memory_per_device * (1.0 - activation_fraction))
    state = params * bytes_per_param
    gib = 1024**3
    if state <= usable:
        return Plan(
            "ddp",
            1,
            f"model state {state / gib:.2f} GiB fits one device's {usable / gib:.2f} GiB usable: "
            "a full replica per device (DDP)",
        )
    # FSDP shards weights, gradients and optimizer state; one layer is gathered at a time,
    # approximated here as one extra shard's worth.
    per_shard = -(-state // devices)
    if devices > 1 and 2 * per_shard <= usable:
        return Plan(
            "fsdp",
            1,
            f"model state {state / gib:.2f} GiB exceeds one device's {usable / gib:.2f} GiB usable "
            f"but a 1/{devices} shard ({per_shard / gib:.2f} GiB, doubled for gathering) "
            "fits: FSDP",
        )
    stages = -(-state // usable)
    if stages <= devices:
        return Plan(
            "pipeline",
            int(stages),
            f"model state {state / gib:.2f} GiB needs {stages} devices of {usable / gib:.2f} GiB "
            "usable each: pipeline stages",
        )
    raise ValueError(
        f"model state {state / gib:.2f} GiB does not fit {devices} device(s) of "
        f"{usable / gib:.2f} GiB usable each"
    )
