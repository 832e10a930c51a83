"""One worker of a tiny FSDP training run (started by tests/train/test_fsdp.py).

The global batch of step ``s`` is a fixed function of ``s`` (12 rows, seeded by the step);
worker ``r`` of ``W`` trains on rows ``r::W``, so every world size that divides 12 sees the
same global batch and FSDP's gradient averaging gives the same update. Rank 0 writes a JSON
report (the global loss of every step it ran, where it started, a refusal's message) and
the full parameters and optimizer moments right after saving or resuming, as safetensors.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

from shamal.train import (
    ArtifactCheckpointStore,
    LocalCheckpointStore,
    ShardedCheckpointer,
    ShardedCheckpointError,
    init_distributed,
    shard_model,
    shutdown,
    warmup_cosine,
)

GLOBAL_BATCH = 12


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(width, 2 * width)
        self.down = torch.nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class Net(torch.nn.Module):
    def __init__(self, width: int = 16, depth: int = 3) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(8, width)
        self.blocks = torch.nn.ModuleList(Block(width) for _ in range(depth))
        self.head = torch.nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


class RecordingStore(LocalCheckpointStore):
    """A local store that notes every key this worker puts (for the once-per-shard check)."""

    def __init__(self, root: Path, log: Path) -> None:
        super().__init__(root)
        self.log = log

    def put(self, key: str, data: bytes) -> None:
        super().put(key, data)
        with self.log.open("a") as f:
            f.write(key + "\n")


def batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL_BATCH, 8, generator=generator)
    y = torch.randn(GLOBAL_BATCH, 1, generator=generator)
    return x[rank::world], y[rank::world]


def dump_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: Path, rank: int
) -> None:
    """The full (unsharded) parameters and AdamW moments, as rank 0 sees them."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    if rank != 0:
        return
    tensors = {f"model.{k}": v for k, v in model_state.items()}
    for fqn, moments in optim_state["state"].items():
        for key, value in moments.items():
            tensors[f"optim.{fqn}.{key}"] = torch.as_tensor(value)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--store", type=Path, help="a local store folder (else the artifact store)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--save-at", type=int, default=0)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--checkpointing", action="store_true")
    return parser.parse_args()


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.info = init_distributed()
        args.out.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(0)
        self.model = shard_model(
            Net(), mixed_precision=args.precision, activation_checkpointing=args.checkpointing
        )
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2, weight_decay=0.1)
        self.scheduler = warmup_cosine(self.optimizer, 2, args.steps)
        if args.store is not None:
            log = args.out / f"puts-{self.info.rank}.txt"
            store: LocalCheckpointStore | ArtifactCheckpointStore = RecordingStore(args.store, log)
        else:
            store = ArtifactCheckpointStore(os.environ["CKPT_PREFIX"])
        self.checkpointer = ShardedCheckpointer(store, keep_last=1)
        self.report: dict[str, object] = {"world": self.info.world_size, "start": 0}

    def dump(self, name: str) -> None:
        dump_state(self.model, self.optimizer, self.args.out / name, self.info.rank)

    def resume(self) -> int | None:
        """The step to continue from, or None when the checkpoint was refused."""
        self.dump("before.st")
        try:
            resumed = self.checkpointer.resume(
                model=self.model, optimizer=self.optimizer, scheduler=self.scheduler
            )
        except ShardedCheckpointError as exc:
            self.report["error"] = str(exc)
            print(f"refused: {exc}", flush=True)
            self.dump("refused.st")
            return None
        if resumed is None:
            return 0
        self.report.update(saved_world=resumed.world_size, data_state=resumed.data_state)
        self.dump("loaded.st")
        return resumed.step

    def step(self, step: int) -> float:
        x, y = batch(step, self.info.rank, self.info.world_size)
        loss = torch.nn.functional.mse_loss(self.model(x).float(), y)
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total)
        return total.item() / self.info.world_size

    def train(self, start: int) -> None:
        losses: dict[str, float] = {}
        for step in range(start, self.args.steps):
            losses[str(step)] = self.step(step)
            if step + 1 == self.args.save_at:
                self.checkpointer.save(
                    step + 1,
                    model=self.model,
                    optimizer=self.optimizer,
                    scheduler=self.scheduler,
                    data_state={"rank": self.info.rank, "next_step": step + 1},
                    metrics={"loss": losses[str(step)]},
                )
                self.dump("saved.st")
        self.report["losses"] = losses


def main() -> None:
    run = Run(arguments())
    start = run.resume() if run.args.resume else 0
    if start is not None:
        run.report["start"] = start
        run.train(start)
    if run.info.rank == 0:
        (run.args.out / "report.json").write_text(json.dumps(run.report))
    shutdown()


if __name__ == "__main__":
    main()
