"""Fidelity of a variant against its original, and its latency and throughput.

Fidelity compares outputs on held-out inputs: the task metric of original and variant
(accuracy or R2 when labels are known, agreement with the original when they are not) and the
output distance (max abs difference; per-row cosine for embeddings and other float outputs).
A classifier or regressor variant whose metric drops by more than ``max_metric_drop``, or an
embedding (or other float-output) variant whose minimum cosine falls under ``min_cosine``, or
whose mean cosine falls under ``min_cosine_mean``, is BLOCKED.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shamal.errors import InvalidParameter
from shamal.optimize._lazy import module
from shamal.optimize._safety import sniff_format

__all__ = [
    "Fidelity",
    "Thresholds",
    "Timing",
    "compare",
    "load_arrays",
    "measure_head_to_head",
    "measure_latency",
]

logger = logging.getLogger(__name__)

Outputs = dict[str, np.ndarray]
_NUMPY_MAGIC = b"\x93NUMPY"
LABEL_KEY = "y"


@dataclass(frozen=True, slots=True)
class Thresholds:
    """What blocks a variant."""

    max_metric_drop: float = 0.01
    min_cosine: float = 0.97
    min_cosine_mean: float = 0.99


@dataclass(frozen=True, slots=True)
class Fidelity:
    """How close a variant is to its original on ``rows`` held-out inputs from ``origin``."""

    metric: str
    original: float
    variant: float
    max_abs_diff: float
    cosine_mean: float | None
    cosine_min: float | None
    rows: int
    origin: str
    blocked: bool
    reason: str

    @property
    def drop(self) -> float:
        return self.original - self.variant


@dataclass(frozen=True, slots=True)
class Timing:
    """Median latency of one batch size at one thread count."""

    batch: int
    threads: int
    p50_ms: float
    items_per_s: float


# ---------------------------------------------------------------------- data files
def _load_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as found:
            return {k: np.asarray(found[k]) for k in found.files}
    except (ValueError, OSError):
        raise InvalidParameter(f"{path.name}: not a readable .npz of plain arrays.") from None


def _load_csv(path: Path) -> dict[str, np.ndarray]:
    try:
        table: Any = np.genfromtxt(path, delimiter=",", names=True, dtype=np.float64)
    except ValueError:
        raise InvalidParameter(f"{path.name}: not a numeric CSV with a header row.") from None
    names = list(table.dtype.names or ())
    columns: dict[str, np.ndarray] = {n: np.asarray(table[n]) for n in names}
    out = {"X": np.column_stack([columns[n] for n in names if n != LABEL_KEY])}
    if LABEL_KEY in columns:
        out[LABEL_KEY] = columns[LABEL_KEY]
    return out


def load_arrays(
    path: Path, input_names: Sequence[str]
) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """Named input arrays and optional labels (``y``) from ``.npz``, ``.npy`` or ``.csv``
    (told apart by their bytes). ``.npy`` and ``.csv`` are for single-input models; a CSV's
    column ``y`` is the label. Pickled arrays are refused.

    Raises:
        InvalidParameter: unreadable data, or inputs the model needs are missing.
    """
    path = Path(path)
    with path.open("rb") as f:
        head = f.read(6)
    kind = sniff_format(path)
    if head == _NUMPY_MAGIC:
        try:
            arrays = {"X": np.load(path, allow_pickle=False)}
        except ValueError:
            raise InvalidParameter(f"{path.name}: pickled .npy arrays are refused.") from None
    elif kind == "zip":
        arrays = _load_npz(path)
    elif kind == "text":
        arrays = _load_csv(path)
    else:
        raise InvalidParameter(f"{path.name}: expected .npz, .npy or .csv data (got {kind}).")
    labels = arrays.pop(LABEL_KEY, None)
    if len(input_names) == 1 and input_names[0] not in arrays and len(arrays) == 1:
        arrays = {input_names[0]: next(iter(arrays.values()))}
    missing = [n for n in input_names if n not in arrays]
    if missing:
        raise InvalidParameter(f"{path.name}: no array for input(s) {', '.join(missing)}.")
    return {n: arrays[n] for n in input_names}, labels


# ---------------------------------------------------------------------- fidelity
def _is_float(a: np.ndarray) -> bool:
    return a.dtype.kind == "f"


def row_cosines(ref: np.ndarray, var: np.ndarray) -> np.ndarray:
    """The cosine of each row of ``var`` to the same row of ``ref`` (1 where they are equal)."""
    a = ref.reshape(len(ref), -1).astype(np.float64)
    b = var.reshape(len(var), -1).astype(np.float64)
    den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    same = np.all(a == b, axis=1)
    return np.where(same, 1.0, (a * b).sum(1) / np.maximum(den, 1e-30))


def _r2(truth: np.ndarray, pred: np.ndarray) -> float:
    t, p = truth.astype(np.float64).ravel(), pred.astype(np.float64).ravel()
    total = float(((t - t.mean()) ** 2).sum())
    return 1.0 - float(((t - p) ** 2).sum()) / total if total > 0 else float(np.all(t == p))


def _task_metric(
    task: str, ref: Outputs, var: Outputs, labels: np.ndarray | None
) -> tuple[str, float, float]:
    first_ref, first_var = next(iter(ref.values())), next(iter(var.values()))
    if task == "classification":
        if labels is not None:
            truth = labels.ravel()
            return (
                "accuracy",
                float(np.mean(first_ref.ravel() == truth)),
                float(np.mean(first_var.ravel() == truth)),
            )
        return "label agreement", 1.0, float(np.mean(first_ref.ravel() == first_var.ravel()))
    if task == "regression":
        if labels is not None:
            return "r2", _r2(labels, first_ref), _r2(labels, first_var)
        return "r2 vs original", 1.0, _r2(first_ref, first_var)
    cos = row_cosines(first_ref, first_var)
    return "cosine mean", 1.0, float(cos.mean())


def compare(
    task: str,
    reference: Outputs,
    variant: Outputs,
    labels: np.ndarray | None,
    thresholds: Thresholds,
    origin: str,
) -> Fidelity:
    """The fidelity of ``variant`` outputs against ``reference`` outputs (same names)."""
    if set(reference) != set(variant):
        raise InvalidParameter("The variant's outputs differ from the original's.")
    variant = {k: variant[k] for k in reference}  # same order
    floats = [k for k, v in reference.items() if _is_float(v)]
    diffs = [float(np.max(np.abs(reference[k] - variant[k]), initial=0.0)) for k in floats]
    cos_mean = cos_min = None
    if task in ("embedding", "other") and floats:
        cos = row_cosines(reference[floats[0]], variant[floats[0]])
        cos_mean, cos_min = float(cos.mean()), float(cos.min())
    metric, original, achieved = _task_metric(task, reference, variant, labels)
    reason = ""
    # Classifiers and regressors are gated on their task metric; embeddings and other float
    # outputs on the worst row's cosine (their "metric" is the mean cosine, reported only).
    task_metric = task in ("classification", "regression")
    if task_metric and original - achieved > thresholds.max_metric_drop + 1e-12:
        reason = f"{metric} dropped {original - achieved:.4f} > {thresholds.max_metric_drop}"
    elif cos_min is not None and cos_min < thresholds.min_cosine:
        reason = f"cosine min {cos_min:.4f} < {thresholds.min_cosine}"
    elif cos_mean is not None and cos_mean < thresholds.min_cosine_mean:
        reason = f"cosine mean {cos_mean:.4f} < {thresholds.min_cosine_mean}"
    return Fidelity(
        metric=metric,
        original=original,
        variant=achieved,
        max_abs_diff=max(diffs, default=0.0),
        cosine_mean=cos_mean,
        cosine_min=cos_min,
        rows=len(next(iter(reference.values()))),
        origin=origin,
        blocked=bool(reason),
        reason=reason,
    )


def unverified(origin: str, reason: str) -> Fidelity:
    """The fidelity of a variant that could not be run: blocked, with ``reason``."""
    nan = float("nan")
    return Fidelity("unverified", nan, nan, nan, None, None, 0, origin, True, reason)


# ---------------------------------------------------------------------- latency
def session(path: Path, threads: int, provider: str = "CPUExecutionProvider") -> Any:
    """An ONNX Runtime session with ``threads`` intra-op threads, one inter-op thread; for an
    OpenVINO graph (``model.xml``), an OpenVINO request that answers the same two calls."""
    if path.suffix == ".xml":
        from shamal.optimize._openvino import OpenVinoSession

        return OpenVinoSession(path, threads)
    ort = module("onnxruntime")

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=[provider])


def run_batches(sess: Any, feeds: Mapping[str, np.ndarray], batch: int = 256) -> Outputs:
    """All outputs of ``sess`` over ``feeds``, ``batch`` rows at a time."""
    names = [o.name for o in sess.get_outputs()]
    rows = len(next(iter(feeds.values())))
    parts: list[list[np.ndarray]] = [[] for _ in names]
    for start in range(0, rows, batch):
        chunk = {k: v[start : start + batch] for k, v in feeds.items()}
        for i, out in enumerate(sess.run(names, chunk)):
            parts[i].append(np.asarray(out))
    return {n: np.concatenate(p) for n, p in zip(names, parts, strict=True)}


def tile_rows(feeds: Mapping[str, np.ndarray], batch: int) -> dict[str, np.ndarray]:
    """``batch`` rows taken from ``feeds`` (repeated when there are fewer)."""
    rows = len(next(iter(feeds.values())))
    index = np.arange(batch) % rows
    return {k: np.ascontiguousarray(v[index]) for k, v in feeds.items()}


def median_ms(call: Callable[[], object], repeats: int, budget_s: float) -> float:
    """Median wall time of ``call`` in ms: one warm-up, then up to ``repeats`` runs (at least
    3) or until ``budget_s`` is spent."""
    call()
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times) < repeats and (len(times) < 3 or time.perf_counter() < deadline):
        times.append(_seconds(call))
    return statistics.median(times) * 1000.0


def _runner(sess: Any, feed: dict[str, np.ndarray]) -> Callable[[], object]:
    def run() -> object:
        return sess.run(None, feed)

    return run


def measure_latency(
    path: Path,
    feeds: Mapping[str, np.ndarray],
    batches: Sequence[int],
    threads: Sequence[int],
    *,
    repeats: int = 20,
    budget_s: float = 2.0,
    on_step: Callable[[], None] | None = None,
) -> list[Timing]:
    """p50 latency and items/s of the model at ``path`` for each (batch, threads)."""
    out: list[Timing] = []
    for count in threads:
        sess = session(path, count)
        for batch in batches:
            feed = tile_rows(feeds, batch)
            ms = median_ms(_runner(sess, feed), repeats, budget_s)
            out.append(Timing(batch, count, ms, batch / (ms / 1000.0)))
            if on_step is not None:
                on_step()
    return out


def measure_head_to_head(
    paths: Sequence[Path],
    feeds: Mapping[str, np.ndarray],
    batches: Sequence[int],
    threads: int,
    *,
    rounds: int = 5,
    round_s: float = 0.3,
) -> list[list[Timing]]:
    """p50 latency of several models (one list of timings per path, in order), timed in
    alternating rounds: each round runs every model in turn for about ``round_s``, so what
    drifts on the machine while they are timed (other work, clock speed, heat) falls on all of
    them alike. For choosing between contenders whose separate timings are too close to call.
    """
    sessions = [session(path, threads) for path in paths]
    found: list[list[Timing]] = [[] for _ in paths]
    for batch in batches:
        feed = tile_rows(feeds, batch)
        runners = [_runner(sess, feed) for sess in sessions]
        # One warm-up each, whose time sets how many runs fill a round.
        runs = [max(2, min(200, int(round_s / max(_seconds(run), 1e-6)))) for run in runners]
        times: list[list[float]] = [[] for _ in runners]
        for _ in range(rounds):
            for run, count, into in zip(runners, runs, times, strict=True):
                into.extend(_seconds(run) for _ in range(count))
        for timings, spent in zip(found, times, strict=True):
            ms = statistics.median(spent) * 1000.0
            timings.append(Timing(batch, threads, ms, batch / (ms / 1000.0)))
    return found


def _seconds(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start
