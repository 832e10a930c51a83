"""Performance once labels arrive: a run scores the labels posted since the last one against
the answers the samples hold (joined by request id), stores the metrics as series, and reads
a corrected label again; labels that pair no row are counted, never fatal."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from shamal.deployments import Label, SampledRequest
from shamal.deployments._service import DeploymentService
from shamal.monitoring import MonitorService, MonitorSpec
from tests.monitoring.conftest import DEPLOYMENT, ManualClock, People, excerpt

HOUR = 3600


def _sample(
    deployments: DeploymentService, people: People, request_id: str, answers: Sequence[object]
) -> SampledRequest:
    revision = deployments.get(people.principals["mo"], DEPLOYMENT).revision
    rows = len(answers)
    return SampledRequest(
        revision=revision,
        version="1",
        shadow=False,
        inputs={
            "amount": excerpt([100.0 + i for i in range(rows)]),
            "country": excerpt(["nl"] * rows, "BYTES"),
        },
        outputs={"label": excerpt(list(answers), "INT64")},
        request_id=request_id,
    )


@pytest.mark.usefixtures("reference")
def test_labels_that_arrive_later_are_scored_once_and_again_when_corrected(
    monitors: MonitorService, deployments: DeploymentService, people: People, clock: ManualClock
) -> None:
    mo = people.principals["mo"]
    made = monitors.create(people.ctx("mo"), MonitorSpec(DEPLOYMENT, HOUR))
    answers = [0, 1, 1, 0]
    deployments.record_samples(
        mo, DEPLOYMENT, [_sample(deployments, people, f"r{i}", answers) for i in range(5)]
    )
    first = monitors.run_now(people.ctx("mo"), made.name).result
    assert first is not None
    assert "performance" not in first.report  # no label yet
    # Days later: labels for every request, each with one of its four rows wrong.
    clock.advance(2 * 86400)
    posted = {f"r{i}": [0, 1, 1, 1] for i in range(5)}
    outcome = deployments.record_labels(mo, DEPLOYMENT, [Label(k, v) for k, v in posted.items()])
    assert outcome.unmatched == ()
    scored = monitors.run_now(people.ctx("mo"), made.name).result
    assert scored is not None
    performance = scored.report["performance"]
    assert (performance["task"], performance["rows"], performance["output"]) == (
        "classification",
        20,
        "label",
    )
    assert performance["metrics"]["accuracy"] == pytest.approx(0.75)
    assert scored.report["columns"] == []  # no new traffic: nothing to compare
    series = monitors.series(people.principals["vi"], made.name, column="performance:accuracy")
    assert [p.statistic for p in series] == [pytest.approx(0.75)]
    # Scored once: the next run has nothing new.
    assert monitors.run_now(people.ctx("mo"), made.name).reason == "no new samples"
    # A corrected label is read again (and only it).
    deployments.record_labels(mo, DEPLOYMENT, [Label("r0", [0, 1, 1, 0])])
    corrected = monitors.run_now(people.ctx("mo"), made.name).result
    assert corrected is not None
    assert corrected.report["performance"]["rows"] == 4
    assert corrected.report["performance"]["metrics"]["accuracy"] == 1.0


@pytest.mark.usefixtures("reference")
def test_labels_that_pair_no_row_are_counted_and_numbers_score_as_regression(
    monitors: MonitorService, deployments: DeploymentService, people: People
) -> None:
    mo = people.principals["mo"]
    made = monitors.create(people.ctx("mo"), MonitorSpec(DEPLOYMENT, HOUR))
    samples = [
        _sample(deployments, people, "one", [1]),
        _sample(deployments, people, "many", [1, 2, 3]),
        _sample(deployments, people, "short", [1, 2, 3]),
    ]
    samples[0] = SampledRequest(
        samples[0].revision,
        "1",
        False,
        samples[0].inputs,
        {"label": excerpt([2.5])},
        request_id="one",
    )
    deployments.record_samples(mo, DEPLOYMENT, samples)
    labels = [Label("one", 2.0), Label("many", 1.5), Label("short", [1.5, 2.0])]
    deployments.record_labels(mo, DEPLOYMENT, labels)
    result = monitors.run_now(people.ctx("mo"), made.name).result
    assert result is not None
    performance = result.report["performance"]
    # "many": one label for three rows; "short": two labels for three rows: neither pairs.
    assert (performance["samples"], performance["skipped"], performance["rows"]) == (3, 2, 1)
    assert performance["task"] == "regression"
    assert performance["metrics"]["mae"] == pytest.approx(0.5)
    assert performance["metrics"]["r2"] is None  # undefined on one row, and JSON holds no NaN


def test_text_labels_for_a_model_answering_numbers_are_compared_as_text() -> None:
    from datetime import UTC, datetime

    from shamal.monitoring._columns import LabelledPairs
    from shamal.monitoring._evaluate import score

    pairs = LabelledPairs(truth=["1", "0", "1"], predicted=[1, 0, 0], output="label", samples=3)
    body, points = score(pairs, at=datetime(2030, 1, 1, tzinfo=UTC), result_id="r")
    assert body["task"] == "classification"
    assert body["metrics"]["accuracy"] == pytest.approx(2 / 3)
    assert {p.column for p in points} >= {"performance:accuracy", "performance:f1"}
    empty, none = score(LabelledPairs(samples=2, skipped=2), at=datetime(2030, 1, 1), result_id="r")
    assert (empty["rows"], empty["metrics"], none) == (0, {}, [])
