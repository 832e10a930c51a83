"""How the CLI presents things: ids stay whole in narrow terminals, and which way a metric
is best when comparing."""

from __future__ import annotations

import pytest
from rich.console import Console
from typer.testing import CliRunner

from shamal import __version__
from shamal.cli import _common, app, job
from shamal.cli.tracking import goal_of


@pytest.fixture
def narrow(monkeypatch: pytest.MonkeyPatch) -> Console:
    console = Console(width=40, record=True, color_system=None)
    monkeypatch.setattr(_common, "console", console)
    monkeypatch.setattr(job, "console", console)
    return console


def test_an_id_column_is_never_cut_or_wrapped(narrow: Console) -> None:
    run_id = "5f5e5a1b2c3d"
    rows = [
        {"run_id": run_id, "run_name": "resnet50-lr0.1-bs256-augmented", "status": "FINISHED"},
        {"run_id": "a262a0f9e8d7", "run_name": "x", "status": "RUNNING"},
    ]
    _common.print_table("Runs", ["run_id", "run_name", "status"], rows)
    text = narrow.export_text()
    assert run_id in text
    assert "a262a0f9e8d7" in text


def test_job_list_keeps_job_ids_whole(narrow: Console) -> None:
    jobs = [
        {
            "id": "0123456789abcdef0123456789abcdef",
            "name": "train a model with a long descriptive name",
            "team": "vision-research-group",
            "state": "queued",
            "waiting": "quota: team vision-research-group is at its guarantee",
            "priority": "normal",
            "resources": "8 CPU, 32 GiB, 4 GPU",
            "attempt": 1,
            "submitted_at": "2026-11-22T02:30:00+00:00",
            "preemptions": 0,
        }
    ]
    job._print_jobs(jobs, "Jobs")
    assert "0123456789ab" in narrow.export_text()


@pytest.mark.parametrize(
    ("key", "goal"),
    [("loss", "min"), ("val_loss", "min"), ("test_RMSE", "min"), ("error_rate", "min"),
     ("latency_ms", "min"), ("train_time_s", "min"), ("perplexity", "min"), ("wer", "min"),
     ("accuracy", "max"), ("f1", "max"), ("auc", "max"), ("reward", "max"), ("precision", "max"),
     ("answer", "max"), ("werewolf_score", "max")],
)  # fmt: skip
def test_a_metric_is_best_low_or_high_by_its_name(key: str, goal: str) -> None:
    assert goal_of(key, None) == goal
    assert goal_of(key, True) == "max"
    assert goal_of(key, False) == "min"


def test_version_flag_prints_the_installed_version_without_a_server() -> None:
    # No server at this address: --version must not need one.
    env = {"SHAMAL_URL": "http://127.0.0.1:9", "SHAMAL_TOKEN": "shm_" + "x" * 43}
    shown = CliRunner().invoke(app, ["--version"], env=env)
    assert shown.exit_code == 0, shown.output
    assert shown.output.strip() == f"shamal {__version__}"
    helped = CliRunner().invoke(app, [], env=env)
    assert "Usage: shamal" in helped.output
    assert "--version" in helped.output
