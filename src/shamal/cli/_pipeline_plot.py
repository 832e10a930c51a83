"""A pipeline run's DAG as a picture: one column per depth, each step a box coloured by its
state, arrows from the steps it waits for."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from shamal.cli._plotfile import pyplot, save_figure

if TYPE_CHECKING:
    from shamal.pipelines import PipelineSpec

COLOURS = {
    "succeeded": "#2e7d32",
    "cached": "#1565c0",
    "running": "#00838f",
    "submitting": "#00838f",
    "pending": "#9e9e9e",
    "failed": "#c62828",
    "upstream_failed": "#ef9a9a",
    "skipped": "#f9a825",
    "cancelled": "#6a1b9a",
}


def layout(spec: PipelineSpec) -> dict[str, tuple[int, int]]:
    """(column, row) of each step: its column is its longest path from a first step."""
    depth: dict[str, int] = {}
    for step in spec.steps:  # already in dependency order
        depth[step.name] = 1 + max((depth[u] for u in step.upstream), default=-1)
    rows: dict[int, int] = {}
    place: dict[str, tuple[int, int]] = {}
    for step in spec.steps:
        column = depth[step.name]
        place[step.name] = (column, rows.get(column, 0))
        rows[column] = rows.get(column, 0) + 1
    return place


def draw_dag(spec: PipelineSpec, run: dict[str, Any], path: Path) -> Path:
    """Draw ``run`` of ``spec`` to ``path`` (checked by ``plot_path``)."""
    plt = pyplot()
    place = layout(spec)
    states = {s["key"]: s["state"] for s in run["steps"]}
    widest = max(c for c, _ in place.values()) + 1
    tallest = max(r for _, r in place.values()) + 1
    fig, ax = plt.subplots(figsize=(max(4.0, 2.6 * widest), max(2.0, 1.1 * tallest)))
    for step in spec.steps:
        x, y = place[step.name]
        for name in step.upstream:
            ux, uy = place[name]
            ax.annotate(
                "",
                xy=(x - 0.38, -y),
                xytext=(ux + 0.38, -uy),
                arrowprops={"arrowstyle": "->", "color": "#555555"},
            )
    for step in spec.steps:
        x, y = place[step.name]
        state = states.get(step.name, "pending")
        items = sum(1 for k in states if k.startswith(f"{step.name}["))
        label = f"{step.name}{f' ×{items}' if items else ''}\n{state.replace('_', ' ')}"
        ax.text(
            x,
            -y,
            label,
            ha="center",
            va="center",
            fontsize=9,
            color="white",
            bbox={"boxstyle": "round,pad=0.4", "facecolor": COLOURS.get(state, "#607d8b")},
        )
    ax.set_xlim(-0.6, widest - 0.4)
    ax.set_ylim(-tallest + 0.4, 0.6)
    ax.axis("off")
    ax.set_title(f"{run['pipeline']} v{run['version']}: run {run['id'][:12]} {run['state']}")
    return save_figure(fig, path)
