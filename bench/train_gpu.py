"""GPU efficiency of the training runtime: MFU of a GPT-2-small-sized LM in bf16.

Trains a GPT-2-small-shaped decoder (12 layers, d=768, 12 heads, 1024 tokens, vocab
50304, tied embeddings; ~124M parameters) on synthetic tokens, twice per round:

- **by hand**: bf16 autocast, backward, clip, fused AdamW step, LR schedule step;
- **helpers**: the same loop through :class:`shamal.train.Stepper` (precision, clipping,
  schedule), :class:`~shamal.train.Throughput` (MFU) and
  :class:`~shamal.train.PreemptionGuard` (a stop check per step).

It prints tokens/s and MFU for both and the helpers' overhead (acceptance: MFU >= 40%
on one H100/H200, overhead < 3%). MFU = (6·N + 12·L·d·T) FLOPs/token x tokens/s / the
device's dense bf16 peak (``shamal.train.PEAK_FLOPS``). The 40% target needs an H100 or
H200; on other GPUs the figures are still printed, on a CPU MFU is ``None``.

    python bench/train_gpu.py                 # the real benchmark (GPU)
    python bench/train_gpu.py --quick         # a tiny model, a smoke test that runs on CPU
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from shamal import train


@dataclass(frozen=True)
class Config:
    layers: int = 12
    d_model: int = 768
    heads: int = 12
    seq_len: int = 1024
    vocab: int = 50304  # GPT-2's 50257 padded to a multiple of 64
    batch: int = 16


QUICK = Config(layers=2, d_model=64, heads=4, seq_len=64, vocab=256, batch=4)


class Block(nn.Module):
    def __init__(self, c: Config) -> None:
        super().__init__()
        self.heads = c.heads
        self.ln1 = nn.LayerNorm(c.d_model)
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model)
        self.proj = nn.Linear(c.d_model, c.d_model)
        self.ln2 = nn.LayerNorm(c.d_model)
        self.fc = nn.Linear(c.d_model, 4 * c.d_model)
        self.out = nn.Linear(4 * c.d_model, c.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        out: torch.Tensor = x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return out


class GPT(nn.Module):
    def __init__(self, c: Config) -> None:
        super().__init__()
        self.wte = nn.Embedding(c.vocab, c.d_model)
        self.wpe = nn.Embedding(c.seq_len, c.d_model)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.ln = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab, bias=False)
        self.head.weight = self.wte.weight  # tied, as in GPT-2

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        loss: torch.Tensor = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        return loss


def flops_per_token(model: GPT, c: Config) -> float:
    """nanoGPT-style accounting: all parameters except positions, plus attention."""
    n = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    return train.transformer_flops_per_token(n, c.layers, c.d_model, c.seq_len)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _setup(model: nn.Module, device: torch.device, steps: int) -> tuple[Any, Any]:
    fused = device.type == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, fused=fused)
    scheduler = train.warmup_cosine(optimizer, warmup_steps=10, total_steps=10 * steps)
    return optimizer, scheduler


def by_hand(model: nn.Module, batches: list[Any], device: torch.device) -> float:
    """The loop without the runtime; returns seconds for all batches."""
    optimizer, scheduler = _setup(model, device, len(batches))
    _sync(device)
    start = time.perf_counter()
    for x, y in batches:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
    _sync(device)
    return time.perf_counter() - start


def with_helpers(
    model: nn.Module, batches: list[Any], device: torch.device, meter: train.Throughput
) -> float:
    """The same loop through Stepper, Throughput and PreemptionGuard."""
    optimizer, scheduler = _setup(model, device, len(batches))
    stepper = train.Stepper(
        model, optimizer, precision="bf16", clip_norm=1.0, scheduler=scheduler, device=device
    )
    with train.PreemptionGuard() as guard:
        _sync(device)
        start = time.perf_counter()
        for x, y in batches:
            with stepper.micro_step():
                loss = model(x, y)
            stepper.backward(loss)
            meter.update(x.shape[0], x.numel())
            if guard.should_stop():
                break
        _sync(device)
        return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="MFU of a GPT-2-small LM with and without helpers")
    p.add_argument("--quick", action="store_true", help="tiny model, few steps (CPU smoke test)")
    p.add_argument("--steps", type=int, default=None, help="measured steps per loop and round")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (median taken)")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None)
    args = p.parse_args(argv)

    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    c = QUICK if args.quick else Config()
    if args.batch:
        c = Config(**{**asdict(c), "batch": args.batch})
    steps = args.steps or (3 if args.quick else 30)
    torch.manual_seed(0)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    model: nn.Module = GPT(c).to(device)
    fpt = flops_per_token(model, c)  # type: ignore[arg-type]
    if args.compile if args.compile is not None else device.type == "cuda":
        model = torch.compile(model)  # type: ignore[assignment]
    g = torch.Generator(device="cpu").manual_seed(0)
    batches = [
        (t[:, :-1].to(device), t[:, 1:].to(device))
        for t in (
            torch.randint(c.vocab, (c.batch, c.seq_len + 1), generator=g) for _ in range(steps)
        )
    ]
    peak = train.current_device_peak("bf16")
    by_hand(model, batches[: max(1, steps // 3)], device)  # warm-up (and compile)
    hand, helped = [], []
    for _ in range(args.rounds):
        hand.append(by_hand(model, batches, device))
        meter = train.Throughput(flops_per_token=fpt, peak=peak)
        helped.append(with_helpers(model, batches, device, meter))
    tokens = steps * c.batch * c.seq_len
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "config": asdict(c),
        "steps": steps,
        "rounds": args.rounds,
        "flops_per_token": fpt,
        "peak_flops": peak,
    }
    for name, times in (("by_hand", hand), ("helpers", helped)):
        rate = tokens / statistics.median(times)
        report[name] = {"tokens_per_s": rate, "mfu": rate * fpt / peak if peak else None}
    ratio = report["by_hand"]["tokens_per_s"] / report["helpers"]["tokens_per_s"]
    report["helpers_overhead"] = ratio - 1.0
    print(json.dumps(report, indent=2))
    for name in ("by_hand", "helpers"):
        mfu = report[name]["mfu"]
        shown = f"{100 * mfu:.1f}%" if mfu is not None else "None (no GPU peak)"
        print(f"{name:8s} {report[name]['tokens_per_s']:12.0f} tokens/s  MFU {shown}")
    print(f"helpers overhead {100 * report['helpers_overhead']:+.2f}% (target < 3%)")
    if not math.isfinite(ratio):
        raise SystemExit(1)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
