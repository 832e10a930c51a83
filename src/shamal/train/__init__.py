"""Shamal's training runtime: what user training code imports.

Helpers for a loop the user owns (not a framework): checkpoints that resume exactly,
preemption that checkpoints and requeues, mixed precision, accumulation, clipping,
warmup schedules, early stopping, throughput/MFU, batched metric logging, DDP from
the scheduler's torchrun-style environment, fully sharded data parallelism (FSDP2) with
sharded checkpoints that reshard on load, pipeline stages over a gang's workers, and the
choice between them from the model's size and the job's device memory.

Importing this package does not import torch: the torch-based names load on first use,
so scikit-learn jobs can use :class:`Tracker` and the stores without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from shamal.train._jobplan import DEVICE_MEMORY_ENV, device_memory_bytes, plan_for_job
from shamal.train._perf import PEAK_FLOPS, Throughput, peak_flops, transformer_flops_per_token
from shamal.train._plan import Plan, choose_parallelism
from shamal.train._preempt import REQUEUE_EXIT_CODE, PreemptionGuard, attempt
from shamal.train._store import ArtifactCheckpointStore, CheckpointStore, LocalCheckpointStore
from shamal.train._tracking import Tracker

if TYPE_CHECKING:
    from shamal.train._checkpoint import Checkpointer, Resumed
    from shamal.train._data import ResumableSampler
    from shamal.train._dist import DistInfo, init_distributed, shutdown
    from shamal.train._fsdp import ShardingError, shard_model
    from shamal.train._loop import EarlyStopping, Stepper, WarmupCosine, warmup_cosine
    from shamal.train._perf import current_device_peak
    from shamal.train._pipeline import (
        Pipeline,
        StageCheckpointer,
        pipeline_stages,
        split_sequential,
    )
    from shamal.train._sharded import (
        ShardedCheckpointer,
        ShardedCheckpointError,
        ShardedResumed,
    )

__all__ = [
    "DEVICE_MEMORY_ENV",
    "PEAK_FLOPS",
    "REQUEUE_EXIT_CODE",
    "ArtifactCheckpointStore",
    "CheckpointStore",
    "Checkpointer",
    "DistInfo",
    "EarlyStopping",
    "LocalCheckpointStore",
    "Pipeline",
    "Plan",
    "PreemptionGuard",
    "Resumed",
    "ResumableSampler",
    "ShardedCheckpointError",
    "ShardedCheckpointer",
    "ShardedResumed",
    "ShardingError",
    "StageCheckpointer",
    "Stepper",
    "Throughput",
    "Tracker",
    "WarmupCosine",
    "attempt",
    "choose_parallelism",
    "current_device_peak",
    "device_memory_bytes",
    "init_distributed",
    "peak_flops",
    "shard_model",
    "pipeline_stages",
    "plan_for_job",
    "shutdown",
    "split_sequential",
    "transformer_flops_per_token",
    "warmup_cosine",
]

_LAZY = {
    "Checkpointer": "_checkpoint",
    "Resumed": "_checkpoint",
    "ResumableSampler": "_data",
    "DistInfo": "_dist",
    "init_distributed": "_dist",
    "shutdown": "_dist",
    "EarlyStopping": "_loop",
    "Stepper": "_loop",
    "WarmupCosine": "_loop",
    "warmup_cosine": "_loop",
    "current_device_peak": "_perf",
    "ShardedCheckpointer": "_sharded",
    "ShardedCheckpointError": "_sharded",
    "ShardedResumed": "_sharded",
    "ShardingError": "_fsdp",
    "shard_model": "_fsdp",
    "Pipeline": "_pipeline",
    "StageCheckpointer": "_pipeline",
    "pipeline_stages": "_pipeline",
    "split_sequential": "_pipeline",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shamal.train' has no attribute {name!r}")
    return getattr(importlib.import_module(f"shamal.train.{module}"), name)
