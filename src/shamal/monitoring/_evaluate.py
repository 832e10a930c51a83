"""One window of live traffic against the reference: sketch, compare, list quality issues.

Pure over values (no database, no clock): the service hands it the reference profile and
the columns read from the sample log, and stores what it returns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from shamal.errors import InvalidParameter
from shamal.monitoring._columns import LabelledPairs, SampleColumns, coerce
from shamal.monitoring._entities import ColumnRole, Monitor, ReferenceProfile, SeriesPoint
from shamal.monitoring.core import (
    Band,
    ColumnSketch,
    DriftReport,
    SketchBuilder,
    Task,
    chunk_statistic,
    compare,
    performance,
    quality,
)

__all__ = ["Evaluation", "evaluate", "monitored_columns", "score"]


@dataclass(frozen=True, slots=True)
class Evaluation:
    """What a run found: the report (the core's DriftReport JSON with ``quality``,
    ``missing`` and counts), each column's point and the verdict."""

    report: dict[str, Any]
    points: tuple[SeriesPoint, ...]
    drifted: bool
    share: float
    drifted_columns: tuple[str, ...]


def monitored_columns(monitor: Monitor, reference: ReferenceProfile) -> list[str]:
    """The columns a monitor compares: its own list, or every feature and prediction
    column of the reference."""
    if monitor.columns:
        return list(monitor.columns)
    return sorted(n for n, c in reference.columns.items() if c.role is not ColumnRole.LABEL)


def _issue(column: str, kind: str, value: float, limit: float, detail: str) -> dict[str, Any]:
    return {"column": column, "kind": kind, "value": value, "limit": limit, "detail": detail}


def _current(
    reference: ReferenceProfile, gathered: SampleColumns, present: list[str]
) -> tuple[dict[str, ColumnSketch], list[dict[str, Any]]]:
    """Each present column sketched as the reference's kind, and its type changes."""
    sketches: dict[str, ColumnSketch] = {}
    issues = []
    for column in present:
        kind = reference.columns[column].sketch.kind
        values = gathered.values[column]
        array, changed = coerce(values, kind)
        if changed:
            issues.append(
                _issue(
                    column,
                    "invalid_value",
                    changed / max(len(values), 1),
                    0.0,
                    f"{changed} of {len(values)} values are not {kind} (counted as nulls)",
                )
            )
        builder = SketchBuilder({column: kind})
        builder.update({column: array})
        sketches[column] = builder.result()[column]
    return sketches, issues


def _points(report: DriftReport, at: datetime, result_id: str) -> tuple[SeriesPoint, ...]:
    return tuple(
        SeriesPoint(
            column=d.column,
            at=at,
            result_id=result_id,
            test=d.test,
            statistic=d.statistic,
            p_value=d.p_value,
            threshold=d.threshold,
            drifted=d.drifted,
        )
        for d in report.columns
    )


def _bands(reference: ReferenceProfile, current: Mapping[str, ColumnSketch]) -> dict[str, Any]:
    """Each current column's drift distance against the band of the reference's chunks
    (NannyML's alert rule: above the band's upper end); columns without a band are left out."""
    bands = (reference.chunks or {}).get("columns", {})
    found: dict[str, Any] = {}
    for column, sketch in current.items():
        raw = bands.get(column)
        if raw is None:
            continue
        band = Band.from_json(raw["band"])
        distance = chunk_statistic(reference.columns[column].sketch, sketch)
        outside = bool(math.isfinite(distance) and distance > band.upper)
        found[column] = {
            "distance": distance if math.isfinite(distance) else None,
            "upper": band.to_json()["upper"],
            "outside": outside,
        }
    return found


def _compare(
    monitor: Monitor, reference: ReferenceProfile, current: dict[str, ColumnSketch]
) -> DriftReport:
    """The core's drift report over the current columns, with the monitor's tests,
    threshold, correction and drift share."""
    tests = {c: t for c, t in monitor.tests.items() if c in current}
    thresholds = dict.fromkeys(current, monitor.threshold) if monitor.threshold else None
    return compare(
        {c: reference.columns[c].sketch for c in current},
        current,
        tests=tests,
        thresholds=thresholds,
        correction=monitor.correction,
        drift_share=monitor.drift_share,
    )


def evaluate(
    monitor: Monitor,
    reference: ReferenceProfile,
    gathered: SampleColumns,
    *,
    at: datetime,
    result_id: str,
) -> Evaluation:
    """Compare ``gathered`` with ``reference`` as ``monitor`` says.

    Raises:
        InvalidParameter: the samples carry none of the monitored columns.
    """
    wanted = monitored_columns(monitor, reference)
    present = [c for c in wanted if c in gathered.values and c in reference.columns]
    missing = [c for c in wanted if c not in present]
    if not present:
        carried = ", ".join(sorted(gathered.values)[:20]) or "nothing readable"
        raise InvalidParameter(
            f"the samples carry none of the monitored columns (they carry: {carried})"
        )
    current, issues = _current(reference, gathered, present)
    # The core's checks: null rates, out-of-range values, new categories, missing columns.
    known = {c: reference.columns[c].sketch for c in wanted if c in reference.columns}
    issues += [i.to_json() for i in quality(known, current)]
    report = _compare(monitor, reference, current)
    bands = _bands(reference, current)
    points = _points(report, at, result_id)
    body = report.to_json()
    body.update(
        quality=issues,
        bands=bands,
        missing=missing,
        rows=gathered.rows,
        samples=gathered.samples,
        malformed_tensors=gathered.malformed,
    )
    return Evaluation(
        report=body,
        points=points,
        drifted=report.drifted,
        share=report.share,
        drifted_columns=tuple(d.column for d in report.columns if d.drifted),
    )


def _task(pairs: LabelledPairs) -> Task:
    """Regression when labels and answers are all numbers and some is not a whole number;
    classification otherwise (classes as ints, booleans or text)."""
    values = pairs.truth + pairs.predicted
    numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if len(numbers) < len(values) - values.count(None):
        return "classification"
    whole = all(float(v).is_integer() for v in numbers if math.isfinite(v))
    return "classification" if whole else "regression"


def score(
    pairs: LabelledPairs, *, at: datetime, result_id: str
) -> tuple[dict[str, Any], list[SeriesPoint]]:
    """The model's performance on the labels that came since the last run (the core's
    metrics), as the report's ``performance`` part and a point per metric (column
    ``performance:<metric>``). Labels and answers of different kinds (text labels for a
    model answering numbers) are compared as text."""
    body: dict[str, Any] = {
        "samples": pairs.samples,
        "skipped": pairs.skipped,
        "output": pairs.output,
    }
    if not pairs.truth:
        return {**body, "rows": 0, "metrics": {}}, []
    task = _task(pairs)
    truth, predicted = _comparable(task, pairs)
    try:
        found = performance(task, _array(truth), _array(predicted))
    except InvalidParameter as exc:
        return {**body, "task": task, "rows": 0, "metrics": {}, "error": exc.message}, []
    # JSON holds no NaN (R2 of one row): an undefined metric is stored as null.
    metrics = {
        k: (float(v) if math.isfinite(v) else None)
        for k, v in found.items()
        if k not in ("rows", "skipped")
    }
    points = [
        SeriesPoint(
            column=f"performance:{metric}",
            at=at,
            result_id=result_id,
            test="performance",
            statistic=value,
            p_value=None,
            threshold=0.0,  # a metric has no threshold of its own (yet): never flagged
            drifted=False,
        )
        for metric, value in sorted(metrics.items())
    ]
    rows = int(found["rows"])
    return {**body, "task": task, "rows": rows, "metrics": metrics}, points


def _comparable(task: Task, pairs: LabelledPairs) -> tuple[list[Any], list[Any]]:
    """Labels and answers as the metrics compare them: classes of different kinds (text
    labels for a model answering numbers) as text."""
    truth, predicted = pairs.truth, pairs.predicted
    texts = [isinstance(v, str) for v in truth + predicted if v is not None]
    if task == "classification" and any(texts) and not all(texts):
        truth = [None if v is None else str(v) for v in truth]
        predicted = [None if v is None else str(v) for v in predicted]
    return truth, predicted


def _array(values: list[Any]) -> np.ndarray:
    if all(v is None or isinstance(v, str) for v in values):
        return np.array(values, dtype=object)
    return np.array([math.nan if v is None else v for v in values])
