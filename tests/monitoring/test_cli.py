"""`shamal monitor` as users type it: what the CLI refuses before asking the server, and
how it shows a monitor's series (table rows with sparklines, a PNG)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from shamal.cli import app
from shamal.cli._curves import BLOCKS
from shamal.cli.monitor import column_rows, describe_action, monitor_body, plot_series
from tests.cli_checks import one_clean_error


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["create", "api", "--schedule", "often"], "--schedule takes a duration"),
        (["create", "api", "--reference", "fraud"], "--reference is MODEL/VERSION"),
        (["create", "api", "--reference", "fraud/0"], "--reference is MODEL/VERSION"),
        (["create", "api", "--test", "amount"], "--test takes COLUMN=TEST"),
        (["reference", "show", "fraud/x"], "MODEL/VERSION is MODEL/VERSION such as fraud/3"),
        (["show", "m", "--plot", "out.gif"], "cannot draw a .gif file"),
    ],
)
def test_the_cli_refuses_malformed_options_before_any_request(
    offline_cli: CliRunner, args: list[str], message: str
) -> None:
    one_clean_error(offline_cli.invoke(app, ["monitor", *args]), message)


def test_the_options_make_the_api_body() -> None:
    body = monitor_body(
        "api",
        "2h",
        reference="fraud/3",
        columns=["amount"],
        tests=["amount=ks"],
        threshold=0.01,
        on_drift="retrain:r",
        alert="https://h.example/x",
        params=["reason=drift", "min_rows=500"],
    )
    assert body == {
        "deployment": "api",
        "schedule_s": 7200,
        "columns": ["amount"],
        "tests": {"amount": "ks"},
        "correction": "none",
        "drift_share": 0.5,
        "window": 1000,
        "on_drift": "retrain:r",
        "reference": {"model": "fraud", "version": 3},
        "threshold": 0.01,
        "alert_url": "https://h.example/x",
        "retrain_params": {"reason": "drift", "min_rows": 500},
    }


def _points() -> list[dict[str, object]]:
    points = []
    for i, value in enumerate([0.01, 0.02, 0.5, 0.9]):
        for column, scale in (("amount", 1.0), ("score", 0.1)):
            points.append(
                {
                    "column": column,
                    "at": f"2030-01-01T0{i}:00:00+00:00",
                    "result_id": str(i),
                    "test": "wasserstein",
                    "statistic": value * scale,
                    "p_value": None,
                    "threshold": 0.1,
                    "drifted": value * scale > 0.1,
                }
            )
    return points


def test_each_column_shows_its_latest_verdict_and_a_sparkline_of_its_past() -> None:
    rows = column_rows(_points())
    assert [r["column"] for r in rows] == ["amount", "score"]
    amount, score = rows
    assert amount["verdict"] == "DRIFT"
    assert score["verdict"] == "ok"
    assert amount["statistic"] == "0.9"
    assert amount["recent"][0] == BLOCKS[0]
    assert amount["recent"][-1] == BLOCKS[-1]
    assert len(amount["recent"]) == 4


def test_a_performance_series_shows_its_score_without_a_verdict() -> None:
    accuracy = {
        "column": "performance:accuracy",
        "at": "2030-01-01T00:00:00+00:00",
        "result_id": "1",
        "test": "performance",
        "statistic": 0.75,
        "p_value": None,
        "threshold": 0.0,
        "drifted": False,
    }
    (row,) = column_rows([accuracy])
    assert (row["statistic"], row["threshold"], row["verdict"]) == ("0.75", "-", "-")


def test_the_series_is_drawn_to_a_png(tmp_path: Path) -> None:
    points = _points()
    points[0]["statistic"] = None  # a test that could not be computed: a gap
    assert column_rows(points[:1])[0]["statistic"] == "-"
    written = plot_series(points, tmp_path / "drift.png", "monitor m")
    assert written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_policy_actions_are_told_in_words() -> None:
    started = {"action": "retrain", "pipeline": "retrain", "run": "ab12", "status": "started"}
    assert describe_action(started) == "retrain retrain: started run ab12"
    held = {"action": "retrain", "pipeline": "p", "status": "held", "reason": "a canary"}
    assert describe_action(held) == "retrain p: held (a canary)"
    failed = {"action": "rollback", "status": "failed", "error": "no canary"}
    assert describe_action(failed) == "rollback: failed (no canary)"
