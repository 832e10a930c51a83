"""Distributed data parallel from the torchrun-style environment the scheduler sets.

The scheduler gives every worker of a gang ``MASTER_ADDR``, ``MASTER_PORT``,
``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``, and pins
``CUDA_VISIBLE_DEVICES`` so that each worker sees only its own GPU as ``cuda:0``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = [
    "DistInfo",
    "any_rank",
    "barrier",
    "init_distributed",
    "rank",
    "shutdown",
    "unwrap",
    "world_size",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands: rank, world size and the device to use."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(backend: str | None = None) -> DistInfo:
    """Join the process group when ``WORLD_SIZE`` > 1 (gloo on CPU, NCCL on GPU).

    Safe to call in a single process: it then initialises nothing. The device is
    ``cuda:0`` when a GPU is visible (the scheduler pins one per worker), else CPU; with
    ``SHAMAL_GPU_FRACTION`` < 1 the CUDA caching allocator is capped to that share.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda:0" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
        fraction = float(os.environ.get("SHAMAL_GPU_FRACTION", "") or 1.0)
        if fraction < 1.0:  # a fractional GPU: stay within our share of its memory
            torch.cuda.set_per_process_memory_fraction(fraction, device)
    if world > 1 and not dist.is_initialized():
        chosen = backend or ("nccl" if cuda else "gloo")
        dist.init_process_group(backend=chosen, init_method="env://")
        logger.info("joined process group (%s) as rank %d of %d", chosen, rank(), world)
    return DistInfo(rank(), world_size(), int(os.environ.get("LOCAL_RANK", "0")), device)


def rank() -> int:
    """This process's rank (0 when not distributed)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


def barrier() -> None:
    """Wait for every rank (no-op when not distributed)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def any_rank(flag: bool) -> bool:
    """True on every rank when ``flag`` is true on at least one (a tiny all-reduce)."""
    if not (dist.is_available() and dist.is_initialized()):
        return flag
    backend = dist.get_backend()
    device = torch.device("cuda:0") if backend == "nccl" else torch.device("cpu")
    value = torch.tensor([1 if flag else 0], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def shutdown() -> None:
    """Leave the process group if joined, after a barrier.

    The barrier keeps rank 0 (which hosts the rendezvous store) from tearing down
    while another rank still talks to it; without it a rank can hang at exit. Drop
    DistributedDataParallel wrappers (and what holds them) before calling it: a reducer
    that outlives its process group can also hang the interpreter at exit.
    """
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DistributedDataParallel (or compiled) wrapper."""
    for attribute in ("module", "_orig_mod"):
        inner = getattr(model, attribute, None)
        if isinstance(inner, torch.nn.Module):
            return unwrap(inner)
    return model
