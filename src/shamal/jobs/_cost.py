"""Cost accounting: GPU-, CPU- and memory-seconds per attempt, priced by pool labels.

Pure functions over closed attempts. An attempt is counted only for the part of it
that falls inside the report's period, so consecutive reports add up exactly.
Prices come from the pool's labels: ``cost_per_gpu_hour``, ``cost_per_cpu_hour`` and
``cost_per_gib_hour`` (0 when a pool does not set one).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime

from shamal.errors import InvalidParameter
from shamal.jobs._entities import CostLine
from shamal.jobs._store import Attempt
from shamal.scheduler.core import GPU_MILLI, Pool

GROUPINGS = ("team", "pool", "user", "job")


def _key(attempt: Attempt, by: str) -> str:
    if by == "team":
        return attempt.team or "-"
    if by == "pool":
        return attempt.pool
    if by == "user":
        return attempt.user
    return attempt.job_id


def report(
    attempts: Iterable[Attempt],
    pools: Mapping[str, Pool],
    *,
    by: str,
    since: datetime,
    until: datetime,
) -> list[CostLine]:
    """One line per group, most expensive first (then by name).

    Raises:
        InvalidParameter: ``by`` is not one of team, pool, user, job.
    """
    if by not in GROUPINGS:
        raise InvalidParameter(f"--by takes one of: {', '.join(GROUPINGS)}")
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    jobs: dict[str, set[str]] = defaultdict(set)
    attempts_n: dict[str, int] = defaultdict(int)
    for attempt in attempts:
        end = attempt.ended_at or until
        seconds = (min(end, until) - max(attempt.started_at, since)).total_seconds()
        if seconds <= 0:
            continue
        key = _key(attempt, by)
        gpu_s = seconds * attempt.gpu_milli / GPU_MILLI
        cpu_s = seconds * attempt.cpu_milli / 1000
        gib_s = seconds * attempt.memory_mib / 1024
        pool = pools.get(attempt.pool, Pool(attempt.pool))
        cost = (
            gpu_s * pool.price("cost_per_gpu_hour")
            + cpu_s * pool.price("cost_per_cpu_hour")
            + gib_s * pool.price("cost_per_gib_hour")
        ) / 3600
        line = sums[key]
        line[0] += gpu_s
        line[1] += cpu_s
        line[2] += gib_s
        line[3] += cost
        jobs[key].add(attempt.job_id)
        attempts_n[key] += 1
    lines = [
        CostLine(key, len(jobs[key]), attempts_n[key], v[0], v[1], v[2], round(v[3], 6))
        for key, v in sums.items()
    ]
    return sorted(lines, key=lambda line: (-line.cost, -line.gpu_seconds, line.key))
