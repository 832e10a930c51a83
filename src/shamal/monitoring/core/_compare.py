"""Column and dataset drift from sketches: the verdicts a monitor stores and acts on.

:func:`column_drift` tests one column (Evidently's default test unless one is named);
:func:`compare` tests every column both sides have and applies Evidently's dataset rule (the
share of drifted columns at least ``drift_share``), optionally after a multiple-testing
correction of the p-values across columns (Bonferroni, Holm, Benjamini-Hochberg; distance
tests have no p-value and are not corrected).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

import numpy as np

from shamal.errors import InvalidParameter
from shamal.monitoring.core._sketch import KINDS, ColumnSketch, Kind
from shamal.monitoring.core._tests import (
    DEFAULT_THRESHOLDS,
    P_VALUE_TESTS,
    TESTS,
    choose_test,
    distinct_values,
    drifted,
    run_test,
)

__all__ = ["CORRECTIONS", "ColumnDrift", "DriftReport", "column_drift", "compare"]

CORRECTIONS: Final = ("none", "bonferroni", "holm", "bh")
#: Caps on hostile JSON: columns in a report, a column name's length.
_MAX_COLUMNS: Final = 100_000
_MAX_NAME: Final = 1000


@dataclass(frozen=True, slots=True)
class ColumnDrift:
    """One column's drift test.

    Attributes:
        column, kind: the column.
        test: ``ks`` | ``chisquare`` | ``z`` | ``wasserstein`` | ``jensenshannon`` | ``psi``.
        statistic: the p-value of a p-value test (before any correction), the distance
            otherwise.
        p_value: the p-value the verdict used (after the report's correction, if any);
            ``None`` for distance tests.
        threshold: alpha for p-value tests, the distance threshold otherwise.
        drifted: the verdict (Evidently's rule, see :func:`shamal.monitoring.core.drifted`).
    """

    column: str
    kind: Kind
    test: str
    statistic: float
    p_value: float | None
    threshold: float
    drifted: bool

    def to_json(self) -> dict[str, Any]:
        """A JSON object; :meth:`from_json` reads it back."""
        return {
            "column": self.column,
            "kind": self.kind,
            "test": self.test,
            "statistic": self.statistic,
            "p_value": self.p_value,
            "threshold": self.threshold,
            "drifted": self.drifted,
        }

    @classmethod
    def from_json(cls, raw: Any) -> ColumnDrift:
        """The column drift ``raw`` describes; hostile JSON raises InvalidParameter."""
        if not isinstance(raw, Mapping) or set(raw) != _DRIFT_FIELDS:
            raise InvalidParameter(f"a column drift is an object of {sorted(_DRIFT_FIELDS)}")
        column, kind, test = raw["column"], raw["kind"], raw["test"]
        if not isinstance(column, str) or len(column) > _MAX_NAME:
            raise InvalidParameter("a column drift's column must be a short string")
        if kind not in KINDS or test not in TESTS:
            raise InvalidParameter("a column drift's kind or test is unknown")
        p_value = raw["p_value"]
        if (p_value is None) != (test not in P_VALUE_TESTS):
            raise InvalidParameter("a column drift has a p-value exactly when its test does")
        if not isinstance(raw["drifted"], bool):
            raise InvalidParameter("a column drift's drifted must be true or false")
        return cls(
            column=column,
            kind=cast(Kind, kind),
            test=test,
            statistic=_finite(raw["statistic"], "statistic"),
            p_value=None if p_value is None else _probability(p_value, "p_value"),
            threshold=_finite(raw["threshold"], "threshold"),
            drifted=raw["drifted"],
        )


_DRIFT_FIELDS: Final = frozenset(
    ("column", "kind", "test", "statistic", "p_value", "threshold", "drifted")
)


@dataclass(frozen=True, slots=True)
class DriftReport:
    """The drift of a set of columns.

    Attributes:
        columns: each tested column's drift, in the reference's column order.
        share: drifted columns / columns tested (0 when none was tested).
        drifted: ``share >= drift_share`` (Evidently's dataset drift rule), false when no
            column was tested.
        correction: ``none`` | ``bonferroni`` | ``holm`` | ``bh``.
    """

    columns: tuple[ColumnDrift, ...]
    share: float
    drifted: bool
    correction: str

    def to_json(self) -> dict[str, Any]:
        """A JSON object; :meth:`from_json` reads it back."""
        return {
            "columns": [c.to_json() for c in self.columns],
            "share": self.share,
            "drifted": self.drifted,
            "correction": self.correction,
        }

    @classmethod
    def from_json(cls, raw: Any) -> DriftReport:
        """The report ``raw`` describes.

        Raises:
            InvalidParameter: unknown or missing fields, wrong types, more than 100,000
                columns, a share outside 0..1, an unknown correction.
        """
        if not isinstance(raw, Mapping) or set(raw) != {
            "columns",
            "share",
            "drifted",
            "correction",
        }:
            raise InvalidParameter(
                "a drift report is an object of columns, share, drifted, correction"
            )
        columns = raw["columns"]
        if not isinstance(columns, list) or len(columns) > _MAX_COLUMNS:
            raise InvalidParameter(
                f"a drift report's columns must be a list of at most {_MAX_COLUMNS}"
            )
        if raw["correction"] not in CORRECTIONS:
            raise InvalidParameter(f"a drift report's correction must be one of {CORRECTIONS}")
        if not isinstance(raw["drifted"], bool):
            raise InvalidParameter("a drift report's drifted must be true or false")
        return cls(
            columns=tuple(ColumnDrift.from_json(c) for c in columns),
            share=_probability(raw["share"], "share"),
            drifted=raw["drifted"],
            correction=raw["correction"],
        )


def _finite(raw: Any, what: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        raise InvalidParameter(f"{what} must be a finite number")
    return float(raw)


def _probability(raw: Any, what: str) -> float:
    value = _finite(raw, what)
    if not 0.0 <= value <= 1.0:
        raise InvalidParameter(f"{what} must be between 0 and 1")
    return value


def _threshold(test: str, threshold: float | None) -> float:
    if threshold is None:
        return DEFAULT_THRESHOLDS[test]
    value = _finite(threshold, "a drift threshold")
    if value <= 0 or (test in P_VALUE_TESTS and value > 1):
        raise InvalidParameter(
            "a drift threshold must be positive (and at most 1 for a p-value test)"
        )
    return value


def column_drift(
    reference: ColumnSketch,
    current: ColumnSketch,
    *,
    test: str | None = None,
    threshold: float | None = None,
) -> ColumnDrift:
    """The drift of one column between two sketches of it.

    Args:
        reference, current: sketches of the same column, same kind.
        test: one of ``TESTS``; ``None`` picks Evidently's default (:func:`choose_test`, from
            the reference's values and the distinct values of both sides).
        threshold: ``None``: the test's default (p-value tests 0.05, distances 0.1).

    Raises:
        InvalidParameter: different kinds, an unknown test or one that does not fit the
            column, a bad threshold, a side with no values to test.
    """
    if reference.kind != current.kind:
        raise InvalidParameter(
            f"column {reference.name!r} is {reference.kind} in the reference, {current.kind} now"
        )
    if test is None:
        test = choose_test(reference.kind, reference.valid, distinct_values(reference, current))
    elif test not in TESTS:
        raise InvalidParameter(f"unknown drift test {test!r}; known: {', '.join(TESTS)}")
    limit = _threshold(test, threshold)
    statistic, p_value = run_test(test, reference, current)
    return ColumnDrift(
        column=reference.name,
        kind=reference.kind,
        test=test,
        statistic=statistic,
        p_value=p_value,
        threshold=limit,
        drifted=drifted(test, statistic, limit),
    )


def corrected(p_values: list[float], correction: str) -> list[float]:
    """The p-values adjusted for testing them together.

    ``bonferroni``: ``min(1, m p)``; ``holm``: the step-down adjustment
    ``max_{j <= i} min(1, (m - j + 1) p_(j))``; ``bh``: Benjamini-Hochberg
    (``scipy.stats.false_discovery_control``); ``none``: as they are.
    """
    if correction not in CORRECTIONS:
        raise InvalidParameter(
            f"unknown correction {correction!r}; known: {', '.join(CORRECTIONS)}"
        )
    if correction == "none" or not p_values:
        return list(p_values)
    ps = np.asarray(p_values, dtype=np.float64)
    m = ps.size
    if correction == "bonferroni":
        return [float(v) for v in np.minimum(1.0, ps * m)]
    if correction == "bh":
        from scipy import stats  # scipy loads on first use (1 s)

        return [float(v) for v in stats.false_discovery_control(ps, method="bh")]
    order = np.argsort(ps, kind="stable")
    stepped = np.maximum.accumulate(np.minimum(1.0, ps[order] * (m - np.arange(m))))
    out = np.empty(m)
    out[order] = stepped
    return [float(v) for v in out]


def compare(
    reference: Mapping[str, ColumnSketch],
    current: Mapping[str, ColumnSketch],
    *,
    tests: Mapping[str, str] | None = None,
    thresholds: Mapping[str, float] | None = None,
    correction: str = "none",
    drift_share: float = 0.5,
) -> DriftReport:
    """The drift of every column both sides have, and the dataset's verdict.

    Args:
        reference, current: column -> sketch.
        tests: column -> test (the others get Evidently's default).
        thresholds: column -> threshold (the others get their test's default).
        correction: ``none`` | ``bonferroni`` | ``holm`` | ``bh``, applied to the p-values of
            the p-value tests together.
        drift_share: the dataset drifts when at least this share of the tested columns does.

    A column missing from one side, or without a value on one side (all null), is not
    tested: the quality checks report it. Columns are reported in the reference's order.

    Raises:
        InvalidParameter: an unknown correction, a drift share outside 0..1, tests or
            thresholds for unknown columns or of the wrong type, a column whose kind changed.
    """
    if correction not in CORRECTIONS:
        raise InvalidParameter(
            f"unknown correction {correction!r}; known: {', '.join(CORRECTIONS)}"
        )
    share_limit = _probability(drift_share, "drift_share")
    tests, thresholds = dict(tests or {}), dict(thresholds or {})
    for name in (*tests, *thresholds):
        if name not in reference:
            raise InvalidParameter(
                f"a test or threshold names column {name!r}, not in the reference"
            )
    results: list[ColumnDrift] = []
    for name, ref in reference.items():
        cur = current.get(name)
        if cur is None or ref.valid <= 0 or cur.valid <= 0:
            continue
        results.append(column_drift(ref, cur, test=tests.get(name), threshold=thresholds.get(name)))
    results = _apply_correction(results, correction)
    flagged = sum(r.drifted for r in results)
    share = flagged / len(results) if results else 0.0
    return DriftReport(
        columns=tuple(results),
        share=share,
        drifted=bool(results) and share >= share_limit,
        correction=correction,
    )


def _apply_correction(results: list[ColumnDrift], correction: str) -> list[ColumnDrift]:
    tested = [i for i, r in enumerate(results) if r.p_value is not None]
    if correction == "none" or not tested:
        return results
    adjusted = corrected([cast(float, results[i].p_value) for i in tested], correction)
    out = list(results)
    for i, p in zip(tested, adjusted, strict=True):
        r = results[i]
        out[i] = ColumnDrift(
            column=r.column,
            kind=r.kind,
            test=r.test,
            statistic=r.statistic,
            p_value=p,
            threshold=r.threshold,
            drifted=drifted(r.test, p, r.threshold),
        )
    return out
