"""Metric curves: sparklines for the terminal and line charts for files.

``shamal runs show`` draws each metric's history as a sparkline next to its latest value;
``shamal runs plot`` draws the histories of one or more runs into a PNG, SVG or PDF.
Points are the native API's (``step``, ``timestamp``, ``value``; ``value`` is None for NaN
and the infinities, which are left out of curves, minima and maxima).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shamal.cli._plotfile import pyplot, save_figure

__all__ = ["BLOCKS", "Curve", "Summary", "plot_curves", "sparkline", "summarize"]

BLOCKS = "▁▂▃▄▅▆▇█"
"""The eight heights of a sparkline, lowest first."""

Point = Mapping[str, Any]


def _finite(points: Sequence[Point]) -> list[float | None]:
    values: list[float | None] = []
    for point in points:
        value = point.get("value")
        values.append(
            float(value) if isinstance(value, int | float) and math.isfinite(value) else None
        )
    return values


def _mean(values: list[float]) -> float:
    # Divided first, so that values near the float limit do not overflow to infinity.
    return math.fsum(v / len(values) for v in values)


def sparkline(values: Sequence[float | None], width: int = 24) -> str:
    """``values`` (in step order) as at most ``width`` block characters, each the mean of
    an equal share of the points, scaled from the lowest mean (``▁``) to the highest
    (``█``). A share with no finite value is a space; a flat curve is all ``▄``.
    """
    if width < 1:
        raise ValueError("a sparkline is at least one character wide")
    count = len(values)
    buckets = min(width, count)
    means: list[float | None] = []
    for bucket in range(buckets):
        chunk = values[bucket * count // buckets : (bucket + 1) * count // buckets]
        present = [v for v in chunk if v is not None and math.isfinite(v)]
        means.append(_mean(present) if present else None)
    known = [m for m in means if m is not None]
    if not known:
        return " " * buckets
    low, high = min(known), max(known)
    half_span = high / 2 - low / 2  # halves: the span of two huge values stays finite
    line = []
    for mean in means:
        if mean is None:
            line.append(" ")
        elif half_span == 0:
            line.append(BLOCKS[3])
        else:
            line.append(BLOCKS[round((mean / 2 - low / 2) / half_span * (len(BLOCKS) - 1))])
    return "".join(line)


@dataclass(frozen=True)
class Summary:
    """What a metric's history comes to: its points, finite extremes and sparkline."""

    points: int
    low: float | None
    high: float | None
    curve: str


def summarize(points: Sequence[Point], width: int = 24) -> Summary:
    values = _finite(points)
    known = [v for v in values if v is not None]
    return Summary(
        points=len(points),
        low=min(known) if known else None,
        high=max(known) if known else None,
        curve=sparkline(values, width) if points else "",
    )


@dataclass(frozen=True)
class Curve:
    """One line of a chart: a run's history of one metric."""

    metric: str
    label: str
    points: Sequence[Point]


def _drawable(text: str) -> str:
    """Text users chose, as it can be drawn: control and format characters (NUL, a
    right-to-left override) become ``?``, which every font has."""
    return "".join(c if c.isprintable() else "?" for c in text)


def _label(text: str) -> str:
    """A legend label as written: matplotlib leaves labels starting with ``_`` out."""
    text = _drawable(text)
    return " " + text if text.startswith("_") else text


def _xs(points: Sequence[Point], x: str) -> list[float]:
    """Where each point lies along the x axis: its step, or minutes since the first point."""
    if x == "step":
        return [float(p["step"]) for p in points]
    first = points[0]["timestamp"] if points else 0
    return [(p["timestamp"] - first) / 60_000 for p in points]


def _draw_panel(axis: Any, metric: str, curves: Sequence[Curve], x: str) -> None:
    """One metric's panel: a line per curve (its finite points), labelled as written."""
    for curve in curves:
        kept = [
            (a, v)
            for a, v in zip(_xs(curve.points, x), _finite(curve.points), strict=True)
            if v is not None
        ]
        axis.plot(
            [a for a, _ in kept], [v for _, v in kept], linewidth=1.2, label=_label(curve.label)
        )
    # Names users chose are drawn as written, never read as TeX ($...$): a malformed
    # one would make the whole drawing fail.
    axis.set_ylabel(_drawable(metric), parse_math=False)
    axis.grid(alpha=0.3)
    for text in axis.legend(fontsize="small", loc="best").get_texts():
        text.set_parse_math(False)


def plot_curves(curves: Sequence[Curve], path: Path, *, x: str = "step", title: str = "") -> Path:
    """One panel per metric (in the order first seen), one line per run, written to
    ``path`` (already checked by :func:`shamal.cli._plotfile.plot_path`).

    Args:
        x: ``step``, or ``time`` for minutes since the line's first point.
    """
    if x not in ("step", "time"):
        raise ValueError(f"x is step or time, not {x!r}")
    metrics = list(dict.fromkeys(curve.metric for curve in curves))
    plt = pyplot()
    fig, axes = plt.subplots(
        len(metrics), 1, sharex=True, squeeze=False, figsize=(10, 2.6 * len(metrics) + 0.8)
    )
    for metric, axis in zip(metrics, axes[:, 0], strict=True):
        _draw_panel(axis, metric, [curve for curve in curves if curve.metric == metric], x)
    axes[-1, 0].set_xlabel("step" if x == "step" else "minutes since the first point")
    if title:
        fig.suptitle(_drawable(title), parse_math=False)
    fig.tight_layout()
    return save_figure(fig, path)
