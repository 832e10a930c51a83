"""Extremum-preserving downsampling of a metric's curve, done on the server so a browser
draws a few thousand points of a metric of a million.

The points between the first and the last are cut into buckets of equal count; each bucket
keeps its lowest and its highest point, in step order. A spike, a dip or a divergence is
never averaged away, which is what a person looks for in a training curve.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

#: Fewest points a caller may ask for: the first, the last and one bucket's min and max.
MIN_POINTS = 4

Steps = npt.NDArray[np.int64]
Values = npt.NDArray[np.float64]


def bucket_edges(count: int, points: int) -> list[tuple[int, int]]:
    """The ``[start, end)`` index ranges of the buckets :func:`downsample` uses for ``count``
    points cut to at most ``points``: equal counts (the last one may be shorter) covering
    every index but the first and the last. Empty when nothing is cut."""
    if count <= points:
        return []
    inner = count - 2
    buckets = (points - 2) // 2
    size = -(-inner // buckets)  # ceil: at most ``buckets`` buckets
    return [(start, min(start + size, count - 1)) for start in range(1, count - 1, size)]


def downsample(steps: Steps, values: Values, points: int) -> tuple[Steps, Values]:
    """At most ``points`` of the curve ``(steps, values)``: all of them when they fit, else
    the first, the last, and each bucket's minimum and maximum (see :func:`bucket_edges`).

    ``values`` must be finite (drop NaN and infinities first); ``steps`` in curve order.

    Raises:
        ValueError: ``points`` below :data:`MIN_POINTS`, or arrays of different lengths.
    """
    if points < MIN_POINTS:
        raise ValueError(f"points must be at least {MIN_POINTS}")
    if len(steps) != len(values):
        raise ValueError("steps and values differ in length")
    count = len(values)
    edges = bucket_edges(count, points)
    if not edges:
        return steps, values
    size = edges[0][1] - edges[0][0]
    inner = values[1 : count - 1]
    padding = len(edges) * size - len(inner)
    # A padded matrix of one row per bucket: argmin and argmax run vectorized over all of them.
    low = np.concatenate([inner, np.full(padding, np.inf)]).reshape(len(edges), size)
    high = np.concatenate([inner, np.full(padding, -np.inf)]).reshape(len(edges), size)
    base = np.arange(len(edges)) * size + 1
    lows = base + np.argmin(low, axis=1)
    highs = base + np.argmax(high, axis=1)
    kept = np.unique(np.concatenate([[0, count - 1], lows, highs]))  # sorted: curve order
    return steps[kept], values[kept]
