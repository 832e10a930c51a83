"""Normalized pointwise mutual information of two trace filters: how much more (or less)
often traces match both than if the two were independent, from -1 (never together) through
0 (independent) to 1 (always together). Pure arithmetic on four counts.

Undefined (NaN) when a filter matches nothing or the counts are inconsistent. The plain
value is -1 when both filters match traces but never the same one; the smoothed value adds
half a trace to each cell of the 2x2 table (Jeffreys' prior), which keeps it finite and
steadier on small counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Correlation", "correlation"]

_JEFFREYS = 0.5


@dataclass(frozen=True, slots=True)
class Correlation:
    npmi: float
    npmi_smoothed: float
    filter1_count: int
    filter2_count: int
    joint_count: int
    total_count: int


def _npmi(both: float, only1: float, only2: float, neither: float) -> float:
    total = both + only1 + only2 + neither
    first, second = both + only1, both + only2
    if first <= 0 or second <= 0 or both <= 0:
        return math.nan
    if only1 == 0 and only2 == 0 and neither == 0:
        return 1.0  # always together: -log p(both) is 0, the limit is 1
    pmi = math.log(both) + math.log(total) - math.log(first) - math.log(second)
    value = pmi / (math.log(total) - math.log(both))
    return max(-1.0, min(1.0, value))


def correlation(total: int, first: int, second: int, both: int) -> Correlation:
    """The NPMI of two filters over ``total`` traces, ``first`` and ``second`` of which match
    each, ``both`` of which match the two."""
    cells = (both, first - both, second - both, total - first - second + both)
    if total <= 0 or first == 0 or second == 0 or min(cells) < 0:
        plain = smoothed = math.nan
    else:
        plain = -1.0 if both == 0 else _npmi(*cells)
        smoothed = _npmi(*(c + _JEFFREYS for c in cells))
    return Correlation(plain, smoothed, first, second, both, total)
