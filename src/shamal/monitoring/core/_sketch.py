"""Column sketches: a bounded, JSON-able summary of one column, reference or current.

A monitor compares sketches, never raw tables: the reference is summarised once (from the
training dataset version and the model's predictions on it) and each window of live traffic
is summarised the same way, so neither side is ever reloaded whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

__all__ = ["EXACT_LIMIT", "OTHER", "ColumnSketch", "Kind"]

Kind = Literal["numeric", "categorical"]

#: A column with at most this many rows keeps its exact values (small-sample tests need them).
EXACT_LIMIT: Final = 1000
#: The key under which categories beyond the kept ones are counted.
OTHER: Final = "\x00other"


@dataclass(frozen=True, slots=True)
class ColumnSketch:
    """Bounded summary of one column.

    Attributes:
        name: the column.
        kind: numeric or categorical.
        count: rows seen, nulls included.
        nulls: null values (and NaN floats).
        nonfinite: +-inf values of a numeric column (left out of the statistics).
        min, max, mean, std: of the finite values (numeric only).
        quantiles: numeric: the values at the sketch's fine grid of ranks.
        counts: categorical: value -> count (capped; the rest under :data:`OTHER`);
            numeric with few distinct values: ``str(value)`` -> count.
        values: the exact non-null values when ``count <= EXACT_LIMIT``.
    """

    name: str
    kind: Kind
    count: int
    nulls: int = 0
    nonfinite: int = 0
    min: float | None = None
    max: float | None = None
    mean: float | None = None
    std: float | None = None
    quantiles: tuple[float, ...] | None = None
    counts: Mapping[str, int] | None = None
    values: tuple[float | str, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON object (the builder's helper completes the format)."""
        raise NotImplementedError  # the CORE helper implements the format
