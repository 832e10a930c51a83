"""A seeded sampler whose position is part of the checkpoint.

Each epoch is a permutation drawn from ``seed + epoch`` (independent of the global RNG),
split across ranks like :class:`torch.utils.data.DistributedSampler` (rank ``r`` takes
``perm[r::world_size]``). The sampler counts the indices it has handed out; that count
and the epoch are its state, so a resumed run continues with the very next batch. Use it
with ``num_workers=0`` or read batches with :meth:`ResumableSampler.next_batch` (loader
workers prefetch, which would count indices not yet trained on).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["ResumableSampler"]


class ResumableSampler(torch.utils.data.Sampler[int]):
    """Deterministic, resumable, rank-aware sampling over ``num_samples`` items."""

    def __init__(
        self, num_samples: int, *, seed: int = 0, rank: int = 0, world_size: int = 1
    ) -> None:
        if not 0 <= rank < world_size or num_samples < world_size:
            raise ValueError("need 0 <= rank < world_size <= num_samples")
        self.num_samples = num_samples
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.position = 0
        self._order: list[int] | None = None

    @property
    def per_rank(self) -> int:
        """Indices per rank and epoch (the tail that does not divide evenly is dropped)."""
        return self.num_samples // self.world_size

    def _epoch_order(self) -> list[int]:
        if self._order is None:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            perm = torch.randperm(self.num_samples, generator=generator)
            usable = perm[: self.per_rank * self.world_size]
            self._order = usable[self.rank :: self.world_size].tolist()
        return self._order

    def _advance_epoch(self) -> None:
        self.epoch += 1
        self.position = 0
        self._order = None

    def next_batch(self, batch_size: int) -> list[int]:
        """The next ``batch_size`` indices; rolls into the next epoch when one ends."""
        if self.position + batch_size > self.per_rank:
            self._advance_epoch()
            if batch_size > self.per_rank:
                raise ValueError("batch_size exceeds the samples per rank")
        order = self._epoch_order()
        batch = order[self.position : self.position + batch_size]
        self.position += batch_size
        return batch

    def __iter__(self) -> Iterator[int]:
        if self.position >= self.per_rank:
            self._advance_epoch()
        order = self._epoch_order()
        while self.position < len(order):
            index = order[self.position]
            self.position += 1
            yield index

    def __len__(self) -> int:
        return self.per_rank - self.position

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["seed"]) != self.seed:
            raise ValueError("checkpoint was made with another sampler seed")
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = None
