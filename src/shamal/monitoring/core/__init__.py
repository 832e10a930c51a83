"""The pure core of monitoring: sketches, drift and quality tests, bands, performance.

Pure functions and values over numpy arrays and Arrow batches: no database, no web
framework, no clock. The live monitor, the CLI, the benchmark and the tests share them.
"""

from __future__ import annotations

from shamal.monitoring.core._compare import (
    CORRECTIONS,
    ColumnDrift,
    DriftReport,
    column_drift,
    compare,
    corrected,
)
from shamal.monitoring.core._sketch import (
    CATEGORY_LIMIT,
    DISTINCT_LIMIT,
    EXACT_LIMIT,
    OTHER,
    QUANTILE_RANKS,
    TAIL_VALUES,
    ColumnSketch,
    Kind,
    SketchBuilder,
)
from shamal.monitoring.core._tests import (
    DEFAULT_THRESHOLDS,
    P_VALUE_TESTS,
    TESTS,
    choose_test,
    distinct_values,
    drifted,
    psi,
    run_test,
)

__all__ = [
    "CATEGORY_LIMIT",
    "CORRECTIONS",
    "DEFAULT_THRESHOLDS",
    "DISTINCT_LIMIT",
    "EXACT_LIMIT",
    "OTHER",
    "P_VALUE_TESTS",
    "QUANTILE_RANKS",
    "TAIL_VALUES",
    "TESTS",
    "ColumnDrift",
    "ColumnSketch",
    "DriftReport",
    "Kind",
    "SketchBuilder",
    "choose_test",
    "column_drift",
    "compare",
    "corrected",
    "distinct_values",
    "drifted",
    "psi",
    "run_test",
]
