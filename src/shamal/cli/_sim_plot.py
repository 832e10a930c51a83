"""Plots of a simulation: queue length and GPU utilization over time (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shamal.cli._plotfile import plot_path, pyplot, save_figure
from shamal.scheduler.core.sim import SimResult

__all__ = ["plot_timeline"]

_POINTS = 4000


def _resample(times: np.ndarray, values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """The step function (each value holds until the next instant) on ``grid``: the
    largest value within each grid step, so short spikes still show."""
    at = np.searchsorted(times, grid, side="right") - 1
    sampled = np.where(at >= 0, values[np.clip(at, 0, None)], 0.0)
    starts = np.clip(at[:-1] + 1, 0, len(values))
    ends = np.clip(at[1:] + 1, 0, len(values))
    peaks = sampled.astype(float).copy()
    for k in np.nonzero(ends > starts)[0]:
        peaks[k + 1] = max(peaks[k + 1], float(values[starts[k] : ends[k]].max()))
    return peaks


def plot_timeline(result: SimResult, path: str | Path, *, title: str | None = None) -> Path:
    """Draw the queue length and the GPU utilization over time; returns the file written.

    ``path`` is checked by :func:`plot_path` (its extension picks PNG, SVG or PDF).

    Raises:
        ValueError: see :func:`plot_path`.
        OSError: the file could not be written.
    """
    path = plot_path(path)
    plt = pyplot()

    times = result.times
    if len(times):
        grid = np.linspace(float(times[0]), float(times[-1]), _POINTS)
        queue = _resample(times, result.queue_length, grid)
        busy = _resample(times, result.busy_gpus, grid)
    else:
        grid = queue = busy = np.zeros(1)
    scale, unit = (86_400.0, "days") if grid[-1] - grid[0] > 3 * 86_400 else (3600.0, "hours")
    x = (grid - grid[0]) / scale
    utilization = 100.0 * busy / result.total_gpus if result.total_gpus else busy
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(10, 6))
    top.step(x, queue, where="post", color="tab:orange", linewidth=0.8)
    top.set_ylabel("jobs waiting")
    top.grid(alpha=0.3)
    bottom.step(x, utilization, where="post", color="tab:blue", linewidth=0.8)
    bottom.set_ylabel("GPU utilization (%)" if result.total_gpus else "GPUs: none")
    bottom.set_ylim(0, 105)
    bottom.set_xlabel(f"time ({unit})")
    bottom.grid(alpha=0.3)
    metrics = result.metrics
    used = metrics.get("gpu_utilization")
    fig.suptitle(
        title
        or f"policy {metrics.get('policy')}: avg JCT {metrics.get('avg_jct_s', 0):,.0f} s, "
        f"avg queue {metrics.get('avg_queue_s', 0):,.0f} s, "
        + (f"utilization {100 * used:.1f}%" if used is not None else "no GPUs")
    )
    fig.tight_layout()
    return save_figure(fig, path)
