"""Rules for comparing the experiments and runs the client fetched, as the API returns them.

Which way a metric is best, what each experiment's best values are, which values of a row
stand out, and which metrics a chart of runs draws: pure functions over the API's JSON, so
that what the CLI prints and what a script computes agree.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, Final

__all__ = [
    "best_value",
    "extremes",
    "goal_of",
    "metrics_to_draw",
    "missing_metrics",
    "status_rank",
    "summarize_experiment",
]

#: The order run states are listed in; others follow by name.
STATUS_ORDER: Final = ("RUNNING", "SCHEDULED", "FINISHED", "FAILED", "KILLED")

#: Words of a metric name that make its best value the lowest, unless --max/--min says
#: otherwise; "loss" and "error" count inside words too (trainloss, mean_abs_error).
_LOWER_IS_BETTER: Final = frozenset(
    [
        "loss",
        "err",
        "error",
        "errors",
        "mse",
        "mae",
        "mape",
        "rmse",
        "rmsle",
        "nll",
        "perplexity",
        "ppl",
        "latency",
        "time",
        "duration",
        "wer",
        "cer",
        "regret",
        "cost",
    ]
)
_WORDS: Final = re.compile(r"[a-z]+")


def goal_of(key: str, maximize: bool | None) -> str:
    """``"max"`` or ``"min"``: what ``maximize`` says, or else what the name suggests
    (``val_loss``, ``test_rmse``, ``latency_ms`` are best low; ``accuracy``, ``f1`` high)."""
    if maximize is not None:
        return "max" if maximize else "min"
    name = key.lower()
    lower = (
        "loss" in name or "error" in name or not _LOWER_IS_BETTER.isdisjoint(_WORDS.findall(name))
    )
    return "min" if lower else "max"


def status_rank(status: str) -> tuple[int, str]:
    """Where a run status sorts: as :data:`STATUS_ORDER`, then the others by name."""
    known = status in STATUS_ORDER
    return (STATUS_ORDER.index(status) if known else len(STATUS_ORDER), status)


def _beats(value: float, held: dict[str, Any] | None, goal: str) -> bool:
    if held is None:
        return True
    return bool(value > held["value"] if goal == "max" else value < held["value"])


def summarize_experiment(
    exp: dict[str, Any],
    runs_of: Iterable[dict[str, Any]],
    *,
    metric: str | None,
    maximize: bool | None,
) -> dict[str, Any]:
    """What `experiments compare` shows of one experiment, from its API record and runs.

    Returns:
        ``experiment_id``, ``name``, ``lifecycle_stage``; ``runs`` (how many) and
        ``runs_by_status``; ``last_activity`` (ms: the latest of the experiment's update time
        and its runs' start, end and latest-metric times); ``goal`` ("max", "min", or "by
        name" when ``maximize`` is None: see :func:`goal_of`); ``best``: per metric (only
        ``metric`` when given), the best finite latest value with its ``step``, ``run_id``,
        ``run_name`` and ``goal`` (the newest run wins a tie); ``metric_keys``: every metric
        any run logged.
    """
    by_status: Counter[str] = Counter()
    times = [exp["last_update_time"]]
    best: dict[str, dict[str, Any]] = {}
    keys: set[str] = set()
    for run in runs_of:
        by_status[run["status"]] += 1
        times.extend(t for t in (run["start_time"], run["end_time"]) if t is not None)
        for key, point in run["metrics"].items():
            keys.add(key)
            times.append(point["timestamp"])
            value = point.get("value")
            if value is None or metric not in (None, key):
                continue
            goal = goal_of(key, maximize)
            if _beats(value, best.get(key), goal):
                best[key] = {
                    "value": value,
                    "step": point["step"],
                    "run_id": run["run_id"],
                    "run_name": run["run_name"],
                    "goal": goal,
                }
    return {
        "experiment_id": exp["experiment_id"],
        "name": exp["name"],
        "lifecycle_stage": exp["lifecycle_stage"],
        "runs": sum(by_status.values()),
        "runs_by_status": dict(sorted(by_status.items(), key=lambda kv: status_rank(kv[0]))),
        "last_activity": max(times),
        "goal": "by name" if maximize is None else "max" if maximize else "min",
        "best": dict(sorted(best.items())),
        "metric_keys": sorted(keys),
    }


def best_value(values: Iterable[float], goal: str) -> float | None:
    """The best of ``values`` (the highest when ``goal`` is "max", else the lowest), or None
    when they hold fewer than two distinct values: nothing then stands out."""
    distinct = set(values)
    if len(distinct) < 2:
        return None
    return max(distinct) if goal == "max" else min(distinct)


def extremes(values: Sequence[float]) -> tuple[float, float] | None:
    """The highest and lowest of ``values``, or None unless there are two or more that
    differ."""
    if len(values) < 2 or max(values) == min(values):
        return None
    return max(values), min(values)


def metrics_to_draw(runs: Sequence[dict[str, Any]], given: Sequence[str], most: int) -> list[str]:
    """The metrics a chart of ``runs`` draws: those ``given`` (each once, in order), else
    the first ``most`` of the runs' metrics by name."""
    chosen = list(dict.fromkeys(given))
    return chosen or sorted({key for run in runs for key in run["metrics"]})[:most]


def missing_metrics(runs: Sequence[dict[str, Any]], keys: Sequence[str]) -> list[str]:
    """The ``keys`` that none of ``runs`` logged, in order."""
    return [key for key in keys if not any(key in run["metrics"] for run in runs)]
