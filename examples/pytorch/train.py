"""A small PyTorch job that uses the whole training runtime (`shamal.train`).

Runs on a CPU in seconds: an MLP with dropout on a synthetic classification set, AdamW
with warmup + cosine LR, gradient accumulation and clipping, bf16 autocast if asked,
early stopping on the validation loss, throughput logging, checkpoints every few steps
and on SIGTERM (then exit 75 so the scheduler requeues it), exact resume, and DDP when
launched as a multi-worker job. Its last line is ``weights sha256 <hex>`` so that an
uninterrupted run and a preempted-and-resumed one can be compared from their logs.

Checkpoints go to the platform's artifact store when the job has a team
(``SHAMAL_TEAM``), else to ``--checkpoint-dir``. Metrics go to tracking when
``MLFLOW_TRACKING_URI`` is set (it is, in a job).

    python train.py --steps 200                      # locally
    shamal job submit -- python train.py --steps 200 # as a job
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import logging
import os
import sys
import time
from typing import Any

import torch
from torch import nn

from shamal import train

logger = logging.getLogger("example")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200, help="optimizer steps in total")
    p.add_argument("--batch-size", type=int, default=32, help="global batch per step")
    p.add_argument("--accumulate", type=int, default=2, help="micro-steps per step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--checkpoint-dir", default="checkpoints")
    p.add_argument("--patience", type=int, default=1000, help="evaluations without gain")
    p.add_argument("--step-delay", type=float, default=0.0, help="seconds of sleep per step")
    p.add_argument("--save-weights", default=None, help="write final weights (safetensors)")
    p.add_argument("--experiment", default="examples-pytorch")
    return p.parse_args(argv)


def make_data(seed: int, n: int = 1024, features: int = 16, classes: int = 4) -> Any:
    g = torch.Generator().manual_seed(seed + 12345)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, classes, generator=g)
    y = (x @ w + 0.5 * torch.randn(n, classes, generator=g)).argmax(dim=1)
    return x, y


def weights_sha256(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def make_store(args: argparse.Namespace) -> train.CheckpointStore:
    if os.environ.get("SHAMAL_TEAM") and os.environ.get("SHAMAL_URL"):
        job = os.environ.get("SHAMAL_JOB_ID", "local")
        return train.ArtifactCheckpointStore(f"checkpoints/{job}")
    return train.LocalCheckpointStore(args.checkpoint_dir)


class Job:
    """Everything one training run holds; methods are the phases of :func:`main`."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dist = train.init_distributed()
        device = self.dist.device
        x, y = make_data(args.seed)
        self.train_xy = (x[:-256].to(device), y[:-256].to(device))
        self.val_xy = (x[-256:].to(device), y[-256:].to(device))
        self.model: nn.Module = nn.Sequential(
            nn.Linear(16, 64), nn.ReLU(), nn.Dropout(args.dropout), nn.Linear(64, 4)
        ).to(device)
        if self.dist.world_size > 1:
            self.model = nn.parallel.DistributedDataParallel(self.model)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr, weight_decay=0.01)
        self.scheduler = train.warmup_cosine(self.optimizer, args.steps // 10, args.steps)
        self.stepper = train.Stepper(
            self.model,
            self.optimizer,
            precision=args.precision,
            accumulate=args.accumulate,
            clip_norm=1.0,
            scheduler=self.scheduler,
        )
        self.sampler = train.ResumableSampler(
            len(self.train_xy[0]),
            seed=args.seed,
            rank=self.dist.rank,
            world_size=self.dist.world_size,
        )
        self.early = train.EarlyStopping(args.patience)
        self.ckpt = train.Checkpointer(make_store(args), keep_last=2, best_metric="val_loss")
        self.loss_fn = nn.CrossEntropyLoss()
        self.step = 0
        self.tracker: train.Tracker | None = None
        n_params = sum(p.numel() for p in self.model.parameters())
        self.meter = train.Throughput(
            flops_per_sample=6.0 * n_params, peak=train.current_device_peak(args.precision)
        )

    def resume(self) -> None:
        """Continue from the newest complete checkpoint, if any; start tracking."""
        resumed = self.ckpt.resume(
            model=self.model,
            optimizer=self.optimizer,
            scaler=self.stepper.scaler,
            scheduler=self.scheduler,
        )
        run_id = None
        if resumed is not None:
            self.step = resumed.step
            self.sampler.load_state_dict(resumed.data_state)
            self.stepper.load_state_dict(resumed.extra["stepper"])
            self.early.load_state_dict(resumed.extra["early"])
            run_id = resumed.extra.get("run_id")
            print(f"resumed from step {self.step} (attempt {train.attempt()})", flush=True)
        if self.dist.is_main and os.environ.get("MLFLOW_TRACKING_URI"):
            params = vars(self.args)
            self.tracker = train.Tracker(self.args.experiment, run_id=run_id, params=params)

    def save(self, metrics: dict[str, float] | None = None) -> None:
        extra = {
            "stepper": self.stepper.state_dict(),
            "early": self.early.state_dict(),
            "run_id": self.tracker.run_id if self.tracker else None,
        }
        self.ckpt.save(
            self.step,
            model=self.model,
            optimizer=self.optimizer,
            scaler=self.stepper.scaler,
            scheduler=self.scheduler,
            data_state=self.sampler.state_dict(),
            metrics=metrics,
            extra=extra,
        )

    def train_step(self) -> float:
        """Micro-steps until one optimizer step happened; returns the last loss."""
        self.model.train()
        x, y = self.train_xy
        micro = self.args.batch_size // (self.dist.world_size * self.args.accumulate)
        while True:
            index = torch.tensor(self.sampler.next_batch(micro), device=x.device)
            with self.stepper.micro_step():
                loss = self.loss_fn(self.model(x[index]), y[index])
            if self.stepper.backward(loss):
                self.step += 1
                self.meter.update(self.args.batch_size)
                return float(loss.detach())

    def evaluate_and_save(self) -> bool:
        """Validation loss, metrics, a checkpoint; True when early stopping says stop."""
        self.model.eval()
        with torch.no_grad(), self.stepper.autocast():
            val = float(self.loss_fn(self.model(self.val_xy[0]), self.val_xy[1]))
        rates = self.meter.report()
        if self.tracker is not None:
            self.tracker.log_metrics({"val_loss": val, **rates}, self.step)
        logger.info("step %d val_loss %.4f %s", self.step, val, rates)
        stop = self.early.update(val)  # before saving, so a resumed run knows it
        self.save({"val_loss": val})
        return stop

    def run(self) -> None:
        """The loop: train, evaluate and checkpoint every few steps, obey SIGTERM."""
        args = self.args
        with train.PreemptionGuard() as guard:
            if self.tracker is not None:
                guard.on_stop(self.tracker.flush)
            while self.step < args.steps:
                loss = self.train_step()
                if args.step_delay:
                    time.sleep(args.step_delay)
                if self.tracker is not None:
                    lr = self.scheduler.get_last_lr()[0]
                    self.tracker.log_metrics({"loss": loss, "lr": float(lr)}, self.step)
                due = self.step % args.checkpoint_every == 0 or self.step == args.steps
                stop = self.evaluate_and_save() if due else False
                if guard.should_stop():
                    if not due:
                        self.save()
                    print(f"preempted at step {self.step}: checkpointed, exiting 75", flush=True)
                    guard.exit()
                if stop:
                    print(f"early stop at step {self.step}", flush=True)
                    return

    def finish(self) -> str:
        """End tracking, optionally write the weights; returns their sha256."""
        if self.tracker is not None:
            self.tracker.close()
        final = getattr(self.model, "module", self.model)
        # Drop the DDP wrapper (and the stepper holding it) before leaving the process group:
        # a reducer that outlives its group can hang the interpreter at exit.
        self.model = final
        del self.stepper
        gc.collect()
        if self.args.save_weights and self.dist.is_main:
            from safetensors.torch import save_file

            tensors = {k: v.contiguous() for k, v in final.state_dict().items()}
            save_file(tensors, self.args.save_weights)
        train.shutdown()
        return weights_sha256(final)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    job = Job(args)
    job.resume()
    job.run()
    print(f"weights sha256 {job.finish()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
