"""Model performance once delayed labels arrive, per window and per chunk, and the naming of
prediction columns for prediction drift.

Labels arrive late (a loan defaults months after the decision), are joined to the logged
predictions by request id, and then give the real metric. This module computes the metrics
from the joined pairs; rows whose label or prediction is missing (None, NaN) are skipped and
counted, so one bad row never sinks a monitor run.

Prediction drift needs nothing of its own: the live monitor logs each model output as a
column named by :func:`prediction_column` next to the input features, sketches it like a
feature, and the ordinary drift tests and bands run on it. :func:`prediction_columns` picks
those columns back out of a sketch mapping, so a report can show them apart.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from shamal.errors import InvalidParameter
from shamal.monitoring.core._chunks import Band, TimeChunk, chunk_bands

__all__ = [
    "CLASSIFICATION_METRICS",
    "METRIC_RANGES",
    "PREDICTION_PREFIX",
    "REGRESSION_METRICS",
    "Task",
    "performance",
    "performance_bands",
    "performance_chunks",
    "prediction_column",
    "prediction_columns",
]

logger = logging.getLogger(__name__)

Task = Literal["classification", "regression"]

CLASSIFICATION_METRICS: Final = ("accuracy", "f1", "precision", "recall")
REGRESSION_METRICS: Final = ("mae", "rmse", "r2")

#: Each metric's valid range: bands are clipped to it.
METRIC_RANGES: Final[Mapping[str, tuple[float, float]]] = {
    "accuracy": (0.0, 1.0),
    "f1": (0.0, 1.0),
    "precision": (0.0, 1.0),
    "recall": (0.0, 1.0),
    "mae": (0.0, math.inf),
    "rmse": (0.0, math.inf),
    "r2": (-math.inf, 1.0),
}

#: Prefix of the column a model output is logged under (a feature name never holds ':').
PREDICTION_PREFIX: Final = "prediction:"


def performance(task: Task, y_true: ArrayLike, y_pred: ArrayLike) -> dict[str, float]:
    """The model's metrics on joined label/prediction pairs.

    * classification: ``accuracy``, and the macro averages (unweighted mean over every label
      seen in either array) of per-label ``precision``, ``recall`` and ``f1``; a label never
      predicted has precision 0, a label never true has recall 0 (sklearn's
      ``zero_division=0``). Labels are ints, bools or strings, not a mix of strings and
      numbers.
    * regression: ``mae``, ``rmse`` and ``r2`` (1 - residual / total sum of squares; with a
      constant truth 1.0 for a perfect fit, else 0.0, as sklearn; NaN with one row).

    Pairs with a missing label or prediction (None or NaN; for regression also +-inf) are
    skipped. The result also holds ``rows`` (pairs used) and ``skipped``.

    Raises:
        InvalidParameter: unknown task, arrays not one-dimensional, of different lengths,
            empty, without a single complete pair, labels mixing strings and numbers, or
            non-numeric regression values.
    """
    truth, pred = _pairs(task, y_true, y_pred)
    if truth.size == 0:
        raise InvalidParameter("performance needs at least one row")
    metrics = _metrics(task, truth, pred)
    if metrics["rows"] == 0:
        raise InvalidParameter(
            "performance needs at least one row with both a label and a prediction"
        )
    return metrics


def performance_chunks(
    task: Task,
    y_true: ArrayLike,
    y_pred: ArrayLike,
    chunks: Sequence[tuple[int, int] | TimeChunk],
) -> dict[str, NDArray[np.float64]]:
    """Each metric of :func:`performance` per chunk (row ranges or time chunks), as arrays
    aligned with ``chunks``. A chunk without a complete pair gets NaN metrics and ``rows`` 0.

    Raises:
        InvalidParameter: as :func:`performance` for the whole arrays, or a chunk outside them.
    """
    truth, pred = _pairs(task, y_true, y_pred)
    names = (*_names(task), "rows", "skipped")
    out = {name: np.full(len(chunks), np.nan) for name in names}
    for i, chunk in enumerate(chunks):
        rows = _chunk_rows(chunk, truth.size)
        metrics = _metrics(task, truth[rows], pred[rows])
        for name in names:
            out[name][i] = metrics[name]
    return out


def performance_bands(
    reference_chunks: Mapping[str, ArrayLike], *, sigmas: float = 3.0
) -> dict[str, Band]:
    """A band per metric from its values on the reference's chunks (as from
    :func:`performance_chunks`), each clipped to the metric's valid range. ``rows`` and
    ``skipped`` get no band; unknown metric names get an unclipped band.

    Raises:
        InvalidParameter: as :func:`~shamal.monitoring.core.chunk_bands`.
    """
    return {
        name: chunk_bands(
            values, sigmas=sigmas, valid=METRIC_RANGES.get(name, (-math.inf, math.inf))
        )
        for name, values in reference_chunks.items()
        if name not in ("rows", "skipped")
    }


def prediction_column(output: str) -> str:
    """The column name a model output is logged and sketched under.

    Raises:
        InvalidParameter: an empty or non-string output name.
    """
    if not isinstance(output, str) or not output:
        raise InvalidParameter("a model output name must be a non-empty string")
    return PREDICTION_PREFIX + output


def prediction_columns(columns: Iterable[str]) -> tuple[str, ...]:
    """The prediction columns among ``columns``, in their order."""
    return tuple(c for c in columns if isinstance(c, str) and c.startswith(PREDICTION_PREFIX))


def _names(task: Task) -> tuple[str, ...]:
    return CLASSIFICATION_METRICS if task == "classification" else REGRESSION_METRICS


def _pairs(task: Task, y_true: ArrayLike, y_pred: ArrayLike) -> tuple[NDArray[Any], NDArray[Any]]:
    """Both arrays checked: known task, one-dimensional, equal lengths."""
    if task not in ("classification", "regression"):
        raise InvalidParameter("task must be classification or regression")
    truth, pred = _one_dim(y_true, "y_true"), _one_dim(y_pred, "y_pred")
    if truth.size != pred.size:
        raise InvalidParameter(f"y_true has {truth.size} rows and y_pred {pred.size}")
    if task == "regression":
        return _numeric(truth, "y_true"), _numeric(pred, "y_pred")
    return truth, pred


def _chunk_rows(chunk: tuple[int, int] | TimeChunk, n: int) -> slice | NDArray[np.intp]:
    if isinstance(chunk, TimeChunk):
        if chunk.rows.size and (chunk.rows.min() < 0 or chunk.rows.max() >= n):
            raise InvalidParameter("a chunk's rows lie outside the labels")
        return chunk.rows
    start, stop = chunk
    if not 0 <= start <= stop <= n:
        raise InvalidParameter("a chunk's range lies outside the labels")
    return slice(start, stop)


def _metrics(task: Task, truth: NDArray[Any], pred: NDArray[Any]) -> dict[str, float]:
    keep = ~(_missing(truth, task) | _missing(pred, task))
    truth, pred = truth[keep], pred[keep]
    counts = {"rows": float(truth.size), "skipped": float(keep.size - truth.size)}
    if truth.size == 0:
        return {**dict.fromkeys(_names(task), math.nan), **counts}
    if task == "classification":
        return {**_classification(truth, pred), **counts}
    return {**_regression(truth, pred), **counts}


def _classification(truth: NDArray[Any], pred: NDArray[Any]) -> dict[str, float]:
    both = np.concatenate([truth, pred])
    if both.dtype == object:
        strings = np.fromiter((isinstance(v, str) for v in both), dtype=bool, count=both.size)
        if strings.any() and not strings.all():
            raise InvalidParameter("labels mix strings and numbers")
    try:
        labels, inverse = np.unique(both, return_inverse=True)
    except TypeError:
        raise InvalidParameter("labels must be ints, bools or strings") from None
    k = labels.size
    true_idx, pred_idx = inverse[: truth.size], inverse[truth.size :]
    hits = true_idx == pred_idx
    tp = np.bincount(true_idx[hits], minlength=k).astype(np.float64)
    support = np.bincount(true_idx, minlength=k).astype(np.float64)
    predicted = np.bincount(pred_idx, minlength=k).astype(np.float64)
    precision = np.divide(tp, predicted, out=np.zeros(k), where=predicted > 0)
    recall = np.divide(tp, support, out=np.zeros(k), where=support > 0)
    f1 = np.divide(2.0 * tp, support + predicted, out=np.zeros(k), where=(support + predicted) > 0)
    return {
        "accuracy": float(np.count_nonzero(hits) / truth.size),
        "f1": float(f1.mean()),
        "precision": float(precision.mean()),
        "recall": float(recall.mean()),
    }


def _regression(truth: NDArray[np.float64], pred: NDArray[np.float64]) -> dict[str, float]:
    # Errors of huge values (1e200) overflow when squared: square them scaled to at most 1
    # and scale back, so rmse and r2 stay finite whenever the values themselves are.
    with np.errstate(over="ignore"):
        error = truth - pred
        centred = truth - truth.mean() if truth.size >= 2 else np.zeros(0)
    scale = float(max(np.max(np.abs(error)), np.max(np.abs(centred), initial=0.0)))
    if not math.isfinite(scale) or scale == 0.0:
        scale = 1.0
    scaled_error, scaled_centred = error / scale, centred / scale
    ss_res = float(np.sum(scaled_error * scaled_error))
    if truth.size < 2:
        r2 = math.nan
    else:
        ss_tot = float(np.sum(scaled_centred * scaled_centred))
        r2 = (1.0 if ss_res == 0.0 else 0.0) if ss_tot == 0.0 else 1.0 - ss_res / ss_tot
    return {
        "mae": float(np.mean(np.abs(error))),
        "rmse": scale * math.sqrt(ss_res / truth.size),
        "r2": r2,
    }


def _missing(array: NDArray[Any], task: Task) -> NDArray[np.bool_]:
    if task == "regression":
        return np.asarray(~np.isfinite(array), dtype=np.bool_)
    if array.dtype.kind == "f":
        return np.asarray(np.isnan(array), dtype=np.bool_)
    if array.dtype == object:
        return np.fromiter(
            (v is None or (isinstance(v, float) and math.isnan(v)) for v in array),
            dtype=bool,
            count=array.size,
        )
    return np.zeros(array.size, dtype=bool)


def _one_dim(values: ArrayLike, name: str) -> NDArray[Any]:
    array = np.asarray(values)
    if array.ndim != 1:
        raise InvalidParameter(f"{name} must be one-dimensional")
    return array


def _numeric(array: NDArray[Any], name: str) -> NDArray[np.float64]:
    if array.dtype.kind in "biuf":
        return array.astype(np.float64)
    if array.dtype == object and not any(isinstance(v, str | bytes) for v in array):
        try:
            return np.asarray(
                [math.nan if v is None else float(v) for v in array], dtype=np.float64
            )
        except (TypeError, ValueError):
            pass
    raise InvalidParameter(f"{name} must hold numbers for a regression")
