"""Fully sharded data parallelism (PyTorch's FSDP2, ``fully_shard``) for a model the user owns.

:func:`shard_model` shards every block of the model (the block classes the caller names,
or the model's repeated children) and then the root, so that each worker holds ``1/N``
of the parameters, gradients and optimizer state and gathers one block at a time::

    info = init_distributed()
    model = shard_model(Net(), mixed_precision="bf16", activation_checkpointing=True)
    optimizer = torch.optim.AdamW(model.parameters())   # after sharding: it sees the shards

Options:

* ``mixed_precision``: ``"bf16"`` or ``"fp16"`` runs forward and backward with parameters
  in that dtype while the sharded master weights, the optimizer and the gradient
  reduction stay in fp32 (FSDP2's ``MixedPrecisionPolicy``). fp16 needs loss scaling
  (``torch.amp.GradScaler``) as it does without sharding; prefer bf16.
* ``activation_checkpointing``: each block is wrapped in torch's checkpoint wrapper (non
  reentrant), so its activations are recomputed in backward instead of kept. Parameter
  names do not change (the distributed state dict drops the wrapper's prefix), so a
  checkpoint loads with or without it.
* ``cpu_offload``: the sharded parameters, gradients and optimizer step live in host memory
  and are copied to the accelerator block by block (``CPUOffloadPolicy``). It needs an
  accelerator: on a CPU-only machine the parameters are in host memory already, and
  :func:`shard_model` refuses the option with :class:`ShardingError` rather than
  silently ignoring it.

A single worker (``WORLD_SIZE`` 1 or unset) gets a one-process group of its own, so the
same script runs sharded over N workers or unsharded over one; with ``WORLD_SIZE`` > 1
the caller must have joined the gang's group (:func:`~shamal.train.init_distributed`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["MIXED_PRECISIONS", "ShardingError", "shard_model"]

logger = logging.getLogger(__name__)

MIXED_PRECISIONS = {"bf16": torch.bfloat16, "fp16": torch.float16}


class ShardingError(RuntimeError):
    """The model cannot be sharded as asked; the message says what to change."""


def _accelerator_available() -> bool:
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        return bool(accelerator.is_available())
    return torch.cuda.is_available()


def _ensure_group() -> None:
    if dist.is_initialized():
        return
    world = int(os.environ.get("WORLD_SIZE", "1") or "1")
    if world > 1:
        raise ShardingError(
            f"this worker is one of {world} (WORLD_SIZE) but has not joined their process "
            "group: call shamal.train.init_distributed() before shard_model()"
        )
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    from torch.distributed import HashStore  # type: ignore[attr-defined]

    dist.init_process_group(backend, store=HashStore(), rank=0, world_size=1)
    logger.info("single worker: sharding over a one-process %s group", backend)


def _is_module_class(value: object) -> bool:
    return isinstance(value, type) and issubclass(value, nn.Module)


def _given_blocks(
    model: nn.Module, blocks: Sequence[type[nn.Module]]
) -> list[tuple[str, nn.Module]]:
    """Instances of the given classes, outermost only."""
    classes = tuple(blocks)
    if not classes or not all(_is_module_class(c) for c in classes):
        raise ShardingError("blocks must be a non-empty sequence of nn.Module classes")
    found: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        inside = any(name.startswith(f"{outer}.") for outer, _ in found)
        if module is not model and isinstance(module, classes) and not inside:
            found.append((name, module))
    if not found:
        wanted = ", ".join(c.__name__ for c in classes)
        raise ShardingError(f"the model has no submodule of the block class(es) {wanted}")
    return found


def _repeated_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The children of the largest container holding two or more modules of one class."""
    best: tuple[int, str, list[tuple[str, nn.Module]]] | None = None
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList | nn.Sequential):
            continue
        children = list(module.named_children())
        size = sum(p.numel() for p in module.parameters())
        repeated = len(children) >= 2 and len({type(c) for _, c in children}) == 1
        if repeated and size and (best is None or size > best[0]):
            best = (size, name, children)
    if best is None:
        return []
    _, prefix, children = best
    return [(f"{prefix}.{child}" if prefix else child, module) for child, module in children]


def _wrap_checkpointing(model: nn.Module, named: list[tuple[str, nn.Module]]) -> list[nn.Module]:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        checkpoint_wrapper,
    )

    wrapped = []
    for name, module in named:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        wrapper = checkpoint_wrapper(module, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        setattr(parent, child, wrapper)
        wrapped.append(wrapper)
    return wrapped


def _check_options(model: nn.Module, mixed_precision: str | None, cpu_offload: bool) -> None:
    from torch.distributed.fsdp import FSDPModule

    if mixed_precision not in (None, "fp32", *MIXED_PRECISIONS):
        raise ShardingError(
            f"mixed_precision must be None, 'fp32', 'bf16' or 'fp16', not {mixed_precision!r}"
        )
    if cpu_offload and not _accelerator_available():
        raise ShardingError(
            "cpu_offload needs an accelerator (a GPU): it keeps the shards in host memory "
            "and copies them to the device block by block. On this CPU-only machine the "
            "parameters are in host memory already; drop cpu_offload=True"
        )
    if isinstance(model, FSDPModule):
        raise ShardingError("this model is sharded already: call shard_model() once")
    if isinstance(model, nn.parallel.DistributedDataParallel):
        raise ShardingError("pass the model itself, not a DistributedDataParallel wrapper")


def shard_model(
    model: nn.Module,
    *,
    mixed_precision: str | None = None,
    activation_checkpointing: bool = False,
    cpu_offload: bool = False,
    reshard_after_forward: bool = True,
    blocks: Sequence[type[nn.Module]] | None = None,
) -> nn.Module:
    """Shard ``model`` in place with FSDP2 and return it.

    Args:
        mixed_precision: None or "fp32" (no casting), "bf16" or "fp16" for forward and
            backward.
        activation_checkpointing: recompute each block's activations in backward.
        cpu_offload: keep the shards in host memory (needs an accelerator).
        reshard_after_forward: free each block's gathered parameters after its forward
            (less memory, one more all-gather in backward), as FSDP2's option of that name.
        blocks: the module classes to shard one by one (a transformer's layer class);
            by default the children of the model's largest container of repeated
            modules. With none found, only the root is sharded (one all-gather for all).

    Build the optimizer after this call: it must see the sharded parameters.
    """
    _check_options(model, mixed_precision, cpu_offload)
    _ensure_group()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
    )

    device_type = "cuda" if dist.get_backend() == "nccl" else "cpu"
    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    dtype = MIXED_PRECISIONS.get(mixed_precision or "fp32")
    policy = MixedPrecisionPolicy()
    if dtype is not None:
        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    options: dict[str, Any] = {
        "mesh": mesh,
        "reshard_after_forward": reshard_after_forward,
        "mp_policy": policy,
        "offload_policy": CPUOffloadPolicy() if cpu_offload else OffloadPolicy(),
    }
    named = _repeated_blocks(model) if blocks is None else _given_blocks(model, blocks)
    if activation_checkpointing and not named:
        raise ShardingError(
            "activation_checkpointing needs blocks and none were found: pass blocks=(YourLayer,)"
        )
    units = _wrap_checkpointing(model, named) if activation_checkpointing else [m for _, m in named]
    for unit in units:
        fully_shard(unit, **options)
    fully_shard(model, **options)
    logger.info(
        "sharded %d block(s) and the root over %d worker(s) (%s, activation checkpointing %s)",
        len(units),
        mesh.size(),
        mixed_precision or "fp32",
        "on" if activation_checkpointing else "off",
    )
    return model
