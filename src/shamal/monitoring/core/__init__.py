"""The pure core of monitoring: sketches, drift and quality tests, bands, performance.

Pure functions and values over numpy arrays and Arrow batches: no database, no web
framework, no clock. The live monitor, the CLI, the benchmark and the tests share them.
"""

from __future__ import annotations

from shamal.monitoring.core._sketch import EXACT_LIMIT, OTHER, ColumnSketch, Kind

__all__ = ["EXACT_LIMIT", "OTHER", "ColumnSketch", "Kind"]
