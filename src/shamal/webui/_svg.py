"""Pictures drawn on the server as SVG: line charts over time, a stacked bar (a traffic
split) and a directed graph laid out in layers (a pipeline's DAG, a lineage graph).

Pure: values in, markup out. Every piece of text is escaped, every colour comes from a
class of the style sheet (the Content-Security-Policy forbids inline style), and each
picture carries a title and an ``aria-label`` for screen readers. A page includes one with
``{{ picture }}``; the browser draws it without any script.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from markupsafe import Markup, escape

#: Points of one series kept on a chart: more than two per pixel would not show.
MAX_POINTS = 1200
_PAD_LEFT, _PAD_RIGHT, _PAD_TOP, _PAD_BOTTOM = 64, 12, 10, 28


@dataclass(frozen=True)
class Series:
    """One line of a chart: ``xs`` ascending (seconds since the epoch for time charts)."""

    name: str
    xs: Sequence[float]
    ys: Sequence[float]


@dataclass(frozen=True)
class Rule:
    """A horizontal line across a chart: a threshold, a limit, a band's edge."""

    name: str
    y: float


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else f"{value:.4g}"


def time_label(seconds: float) -> str:
    """``HH:MM`` (UTC) of a time in seconds since the epoch; the date too when the chart
    spans more than a day is left to the caller's ``x_format``."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%H:%M")


def _thin(xs: Sequence[float], ys: Sequence[float]) -> list[tuple[float, float]]:
    points = [(x, y) for x, y in zip(xs, ys, strict=True) if math.isfinite(x) and math.isfinite(y)]
    if len(points) <= MAX_POINTS:
        return points
    step = len(points) / MAX_POINTS
    return [points[int(i * step)] for i in range(MAX_POINTS - 1)] + [points[-1]]


@dataclass
class _Scale:
    x0: float
    x1: float
    y0: float
    y1: float
    width: int
    height: int

    def x(self, value: float) -> float:
        span = self.x1 - self.x0 or 1.0
        return _PAD_LEFT + (value - self.x0) / span * (self.width - _PAD_LEFT - _PAD_RIGHT)

    def y(self, value: float) -> float:
        span = self.y1 - self.y0 or 1.0
        inner = self.height - _PAD_TOP - _PAD_BOTTOM
        return _PAD_TOP + inner - (value - self.y0) / span * inner


def _scale(
    lines: list[list[tuple[float, float]]], rules: Sequence[Rule], width: int, height: int
) -> _Scale:
    xs = [x for line in lines for x, _ in line]
    ys = [y for line in lines for _, y in line] + [r.y for r in rules if math.isfinite(r.y)]
    x0, x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
    y0, y1 = (min(ys), max(ys)) if ys else (0.0, 1.0)
    if y0 == y1:
        y0, y1 = y0 - 1.0, y1 + 1.0
    return _Scale(x0, x1, y0, y1, width, height)


def _tick(kind: str, x: float, y: float, text: str) -> str:
    return f'<text class="{kind}" x="{x}" y="{y}">{escape(text)}</text>'


def _axes(scale: _Scale, x_format: Callable[[float], str]) -> list[str]:
    bottom = scale.height - _PAD_BOTTOM
    right = scale.width - _PAD_RIGHT
    return [
        f'<rect class="frame" x="{_PAD_LEFT}" y="{_PAD_TOP}" width="{right - _PAD_LEFT}" '
        f'height="{bottom - _PAD_TOP}"/>',
        _tick("tick end", _PAD_LEFT - 4, _PAD_TOP + 10, _fmt(scale.y1)),
        _tick("tick end", _PAD_LEFT - 4, bottom, _fmt(scale.y0)),
        _tick("tick", _PAD_LEFT, bottom + 16, x_format(scale.x0)),
        _tick("tick end", right, bottom + 16, x_format(scale.x1)),
    ]


def line_chart(
    series: Sequence[Series],
    title: str,
    *,
    rules: Sequence[Rule] = (),
    x_format: Callable[[float], str] = _fmt,
    width: int = 640,
    height: int = 220,
) -> Markup:
    """A line chart of ``series`` (at most eight take their own colour; more repeat them),
    with ``rules`` drawn dashed, and a legend. Non-finite points are left out; an empty
    chart says so.
    """
    lines = [_thin(s.xs, s.ys) for s in series]
    scale = _scale(lines, rules, width, height)
    parts = [
        f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="{escape(title)}"><title>{escape(title)}</title>'
    ]
    parts += _axes(scale, x_format)
    for index, line in enumerate(lines):
        if not line:
            continue
        points = " ".join(f"{scale.x(x):.1f},{scale.y(y):.1f}" for x, y in line)
        name = escape(series[index].name)
        parts.append(
            f'<polyline class="line series-{index % 8}" points="{points}">'
            f"<title>{name}</title></polyline>"
        )
    for rule in rules:
        if math.isfinite(rule.y):
            y = scale.y(rule.y)
            parts.append(
                f'<line class="rule" x1="{_PAD_LEFT}" x2="{width - _PAD_RIGHT}" y1="{y:.1f}" '
                f'y2="{y:.1f}"><title>{escape(rule.name)}: {escape(_fmt(rule.y))}</title></line>'
            )
    if not any(lines):
        parts.append(f'<text class="tick" x="{width // 2}" y="{height // 2}">no data yet</text>')
    parts.append("</svg>")
    legend = "".join(
        f'<li class="series-{i % 8}">{escape(s.name)}</li>' for i, s in enumerate(series)
    )
    legend_list = f'<ul class="legend">{legend}</ul>' if len(series) > 1 else ""
    # Every piece of user text above went through escape(); the rest is our own markup.
    return Markup("".join(parts) + legend_list)  # nosec B704


def split_bar(parts: Sequence[tuple[str, float]], title: str, *, width: int = 640) -> Markup:
    """One horizontal bar cut in proportion to ``parts`` (name, share), each labelled
    with its percentage: a deployment's traffic split."""
    total = sum(max(0.0, share) for _, share in parts) or 1.0
    out = [
        f'<svg class="plot split" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} 40" '
        f'role="img" aria-label="{escape(title)}"><title>{escape(title)}</title>'
    ]
    x = 0.0
    for index, (name, share) in enumerate(parts):
        w = max(0.0, share) / total * width
        percent = f"{max(0.0, share) / total * 100:.0f}%"
        label = escape(f"{name} {percent}")
        out.append(
            f'<rect class="fill series-{index % 8}" x="{x:.1f}" y="4" width="{w:.1f}" height="24">'
            f"<title>{label}</title></rect>"
        )
        if w > 60:
            out.append(f'<text class="on-fill" x="{x + 6:.1f}" y="21">{label}</text>')
        x += w
    out.append("</svg>")
    return Markup("".join(out))  # nosec B704 - every label and link escaped above


@dataclass(frozen=True)
class Node:
    """A box of a graph: ``state`` names a style (``succeeded``, ``running``, ``failed``,
    ``waiting``, ``skipped``, ``cached``, or a kind such as ``dataset``); ``href`` must be
    one of the UI's own paths (never taken from user data)."""

    id: str
    label: str
    state: str = ""
    href: str = ""
    detail: str = ""


_BOX_W, _BOX_H, _GAP_X, _GAP_Y = 168, 40, 56, 18


def _layers(ids: list[str], edges: Sequence[tuple[str, str]]) -> list[list[str]]:
    """Each node's layer is its longest path from a source (cycles are broken by order);
    within a layer, nodes follow the mean position of their parents."""
    parents: dict[str, list[str]] = {i: [] for i in ids}
    for a, b in edges:
        if a in parents and b in parents and a != b:
            parents[b].append(a)
    depth: dict[str, int] = {}

    def depth_of(node: str, seen: frozenset[str]) -> int:
        if node not in depth:
            ups = [p for p in parents[node] if p not in seen]
            depth[node] = 1 + max((depth_of(p, seen | {node}) for p in ups), default=-1)
        return depth[node]

    for node in ids:
        depth_of(node, frozenset())
    layers: list[list[str]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    position: dict[str, float] = {}
    for node in ids:
        layers[depth[node]].append(node)
    for layer in layers:
        for node in layer:
            ups = [position[p] for p in parents[node] if p in position]
            position[node] = sum(ups) / len(ups) if ups else float(len(position))
        layer.sort(key=lambda n: position[n])
        for index, node in enumerate(layer):
            position[node] = float(index)
    return layers


def dag(nodes: Sequence[Node], edges: Sequence[tuple[str, str]], title: str) -> Markup:
    """``nodes`` joined by ``edges`` (from, to), drawn left to right in layers, each box
    styled by its state and linked to its page when it has one."""
    ids = list(dict.fromkeys(n.id for n in nodes))
    by_id = {n.id: n for n in nodes}
    layers = _layers(ids, edges)
    tallest = max((len(layer) for layer in layers), default=1)
    width = max(1, len(layers)) * (_BOX_W + _GAP_X) - _GAP_X + 8
    height = tallest * (_BOX_H + _GAP_Y) - _GAP_Y + 8
    where: dict[str, tuple[float, float]] = {}
    for col, layer in enumerate(layers):
        offset = (tallest - len(layer)) * (_BOX_H + _GAP_Y) / 2
        for row, node in enumerate(layer):
            where[node] = (4 + col * (_BOX_W + _GAP_X), 4 + offset + row * (_BOX_H + _GAP_Y))
    # A picture with links in it is a group, not an image: an image's content is
    # presentational, so its links would be lost to assistive technology.
    role = "group" if any(n.href for n in nodes) else "img"
    out = [
        f'<svg class="graph" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} '
        f'{height:.0f}" role="{role}" aria-label="{escape(title)}"><title>{escape(title)}</title>'
    ]
    for a, b in edges:
        if a in where and b in where and a != b:
            (ax, ay), (bx, by) = where[a], where[b]
            sx, sy, ex, ey = ax + _BOX_W, ay + _BOX_H / 2, bx, by + _BOX_H / 2
            mid = (sx + ex) / 2
            out.append(
                f'<path class="edge" d="M{sx:.1f},{sy:.1f} C{mid:.1f},{sy:.1f} {mid:.1f},{ey:.1f} '
                f'{ex:.1f},{ey:.1f}"/>'
            )
    for node_id in ids:
        out.append(_box(by_id[node_id], *where[node_id]))
    out.append("</svg>")
    return Markup("".join(out))  # nosec B704 - every label and link escaped above


def _box(node: Node, x: float, y: float) -> str:
    label = node.label if len(node.label) <= 22 else node.label[:21] + "…"
    tip = escape(" · ".join(p for p in (node.label, node.state, node.detail) if p))
    state = "".join(c for c in node.state.lower() if c.isalnum() or c == "-")
    body = (
        f'<g class="node state-{state}"><title>{tip}</title>'
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{_BOX_W}" height="{_BOX_H}" rx="6"/>'
        f'<text x="{x + 8:.1f}" y="{y + 17:.1f}">{escape(label)}</text>'
        f'<text class="sub" x="{x + 8:.1f}" y="{y + 32:.1f}">{escape(node.state)}</text></g>'
    )
    if node.href:
        return f'<a href="{escape(node.href)}">{body}</a>'
    return body
