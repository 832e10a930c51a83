"""A runtime predictor that learns from the platform's own job history.

Runtimes of the same command, user and team repeat (hyper-parameter sweeps, nightly
runs, retries), so the predictor keeps running statistics of log-runtime at several
levels of specificity and blends them, from the most general (all jobs) to the most
specific (same user and command fingerprint), each level pulled toward the one above
it in proportion to how few jobs it has seen (hierarchical shrinkage):

========================= ===============================================
level                     key
========================= ===============================================
all jobs                  -
GPUs                      GPUs asked for (total over workers)
recent jobs of that size  the same, with a short memory (arrival patterns)
team                      team
team and GPUs             team, GPUs
user                      user
user and GPUs             user, GPUs
command                   fingerprint
user's command            user, fingerprint, GPUs
========================= ===============================================

Levels whose key is empty (no user, no fingerprint) are skipped. Statistics are
exponentially weighted toward recent jobs (``memory`` jobs per key) so the predictor
follows drift. Pure Python; ``fit`` learns a batch of records, ``update`` one record as
a job finishes, ``predict`` answers for a :class:`SchedJob` or a record.

Errors are reported honestly: :meth:`RuntimePredictor.evaluate_online` predicts each
job at its submission from the jobs finished before it, then learns it when it
finishes; the simulator does the same as it replays a trace.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from shamal.scheduler.core._state import SchedJob

__all__ = [
    "ErrorTracker",
    "JobRecord",
    "RuntimePredictor",
    "error_report",
]

_MIN_RUNTIME_S = 1.0


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One finished job as the predictor sees it.

    ``gpus`` is the total over workers (a fraction for shared GPUs).
    ``submitted_at`` and ``finished_at`` order the history for online evaluation.
    """

    runtime_s: float
    team: str = ""
    user: str = ""
    fingerprint: str = ""
    gpus: float = 0.0
    cpu_milli: int = 0
    memory_mib: int = 0
    submitted_at: float = 0.0
    finished_at: float | None = None

    @classmethod
    def of(cls, job: SchedJob, runtime_s: float, finished_at: float | None = None) -> JobRecord:
        """The record of a scheduler job that ran ``runtime_s`` seconds."""
        total = job.request.total
        return cls(
            runtime_s=runtime_s,
            team=job.team,
            user=job.user,
            fingerprint=job.fingerprint,
            gpus=job.gpus,
            cpu_milli=total.cpu_milli,
            memory_mib=total.memory_mib,
            submitted_at=job.submitted_at,
            finished_at=finished_at,
        )


@dataclass(slots=True)
class _Stat:
    """An exponentially weighted mean of log-runtime and how many jobs it has seen."""

    mean: float = 0.0
    count: int = 0


def _features(
    team: str, user: str, fingerprint: str, gpus: float
) -> list[tuple[tuple[Any, ...], bool]]:
    """The keys of a job, general to specific; the flag marks short-memory levels."""
    size = round(gpus, 3)
    keys: list[tuple[tuple[Any, ...], bool]] = [
        (("all",), False),
        (("gpus", size), False),
        (("recent", size), True),
    ]
    if team:
        keys += [(("team", team), False), (("team-gpus", team, size), False)]
    if user:
        keys += [(("user", user), False), (("user-gpus", user, size), False)]
    if fingerprint:
        keys.append((("fp", fingerprint), False))
        keys.append((("user-fp", user, fingerprint, size), False))
    return keys


@dataclass
class RuntimePredictor:
    """Predicts a job's runtime from the history of finished jobs.

    Attributes:
        prior: how many jobs a level must have seen to count as much as the level
            above it (shrinkage strength).
        memory: a level's statistics weigh roughly its last ``memory`` jobs.
        recent_memory: the same for the short-memory level (arrival patterns).
    """

    prior: float = 2.0
    memory: int = 50
    recent_memory: int = 5
    _stats: dict[tuple[Any, ...], _Stat] = field(default_factory=dict, repr=False)
    learned: int = 0

    def fit(self, records: Iterable[JobRecord]) -> RuntimePredictor:
        """Learn a batch of finished jobs (in finishing order when known)."""
        ordered = sorted(
            records, key=lambda r: r.finished_at if r.finished_at is not None else r.submitted_at
        )
        for record in ordered:
            self.update(record)
        return self

    def update(self, record: JobRecord) -> None:
        """Learn one finished job."""
        value = math.log(max(record.runtime_s, _MIN_RUNTIME_S))
        for key, short in _features(record.team, record.user, record.fingerprint, record.gpus):
            stat = self._stats.get(key)
            if stat is None:
                stat = self._stats[key] = _Stat()
            stat.count += 1
            alpha = max(1.0 / stat.count, 1.0 / (self.recent_memory if short else self.memory))
            stat.mean += alpha * (value - stat.mean)
        self.learned += 1

    def predict(self, job: SchedJob | JobRecord) -> float | None:
        """Predicted runtime in seconds, or ``None`` before any job was learned."""
        keys = _features(job.team, job.user, job.fingerprint, job.gpus)
        estimate: float | None = None
        for key, _ in keys:
            stat = self._stats.get(key)
            if stat is None or not stat.count:
                continue
            if estimate is None:
                estimate = stat.mean
            else:
                estimate = (stat.count * stat.mean + self.prior * estimate) / (
                    stat.count + self.prior
                )
        return None if estimate is None else math.exp(estimate)

    def evaluate_online(self, records: Iterable[JobRecord]) -> dict[str, float]:
        """Replay ``records`` in time: predict each at its submission from the jobs
        finished before it, learn each when it finishes; report the errors.

        Records without ``finished_at`` count as finished at submission + runtime.
        The predictor keeps what it learned.
        """
        items = sorted(records, key=lambda r: r.submitted_at)
        finishing: list[tuple[float, int, JobRecord]] = []
        tracker = ErrorTracker()
        for seq, record in enumerate(items):
            while finishing and finishing[0][0] <= record.submitted_at:
                self.update(heapq.heappop(finishing)[2])
            tracker.add(self.predict(record), record.runtime_s)
            done = (
                record.finished_at
                if record.finished_at is not None
                else record.submitted_at + record.runtime_s
            )
            heapq.heappush(finishing, (done, seq, record))
        while finishing:
            self.update(heapq.heappop(finishing)[2])
        return tracker.report()


@dataclass
class ErrorTracker:
    """Pairs of (prediction made before the job ran, actual runtime)."""

    predicted: list[float] = field(default_factory=list)
    actual: list[float] = field(default_factory=list)
    missing: int = 0

    def add(self, predicted: float | None, actual: float) -> None:
        if predicted is None:
            self.missing += 1
            return
        self.predicted.append(predicted)
        self.actual.append(actual)

    def report(self) -> dict[str, float]:
        report = error_report(zip(self.predicted, self.actual, strict=True))
        report["unpredicted"] = self.missing
        return report


def error_report(pairs: Iterable[tuple[float, float]]) -> dict[str, float]:
    """Error figures of (predicted, actual) runtime pairs.

    ``mae_s``: mean absolute error; ``mdape``: median absolute percentage error
    (|predicted - actual| / actual, actual floored at 1 s); ``within_2x``: share of
    predictions between half and twice the actual runtime; ``median_log2_ratio``:
    bias (positive: over-estimates).
    """
    errors: list[float] = []
    percentages: list[float] = []
    logs: list[float] = []
    within = 0
    for predicted, actual in pairs:
        floor = max(actual, _MIN_RUNTIME_S)
        errors.append(abs(predicted - actual))
        percentages.append(abs(predicted - actual) / floor)
        ratio = max(predicted, _MIN_RUNTIME_S) / floor
        logs.append(math.log2(ratio))
        within += 0.5 <= ratio <= 2.0
    if not errors:
        return {
            "n": 0,
            "mae_s": math.nan,
            "mdape": math.nan,
            "within_2x": math.nan,
            "median_log2_ratio": math.nan,
        }
    return {
        "n": len(errors),
        "mae_s": statistics.fmean(errors),
        "mdape": statistics.median(percentages),
        "within_2x": within / len(errors),
        "median_log2_ratio": statistics.median(logs),
    }
