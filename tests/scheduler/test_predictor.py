"""The runtime predictor learns from history and reports its error honestly."""

from __future__ import annotations

import math
import random

import pytest

from shamal.scheduler.core import JobRecord, RuntimePredictor, error_report
from tests.scheduler.helpers import make_job


def history(n: int, seed: int = 0) -> list[JobRecord]:
    """Jobs whose runtime depends on user and command (with noise), submitted over time."""
    rng = random.Random(seed)
    base = {
        ("ann", "train.py --small"): 600.0,
        ("ann", "train.py --big"): 30_000.0,
        ("bob", "eval.py"): 120.0,
        ("bob", "sweep.py"): 7200.0,
    }
    records = []
    for i in range(n):
        (user, command), runtime = rng.choice(list(base.items()))
        actual = runtime * math.exp(rng.gauss(0, 0.2))
        records.append(
            JobRecord(
                runtime_s=actual,
                team="vision" if user == "ann" else "speech",
                user=user,
                fingerprint=command,
                gpus=1.0,
                submitted_at=i * 100.0,
            )
        )
    return records


def test_predictor_learns_per_user_and_command() -> None:
    predictor = RuntimePredictor().fit(history(400))
    job = make_job("j")
    job.user, job.fingerprint, job.team = "ann", "train.py --big", "vision"
    predicted = predictor.predict(job)
    assert predicted is not None
    assert 20_000 < predicted < 45_000
    job.user, job.fingerprint, job.team = "bob", "eval.py", "speech"
    predicted = predictor.predict(job)
    assert predicted is not None
    assert 80 < predicted < 180
    # An unseen command of a known user falls back on the user's history.
    job.fingerprint = "new.py"
    fallback = predictor.predict(job)
    assert fallback is not None
    assert 120 < fallback < 7200


def test_predictor_knows_nothing_before_learning() -> None:
    assert RuntimePredictor().predict(make_job("j")) is None


def test_online_evaluation_predicts_before_the_runtime_is_known() -> None:
    records = history(600, seed=1)
    report = RuntimePredictor().evaluate_online(records)
    assert report["n"] + report["unpredicted"] == len(records)
    assert report["unpredicted"] >= 1  # the first job had no history to go by
    # Long jobs finish late, so early predictions of them go by the user alone.
    assert report["within_2x"] > 0.8
    assert report["mdape"] < 0.3
    # Much better than always answering the global median.
    runtimes = sorted(r.runtime_s for r in records)
    median = runtimes[len(runtimes) // 2]
    baseline = error_report((median, r.runtime_s) for r in records)
    assert report["mdape"] < baseline["mdape"] / 2


def test_error_report_figures() -> None:
    report = error_report([(100.0, 100.0), (300.0, 100.0), (50.0, 100.0), (100.0, 400.0)])
    assert report["n"] == 4
    assert report["mae_s"] == pytest.approx((0 + 200 + 50 + 300) / 4)
    assert report["mdape"] == pytest.approx((0.5 + 0.75) / 2)
    assert report["within_2x"] == pytest.approx(0.5)
    assert math.isnan(error_report([])["mae_s"])
