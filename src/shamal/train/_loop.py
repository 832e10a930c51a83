"""Helpers for a training loop the user writes: precision, accumulation, clipping,
warmup schedules and early stopping.

:class:`Stepper` wraps the three lines around ``loss.backward()`` that differ between
fp32, bf16 and fp16 and between one step and accumulated micro-steps::

    stepper = Stepper(model, optimizer, precision="bf16", accumulate=4, clip_norm=1.0)
    for batch in batches:
        with stepper.micro_step():           # forward only: autocast (+ DDP no_sync)
            loss = loss_fn(model(batch.x), batch.y)
        if stepper.backward(loss):           # outside autocast, as PyTorch recommends
            ...  # one optimizer step happened: log, checkpoint, etc.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["EarlyStopping", "Stepper", "WarmupCosine", "warmup_cosine"]

logger = logging.getLogger(__name__)

_PRECISIONS = ("fp32", "bf16", "fp16")


class Stepper:
    """Mixed precision, gradient accumulation, clipping and the LR schedule step.

    Args:
        precision: "fp32", "bf16" (autocast, no scaler) or "fp16" (autocast and a
            GradScaler). fp16 needs a GPU: on CPU it falls back to fp32 and logs why.
        accumulate: micro-steps per optimizer step; the loss is divided by it, and a
            DistributedDataParallel model skips the gradient all-reduce until the last.
        clip_norm: clip the global gradient norm to this value (after unscaling).
        scheduler: an LR scheduler stepped once per optimizer step.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        precision: str = "fp32",
        accumulate: int = 1,
        clip_norm: float | None = None,
        scheduler: Any = None,
        device: torch.device | str | None = None,
    ) -> None:
        if precision not in _PRECISIONS or accumulate < 1:
            raise ValueError(f"precision must be one of {_PRECISIONS} and accumulate >= 1")
        self.model = model
        self.optimizer = optimizer
        self.accumulate = accumulate
        self.clip_norm = clip_norm
        self.scheduler = scheduler
        if device is None:
            first = next(model.parameters(), None)
            device = first.device if first is not None else torch.device("cpu")
        self.device_type = torch.device(device).type
        if precision == "fp16" and self.device_type != "cuda":
            logger.warning(
                "fp16 with a grad scaler needs a GPU; training in fp32 on %s", self.device_type
            )
            precision = "fp32"
        self.precision = precision
        self.scaler = torch.amp.GradScaler(self.device_type, enabled=precision == "fp16")
        self.micro = 0
        self.steps = 0
        self.stepped = False
        self._grad_norm: torch.Tensor | None = None

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """Autocast to the chosen precision (no-op for fp32)."""
        if self.precision == "fp32":
            yield
            return
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
        with torch.autocast(self.device_type, dtype=dtype):
            yield

    @property
    def boundary(self) -> bool:
        """Whether the current micro-step is the last before an optimizer step."""
        return (self.micro + 1) % self.accumulate == 0

    def _sync_context(self) -> contextlib.AbstractContextManager[None]:
        no_sync = getattr(self.model, "no_sync", None)
        if self.boundary or no_sync is None:
            return contextlib.nullcontext()
        context: contextlib.AbstractContextManager[None] = no_sync()
        return context

    @contextlib.contextmanager
    def micro_step(self) -> Iterator[None]:
        """For the forward pass: autocast, and on micro-steps that do not step, DDP's
        ``no_sync`` (so gradients are all-reduced once per optimizer step). Call
        :meth:`backward` after the block, outside autocast."""
        with self._sync_context(), self.autocast():
            yield

    def backward(self, loss: torch.Tensor) -> bool:
        """Backpropagate ``loss / accumulate``; step the optimizer on the last micro-step.

        Returns (and stores in :attr:`stepped`) whether an optimizer step happened.
        """
        scaled = loss / self.accumulate if self.accumulate > 1 else loss
        with self._sync_context():
            self.scaler.scale(scaled).backward()  # type: ignore[no-untyped-call]
        self.stepped = self.boundary
        self.micro += 1
        if self.stepped:
            self._optimizer_step()
        return self.stepped

    def _optimizer_step(self) -> None:
        if self.clip_norm is not None:
            self.scaler.unscale_(self.optimizer)
            self._grad_norm = torch.nn.utils.clip_grad_norm_(
                self.model.parameters(), self.clip_norm
            )
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if self.scheduler is not None:
            self.scheduler.step()
        self.steps += 1

    @property
    def last_grad_norm(self) -> float | None:
        """The gradient norm before the last clipping (reading it waits for the GPU)."""
        return None if self._grad_norm is None else float(self._grad_norm)

    def state_dict(self) -> dict[str, Any]:
        return {"micro": self.micro, "steps": self.steps, "scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.micro = int(state["micro"])
        self.steps = int(state["steps"])
        if state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])


class WarmupCosine:
    """LR multiplier: linear warmup to 1, then cosine decay to ``min_ratio``.

    A plain object with number attributes, so LambdaLR's state dict (and a checkpoint)
    can hold it.
    """

    def __init__(self, warmup_steps: int, total_steps: int, min_ratio: float = 0.0) -> None:
        if not 0 <= warmup_steps <= total_steps or total_steps < 1:
            raise ValueError("need 0 <= warmup_steps <= total_steps and total_steps >= 1")
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.min_ratio = min_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def warmup_cosine(
    optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int, min_ratio: float = 0.0
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR with :class:`WarmupCosine`; step it once per optimizer step."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, WarmupCosine(warmup_steps, total_steps, min_ratio)
    )


class EarlyStopping:
    """Stop when a tracked metric has not improved by ``min_delta`` for ``patience`` checks."""

    def __init__(self, patience: int, *, mode: str = "min", min_delta: float = 0.0) -> None:
        if patience < 1 or mode not in ("min", "max"):
            raise ValueError("patience must be >= 1 and mode 'min' or 'max'")
        self.patience = patience
        self.mode = mode
        self.min_delta = min_delta
        self.best: float | None = None
        self.bad = 0

    def update(self, value: float) -> bool:
        """Record ``value``; True when training should stop."""
        better = self.best is None or (
            value < self.best - self.min_delta
            if self.mode == "min"
            else value > self.best + self.min_delta
        )
        if better:
            self.best, self.bad = value, 0
        else:
            self.bad += 1
        return self.bad >= self.patience

    @property
    def improved(self) -> bool:
        """Whether the last :meth:`update` set a new best."""
        return self.bad == 0 and self.best is not None

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "bad": self.bad}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = state["best"]
        self.bad = int(state["bad"])
