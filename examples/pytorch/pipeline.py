"""A model split into pipeline stages across the workers of a gang job (`shamal.train`).

Runs on CPUs in seconds: an MLP (an ``nn.Sequential``) cut into one stage per worker
(``--schedule 1f1b``) or two (``--schedule interleaved --stages-per-rank 2``), each batch
cut into ``--microbatches``. Every rank checkpoints its own stages (exact resume, also
after a preemption: SIGTERM, checkpoint, exit 75, requeued). Rank 0 logs the loss to
tracking when ``MLFLOW_TRACKING_URI`` is set. Each rank's last line is ``weights sha256
<hex>`` of its own stages.

    shamal job submit --workers 2 -- python pipeline.py --steps 40

``--unsplit`` trains the same model in one process (the reference the tests compare
with); ``--dump DIR`` writes the first step's loss and gradients there.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from shamal import train

logger = logging.getLogger("pipeline-example")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=40, help="optimizer steps in total")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--schedule", choices=["1f1b", "interleaved"], default="1f1b")
    p.add_argument("--stages-per-rank", type=int, default=1)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--checkpoint-dir", default="checkpoints")
    p.add_argument("--unsplit", action="store_true", help="one process, no pipeline")
    p.add_argument("--dump", default=None, help="write the first step's loss and grads here")
    p.add_argument("--preempt-at", type=int, default=0, help="act as if SIGTERM came here")
    p.add_argument("--step-delay", type=float, default=0.0, help="seconds of sleep per step")
    p.add_argument("--experiment", default="examples-pipeline")
    return p.parse_args(argv)


def make_data(seed: int, n: int = 512, features: int = 16, classes: int = 4) -> Any:
    g = torch.Generator().manual_seed(seed + 12345)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, classes, generator=g)
    return x, (x @ w).argmax(dim=1)


def make_model(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)  # every rank builds the same model, then keeps its stages
    return nn.Sequential(
        nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4)
    )


def weights_sha256(module: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def make_store(args: argparse.Namespace) -> train.CheckpointStore:
    if os.environ.get("SHAMAL_TEAM") and os.environ.get("SHAMAL_URL"):
        return train.ArtifactCheckpointStore(f"checkpoints/{os.environ['SHAMAL_JOB_ID']}")
    return train.LocalCheckpointStore(args.checkpoint_dir)


class Unsplit:
    """The same interface as a pipeline, for the whole model in one process."""

    def __init__(self, model: nn.Module) -> None:
        self.module = model
        self.loss_fn = nn.CrossEntropyLoss()

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        loss = self.loss_fn(self.module(x), y)
        loss.backward()
        return float(loss.detach())


class Job:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dist = train.init_distributed()
        model = make_model(args.seed)
        plan = train.plan_for_job(model)
        print(f"plan: {plan.strategy} ({plan.reason})", flush=True)
        self.runner: Any
        if args.unsplit:
            self.runner = Unsplit(model)
            self.ckpt: Any = train.Checkpointer(train.LocalCheckpointStore(args.checkpoint_dir))
        else:
            self.runner = train.pipeline_stages(
                model,
                n_microbatches=args.microbatches,
                loss_fn=nn.CrossEntropyLoss(),
                schedule=args.schedule,
                stages_per_rank=args.stages_per_rank,
            )
            self.ckpt = self.runner.checkpointer(make_store(args), keep_last=2)
            print(f"stage(s) {list(self.runner.indices)} of {self.runner.n_stages}", flush=True)
        self.module: nn.Module = self.runner.module
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=args.lr)
        self.x, self.y = make_data(args.seed)
        self.sampler = train.ResumableSampler(len(self.x), seed=args.seed)
        self.step = 0
        self.tracker: train.Tracker | None = None

    def resume(self) -> None:
        kwargs: dict[str, Any] = {"model": self.module} if self.args.unsplit else {}
        resumed = self.ckpt.resume(optimizer=self.optimizer, **kwargs)
        run_id = None
        if resumed is not None:
            self.step = resumed.step
            self.sampler.load_state_dict(resumed.data_state)
            run_id = resumed.extra.get("run_id")
            print(f"resumed from step {self.step} (attempt {train.attempt()})", flush=True)
        if self.dist.is_main and os.environ.get("MLFLOW_TRACKING_URI"):
            self.tracker = train.Tracker(self.args.experiment, run_id=run_id, params={})

    def save(self) -> None:
        extra = {"run_id": self.tracker.run_id if self.tracker else None}
        kwargs: dict[str, Any] = {"model": self.module} if self.args.unsplit else {}
        self.ckpt.save(
            self.step,
            optimizer=self.optimizer,
            data_state=self.sampler.state_dict(),
            extra=extra,
            **kwargs,
        )

    def train_step(self) -> float:
        index = torch.tensor(self.sampler.next_batch(self.args.batch_size))
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.runner.step(self.x[index], self.y[index])
        if self.args.dump and self.step == 0:
            self.dump(float(loss))
        self.optimizer.step()
        self.step += 1
        return float(loss)

    def dump(self, loss: float) -> None:
        from safetensors.torch import save_file

        folder = Path(self.args.dump)
        folder.mkdir(parents=True, exist_ok=True)
        grads = {n: p.grad.detach().clone() for n, p in self.module.named_parameters()}
        grads["__loss__"] = torch.tensor([loss], dtype=torch.float64)
        save_file(grads, str(folder / f"rank{self.dist.rank}.safetensors"))

    def run(self) -> None:
        args = self.args
        with train.PreemptionGuard() as guard:
            if self.tracker is not None:
                guard.on_stop(self.tracker.flush)
            while self.step < args.steps:
                loss = self.train_step()
                print(f"step {self.step} loss {loss:.6f}", flush=True)
                if self.tracker is not None:
                    self.tracker.log_metrics({"loss": loss}, self.step)
                if args.step_delay:
                    time.sleep(args.step_delay)
                if self.step == args.preempt_at and train.attempt() == 1:
                    guard.request()
                due = self.step % args.checkpoint_every == 0 or self.step == args.steps
                if due:
                    self.save()
                if guard.should_stop():
                    if not due:
                        self.save()
                    print(f"preempted at step {self.step}: checkpointed, exiting 75", flush=True)
                    guard.exit()

    def finish(self) -> str:
        if self.tracker is not None:
            self.tracker.close()
        digest = weights_sha256(self.module)
        del self.runner
        train.shutdown()
        return digest


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    job = Job(args)
    job.resume()
    job.run()
    print(f"weights sha256 {job.finish()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
