"""sentence-transformers' own backends, the side of bench/minilm_cpu.py that a user would pick.

Run by a peer venv's interpreter, never Shamal's: ``--backend onnx`` in bench/.st-onnx-venv
(``sentence-transformers[onnx]``), ``--backend openvino`` in bench/.st-openvino-venv
(``sentence-transformers[openvino]`` and ``datasets``, which ST's static-quantization helper
needs). The two extras cannot share one venv: see minilm_cpu.py's ST_PEERS.

Every variant is what the sentence-transformers documentation ("Speeding up Inference") tells a
user to do, on a copy of the model folder in ``--workdir`` (nothing is written elsewhere; the
HF libraries run offline):

- ``onnx``: ``SentenceTransformer(path, backend="onnx")`` (fp32, exported by Optimum), then
  ``export_optimized_onnx_model(model, "O3", path)`` (graph fusions and fast GELU; O4 is fp16
  for GPUs only) and ``export_dynamic_quantized_onnx_model(model, "avx512_vnni", path)``
  (dynamic int8, the config for a CPU with AVX-512 VNNI), each reloaded with its ``file_name``.
  Threads: ``model_kwargs={"provider": "CPUExecutionProvider", "session_options": ...}`` with
  ``intra_op_num_threads``.
- ``openvino``: ``SentenceTransformer(path, backend="openvino")`` with ``ov_config``
  ``INFERENCE_PRECISION_HINT=f32`` (fp32), the same with OpenVINO's default precision where
  that is not f32 (bf16 on CPUs with AMX), and static int8 from
  ``export_static_quantized_openvino_model(model, OVQuantizationConfig(), path, dataset_name=
  <local folder>, ...)``: ST's helper itself, its calibration set read by ``datasets`` from a
  local JSON-lines file of held-out sentences (``--calibration``) instead of its default
  download (glue/sst2). Threads: ``ov_config`` ``INFERENCE_NUM_THREADS``.
- both: ``torch fp32 (<backend> venv)``, the plain ``SentenceTransformer(path)`` in this venv,
  timed in the same rounds: the speed-up against it holds even when the machine's load changes
  between this process and the parent's.

Each variant's ``forward`` runs on the same pre-tokenized features (``--inputs``: an .npz of
``input_ids`` and ``attention_mask``, [N, 128] int64), so tokenization is not timed. Latency:
a warm-up, then ``--rounds`` rounds in which every variant runs ``--runs-b1`` times at batch 1
and ``--runs-b32`` times at batch 32 in turn; the median per variant. Embeddings: all N rows
in batches of 32. Output: ``--out`` (JSON: names, medians, notes, versions) and the same path
with ``.npz`` (one array per variant, ``v0``, ``v1``...).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ[_name] = "1"
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402

PACKAGES = (
    "sentence-transformers",
    "transformers",
    "torch",
    "optimum",
    "optimum-onnx",
    "optimum-intel",
    "onnxruntime",
    "openvino",
    "nncf",
    "datasets",
)
ONNX_INT8_CONFIG = "avx512_vnni"
ONNX_OPT_LEVEL = "O3"


class Variant:
    """One model as a user would load it, and what the output should say about it."""

    def __init__(
        self, name: str, model: SentenceTransformer, note: str, reference: bool = False
    ) -> None:
        self.name = name
        self.model = model
        self.note = note
        self.reference = reference

    def embed(self, features: dict[str, torch.Tensor]) -> np.ndarray:
        with torch.inference_mode():
            out = self.model(dict(features))["sentence_embedding"]
        return np.asarray(out.float().numpy(), dtype=np.float32)


def versions() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def onnx_variants(path: Path, threads: int) -> list[Variant]:
    import onnxruntime as ort
    from sentence_transformers import (
        export_dynamic_quantized_onnx_model,
        export_optimized_onnx_model,
    )

    def load(file_name: str | None) -> SentenceTransformer:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        kwargs: dict[str, Any] = {"provider": "CPUExecutionProvider", "session_options": options}
        if file_name:
            kwargs["file_name"] = file_name
        return SentenceTransformer(str(path), backend="onnx", device="cpu", model_kwargs=kwargs)

    fp32 = load(None)  # exported by Optimum from the safetensors
    fp32.save_pretrained(str(path))  # writes onnx/model.onnx into the copy, as the docs advise
    export_optimized_onnx_model(fp32, ONNX_OPT_LEVEL, str(path))
    export_dynamic_quantized_onnx_model(fp32, ONNX_INT8_CONFIG, str(path))
    return [
        Variant("ST onnx fp32", load("onnx/model.onnx"), "backend='onnx'"),
        Variant(
            f"ST onnx {ONNX_OPT_LEVEL}",
            load(f"onnx/model_{ONNX_OPT_LEVEL}.onnx"),
            f"export_optimized_onnx_model '{ONNX_OPT_LEVEL}'",
        ),
        Variant(
            "ST onnx int8 dynamic",
            load(f"onnx/model_qint8_{ONNX_INT8_CONFIG}.onnx"),
            f"export_dynamic_quantized_onnx_model '{ONNX_INT8_CONFIG}'",
        ),
    ]


def _precision(model: SentenceTransformer) -> str:
    """The inference precision OpenVINO compiled the model with."""
    try:
        hint = model.transformers_model.request.get_property("INFERENCE_PRECISION_HINT")
    except (AttributeError, RuntimeError):
        return "unknown"
    return str(hint.to_string()) if hasattr(hint, "to_string") else str(hint)


def openvino_variants(path: Path, threads: int, calibration: Path) -> list[Variant]:
    from optimum.intel import OVQuantizationConfig
    from sentence_transformers import export_static_quantized_openvino_model

    base = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}

    def load(config: dict[str, Any], file_name: str | None = None) -> SentenceTransformer:
        kwargs: dict[str, Any] = {"ov_config": dict(config)}
        if file_name:
            kwargs["file_name"] = file_name
        return SentenceTransformer(str(path), backend="openvino", device="cpu", model_kwargs=kwargs)

    exported = load(base)  # exported by Optimum from the safetensors
    exported.save_pretrained(str(path))  # writes openvino/openvino_model.xml into the copy
    fp32 = load({**base, "INFERENCE_PRECISION_HINT": "f32"}, "openvino/openvino_model.xml")
    default = load(base, "openvino/openvino_model.xml")
    samples = sum(1 for _ in calibration.open(encoding="utf-8"))
    export_static_quantized_openvino_model(
        exported,
        OVQuantizationConfig(num_samples=samples),
        str(path),
        dataset_name=str(calibration.parent),
        dataset_config_name="default",
        dataset_split="train",
        column_name="sentence",
    )
    int8 = load(base, "openvino/openvino_model_qint8_quantized.xml")
    found = [Variant("ST openvino fp32", fp32, f"backend='openvino', {_precision(fp32)}")]
    if _precision(default) not in ("f32", "unknown"):
        found.append(
            Variant(f"ST openvino {_precision(default)}", default, "OpenVINO's default precision")
        )
    found.append(
        Variant(
            "ST openvino int8 static",
            int8,
            f"export_static_quantized_openvino_model, {samples} local calibration sentences, "
            f"OpenVINO's default precision elsewhere ({_precision(int8)})",
        )
    )
    return found


def medians(
    variants: list[Variant], feats: dict[str, torch.Tensor], runs: dict[int, int], rounds: int
) -> dict[str, dict[int, float]]:
    """Median latency in ms per variant and batch: a warm-up, then alternating rounds."""
    times: dict[str, dict[int, list[float]]] = {v.name: {1: [], 32: []} for v in variants}
    batches = {b: {k: t[:b] for k, t in feats.items()} for b in (1, 32)}
    for variant in variants:
        for batch in batches.values():
            variant.embed(batch)
    for _ in range(rounds):
        for size, batch in batches.items():
            for variant in variants:
                call = functools.partial(variant.embed, batch)
                times[variant.name][size] += _times_ms(call, runs[size])
    return {n: {b: statistics.median(t[b]) for b in (1, 32)} for n, t in times.items()}


def _times_ms(call: Callable[[], object], count: int) -> list[float]:
    found = []
    for _ in range(count):
        start = time.perf_counter()
        call()
        found.append((time.perf_counter() - start) * 1000.0)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=("onnx", "openvino"), required=True)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--inputs", type=Path, required=True)
    parser.add_argument("--calibration", type=Path, help="JSON lines of {'sentence': ...}")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs-b1", type=int, default=20)
    parser.add_argument("--runs-b32", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = args.workdir / "model"
    shutil.copytree(args.model_dir, path)
    with np.load(args.inputs, allow_pickle=False) as data:
        feats = {
            k: torch.from_numpy(np.ascontiguousarray(data[k], dtype=np.int64))
            for k in ("input_ids", "attention_mask")
        }
    feats["token_type_ids"] = torch.zeros_like(feats["input_ids"])
    started = time.perf_counter()
    if args.backend == "onnx":
        variants = onnx_variants(path, args.threads)
    else:
        if args.calibration is None:
            parser.error("--backend openvino needs --calibration")
        variants = openvino_variants(path, args.threads, args.calibration)
    built_s = time.perf_counter() - started
    reference = SentenceTransformer(str(path), device="cpu")
    variants.append(
        Variant(f"torch fp32 ({args.backend} venv)", reference, "PyTorch in this venv", True)
    )
    count = len(feats["input_ids"])
    embeddings = [
        np.concatenate(
            [v.embed({k: t[i : i + 32] for k, t in feats.items()}) for i in range(0, count, 32)]
        )
        for v in variants
    ]
    p50 = medians(variants, feats, {1: args.runs_b1, 32: args.runs_b32}, args.rounds)
    np.savez(args.out.with_suffix(".npz"), **{f"v{i}": e for i, e in enumerate(embeddings)})
    result = {
        "backend": args.backend,
        "built_s": built_s,
        "versions": versions(),
        "variants": [
            {
                "name": v.name,
                "note": v.note,
                "reference": v.reference,
                "b1_ms": p50[v.name][1],
                "b32_ms": p50[v.name][32],
            }
            for v in variants
        ],
    }
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
