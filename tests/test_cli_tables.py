"""How the CLI presents things: ids stay whole in narrow terminals, lists fit an 80-column
terminal (fewer columns, ages for timestamps) and keep every column in a wide one, and which
way a metric is best when comparing."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from rich.cells import cell_len
from rich.console import Console
from typer.testing import CliRunner

from shamal import __version__
from shamal.cli import _common, app, job
from shamal.cli._common import fmt
from shamal.cli._tables import compact_columns, relative_time, timestamp_of
from shamal.cli.scheduler import print_quotas
from shamal.cli.tracking import goal_of
from shamal.client import ShamalClient
from tests.live import LiveServer
from tests.polling import wait_for


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


# ------------------------------------------------------------------ narrow and wide consoles

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("ago", "text"),
    [
        (timedelta(0), "now"),
        (timedelta(seconds=42), "42s ago"),
        (timedelta(minutes=3, seconds=59), "3m ago"),
        (timedelta(hours=2, minutes=30), "2h ago"),
        (timedelta(days=5, hours=23), "5d ago"),
        (timedelta(days=800), "2y ago"),
        (-timedelta(days=89, hours=1), "in 89d"),
    ],
)
def test_an_age_is_told_in_its_largest_whole_unit(ago: timedelta, text: str) -> None:
    assert relative_time(NOW - ago, NOW) == text


def test_timestamps_are_read_as_the_api_writes_them() -> None:
    assert timestamp_of("2026-11-22T02:30:00+00:00") == datetime(2026, 11, 22, 2, 30, tzinfo=UTC)
    assert timestamp_of("2026-11-22T02:30:00.123456") == datetime(
        2026, 11, 22, 2, 30, 0, 123456, tzinfo=UTC
    )
    for other in ("2026-11-22", "nope\x1b", "a very long name with a T at ten", 1234, None):
        assert timestamp_of(other) is None


def test_a_compact_layout_keeps_the_essential_columns_then_the_most_useful_that_fit() -> None:
    columns = ["id", "name", "team", "state", "why", "submitted"]
    widths = {"id": 12, "name": 9, "team": 20, "state": 9, "why": 30, "submitted": 9}
    # id, name and state take 12 + 9 + 9 + 10 = 40; "submitted" fits (+12), "why" (+33) not.
    assert compact_columns(columns, widths, ["submitted", "why"], 60) == [
        "id", "name", "state", "submitted",
    ]  # fmt: skip
    # Without a rank the others are tried in order: "team" (+23) fits, then "submitted".
    assert compact_columns(columns, widths, [], 75) == ["id", "name", "team", "state", "submitted"]
    # The essential columns stay however narrow the console.
    assert compact_columns(columns, widths, [], 10) == ["id", "name", "state"]
    # A long name counts for NAME_WIDTH: it wraps, and leaves room for others.
    assert compact_columns(["id", "name", "at"], {"id": 12, "name": 90, "at": 7}, [], 80) == [
        "id", "name", "at",
    ]  # fmt: skip


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines()]


def _row(text: str, first: str) -> str:
    (line,) = [line for line in text.splitlines() if line.startswith(f"│ {first} ")]
    return line


@pytest.fixture
def screen(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], Console]:
    def at(width: int) -> Console:
        console = Console(width=width, record=True, color_system=None)
        monkeypatch.setattr(_common, "console", console)
        return console

    return at


def test_a_list_that_fits_keeps_its_full_layout_in_a_narrow_console(
    screen: Callable[[int], Console],
) -> None:
    rows = [{"name": "vision", "created_at": "2026-11-22T11:57:00+00:00"}]
    console = screen(60)
    _common.print_table("Teams", ["name", "created_at"], rows, now=NOW)
    assert "2026-11-22 11:57:00" in console.export_text()


def test_a_list_too_wide_for_the_console_shows_ages_and_fewer_columns(
    screen: Callable[[int], Console],
) -> None:
    run_id = "5f5e5a1b2c3d"
    rows = [
        {
            "run_id": run_id,
            "run_name": "resnet50-lr0.1-bs256",
            "status": "FINISHED",
            "start_time": "2026-11-22T11:57:00+00:00",
            "dataset_fingerprint": "sha256:" + "ab" * 32,
            "acc": "0.931",
        }
    ]
    columns = list(rows[0])
    console = screen(80)
    _common.print_table("Runs", columns, rows, now=NOW)
    text = console.export_text()
    assert max(cell_len(line) for line in _lines(text)) <= 80
    assert "…" not in text
    row = _row(text, run_id)
    for cell in (run_id, "resnet50-lr0.1-bs256", "FINISHED", "3m ago", "0.931"):
        assert cell in row
    assert "sha256" not in text  # the widest column is left out
    console = screen(200)
    _common.print_table("Runs", columns, rows, now=NOW)
    row = _row(console.export_text(), run_id)
    for cell in ("2026-11-22 11:57:00", "sha256:abab", "0.931"):
        assert cell in row


def test_quotas_at_80_columns_keep_pool_team_and_what_they_hold(
    screen: Callable[[int], Console],
) -> None:
    amounts = {"gpus": 4.0, "cpus": 32.0, "memory_mib": 262144}
    quota = {
        "pool": "gpu-a100", "team": "vision-research", "cohort": "research-cohort",
        "guaranteed": amounts, "borrow_limit": {**amounts, "gpus": 2.0}, "held": amounts,
        "running": 3, "queued": 12,
    }  # fmt: skip
    console = screen(80)
    print_quotas([quota], "Team quotas")
    text = console.export_text()
    assert max(cell_len(line) for line in _lines(text)) <= 80, text
    assert "…" not in text, text
    row = _row(text, "gpu-a100")
    for cell in ("vision-research", "4 GPUs, 32 CPUs, 256 GiB", "12"):
        assert cell in row, text
    console = screen(200)
    print_quotas([quota], "Team quotas")
    row = _row(console.export_text(), "gpu-a100")
    for cell in ("research-cohort", "2 GPUs, 32 CPUs, 256 GiB", "0 GPUs, 0 CPUs, 0 GiB"):
        assert cell in row


# ------------------------------------------------------------------ list commands, live


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    env = {"SHAMAL_SCHEDULER__TICK_S": "0.2", "SHAMAL_SCHEDULER__GRACE_S": "5"}
    with LiveServer(tmp_path_factory.mktemp("tables-home"), env=env) as live:
        yield live


@pytest.fixture(scope="module")
def listed(server: LiveServer) -> dict[str, Any]:
    """What the lists show: two teams, an account, a token and three jobs that ended, one
    of a team whose description is longer than a narrow console."""
    with ShamalClient(server.url, server.token) as api:
        api.create_team("vision-research", "Image models: detection, segmentation, and their data")
        api.create_team("nlp")
        api.create_user("ana-lopez")
        token = api.create_token("laptop-of-ana", expires_in_s=90 * 86400)
        jobs = [
            api.submit_job(["true"], name=name, team=team, cpus=0.5, memory_mib=64)
            for name, team in (
                ("quick-job", None),
                ("train resnet50 on imagenet", "vision-research"),
                ("eval", "nlp"),
            )
        ]
        ended = [
            wait_for(lambda job=job: _ended(api, job["id"]), f"job {job['name']} to end")
            for job in jobs
        ]
    return {"token": token, "jobs": ended}


def _ended(api: ShamalClient, job_id: str) -> dict[str, Any] | None:
    job = api.get_job(job_id)
    return job if job["state"] in ("succeeded", "failed", "cancelled", "lost") else None


@pytest.fixture
def shamal(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> Callable[..., str]:
    monkeypatch.setenv("SHAMAL_URL", server.url)
    monkeypatch.setenv("SHAMAL_TOKEN", server.token)
    runner = CliRunner()

    def run(width: int, *args: str) -> str:
        result = runner.invoke(app, list(args), env={"COLUMNS": str(width)})
        assert result.exit_code == 0, result.output
        return result.output

    return run


def _fits_80_columns_whole(text: str) -> None:
    assert max(cell_len(line) for line in _lines(text)) <= 80, text
    assert "…" not in text, text


@pytest.mark.slow
def test_job_list_at_80_columns_shows_whole_ids_names_states_and_ages(
    shamal: Callable[..., str], listed: dict[str, Any]
) -> None:
    text = shamal(80, "job", "list")
    _fits_80_columns_whole(text)
    for ended in listed["jobs"]:
        row = _row(text, ended["id"][:12])
        assert ended["name"] in row, text
        assert ended["state"] in row, text
        assert " ago " in row or " now " in row, text
    assert not re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d", text), text  # ages, not timestamps
    assert "resources" not in text  # the least useful columns are left out


@pytest.mark.slow
def test_job_list_at_200_columns_keeps_every_column_and_full_timestamps(
    shamal: Callable[..., str], listed: dict[str, Any]
) -> None:
    text = shamal(200, "job", "list")
    header = next(line for line in text.splitlines() if "┃ id " in line)
    for column in ("name", "team", "state", "why", "priority", "resources", "attempt"):
        assert f"┃ {column} " in header, text
    for ended in listed["jobs"]:
        row = _row(text, ended["id"][:12])
        for cell in ("name", "state", "resources"):
            assert ended[cell] in row, text
        assert fmt(ended["submitted_at"]) in row, text
    assert " ago " not in text


@pytest.mark.slow
def test_job_list_json_is_the_same_at_any_width(
    shamal: Callable[..., str], listed: dict[str, Any]
) -> None:
    narrow, wide = shamal(80, "job", "list", "--json"), shamal(200, "job", "list", "--json")
    assert narrow == wide
    assert {job["id"] for job in json.loads(narrow)} == {job["id"] for job in listed["jobs"]}


@pytest.mark.slow
def test_team_list_at_80_and_200_columns(
    shamal: Callable[..., str], listed: dict[str, Any]
) -> None:
    del listed
    text = shamal(80, "team", "list")
    _fits_80_columns_whole(text)
    _row(text, "nlp")
    # The description fits whole; the creation time, which would not, is left out.
    row = _row(text, "vision-research")
    assert "Image models: detection, segmentation, and their data" in row, text
    assert "created at" not in text
    wide = shamal(200, "team", "list")
    row = _row(wide, "vision-research")
    assert "Image models: detection, segmentation, and their data" in row, wide
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", row), wide


@pytest.mark.slow
def test_token_list_at_80_and_200_columns_keeps_the_whole_id(
    shamal: Callable[..., str], listed: dict[str, Any]
) -> None:
    token = listed["token"]
    text = shamal(80, "token", "list")
    _fits_80_columns_whole(text)
    row = _row(text, token["id"])  # all 32 characters: `token revoke` takes no less
    assert "laptop-of-ana" in row, text
    wide = shamal(200, "token", "list")
    row = _row(wide, token["id"])
    assert fmt(token["expires_at"]) in row, wide
    assert "last used at" in wide


@pytest.mark.slow
def test_user_list_at_80_and_200_columns(
    shamal: Callable[..., str], listed: dict[str, Any]
) -> None:
    del listed
    text = shamal(80, "user", "list")
    _fits_80_columns_whole(text)
    assert "ana-lopez" in text
    wide = shamal(200, "user", "list")
    header = next(line for line in wide.splitlines() if "┃ name " in line)
    for column in ("kind", "is admin", "disabled", "created at"):
        assert f"┃ {column} " in header, wide


# ------------------------------------------------------- the other domains' lists, live

_MLFLOW = "/api/2.0/mlflow"
_LONG_RUN = "resnet50-lr0.{}-bs256-augmented-mixup-cutmix-label-smoothing"


@pytest.fixture(scope="module")
def tracked(server: LiveServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An experiment whose name and runs' names are longer than a narrow console's columns,
    with params and metrics; a registered model of one run; a dataset; a webhook."""
    with ShamalClient(server.url, server.token) as api:
        experiment = api.request(
            "POST", f"{_MLFLOW}/experiments/create",
            json={"name": "imagenet-resnet50-hyperparameter-sweep-with-mixup"},
        )["experiment_id"]  # fmt: skip
        runs = []
        for i in range(2):
            run = api.request(
                "POST", f"{_MLFLOW}/runs/create",
                json={"experiment_id": experiment, "run_name": _LONG_RUN.format(i)},
            )["run"]["info"]["run_id"]  # fmt: skip
            batch = {
                "run_id": run,
                "params": [{"key": "optimizer_configuration", "value": f"sgd-momentum-0.9-{i}"}],
                "metrics": [
                    {"key": key, "value": 0.5 + i / 10, "timestamp": 1, "step": 0}
                    for key in ("val_accuracy", "val_loss")
                ],
            }
            api.request("POST", f"{_MLFLOW}/runs/log-batch", json=batch)
            ended = {"run_id": run, "status": "FINISHED"}
            api.request("POST", f"{_MLFLOW}/runs/update", json=ended)
            runs.append(run)
        model = "imagenet-resnet50-classifier-for-production"
        api.request("POST", f"{_MLFLOW}/registered-models/create", json={"name": model})
        api.request(
            "POST", f"{_MLFLOW}/model-versions/create",
            json={"name": model, "source": f"runs:/{runs[0]}/model", "run_id": runs[0]},
        )  # fmt: skip
        rows = tmp_path_factory.mktemp("tables-data") / "customers.csv"
        rows.write_text("customer_id,region\n" + "".join(f"{i},r{i % 3}\n" for i in range(9)))
        dataset = "customer-transactions-europe-west"
        api.create_dataset(dataset, description="Customer transactions for the churn model")
        api.ingest_file(dataset, rows)
        api.create_webhook(
            "notify-the-model-review-channel",
            "https://hooks.example.com/services/T0000/B0000/XXXXXXXXXXXXXXXXXXXXXXXX",
            "model_version_registered",
        )
    return {"experiment": experiment, "runs": runs, "model": model, "dataset": dataset}


def _header_cells(text: str) -> list[str]:
    """A table's header, column by column, each cell's folded lines joined: what a reader
    reads down the column."""
    lines = text.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("┏"))
    end = next(i for i, line in enumerate(lines) if line.startswith("┡"))
    columns: list[str] = []
    for line in lines[top + 1 : end]:
        cells = [cell.strip() for cell in line.strip("┃").split("┃")]
        columns += [""] * (len(cells) - len(columns))
        columns = [joined + cell for joined, cell in zip(columns, cells, strict=True)]
    return columns


def _down_the_columns(text: str) -> str:
    """A table's body read down each column, folded lines joined: a name folded over two
    lines reads whole here, one cut with '…' does not."""
    columns: list[str] = []
    for line in text.splitlines():
        if line.startswith("│"):
            cells = [cell.strip() for cell in line.strip("│").split("│")]
            columns += [""] * (len(cells) - len(columns))
            columns = [joined + cell for joined, cell in zip(columns, cells, strict=True)]
    return "\n".join(columns)


@pytest.mark.slow
def test_runs_compare_at_80_columns_folds_names_instead_of_cutting_them(
    shamal: Callable[..., str], tracked: dict[str, Any]
) -> None:
    narrow = shamal(80, "runs", "compare", *tracked["runs"])
    _fits_80_columns_whole(narrow)
    header = _header_cells(narrow)
    for i, run in enumerate(tracked["runs"]):
        assert any(cell.startswith(_LONG_RUN.format(i)) and run[:12] in cell for cell in header)
    for value in ("sgd-momentum-0.9-0", "sgd-momentum-0.9-1"):
        assert value in narrow, narrow
    wide = shamal(200, "runs", "compare", *tracked["runs"])
    for i in range(2):
        assert _LONG_RUN.format(i) in wide, wide  # on one line


@pytest.mark.slow
def test_experiments_compare_at_80_columns_keeps_every_name_whole(
    shamal: Callable[..., str], tracked: dict[str, Any]
) -> None:
    narrow = shamal(80, "experiments", "compare", tracked["experiment"], "0")
    _fits_80_columns_whole(narrow)
    (named,) = [c for c in _header_cells(narrow) if c.endswith(f"id {tracked['experiment']}")]
    assert named.startswith("imagenet-resnet50-hyperparameter-sweep-with-mixup"), narrow
    wide = shamal(200, "experiments", "compare", tracked["experiment"], "0")
    assert "imagenet-resnet50-hyperparameter-sweep-with-mixup" in wide
    assert _LONG_RUN.format(1) in wide  # the best run of val_accuracy, named whole


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "essential"),
    [
        (("runs", "list", "{experiment}"), ("{run0}", "FINISHED")),
        (("models", "list"), ("{model}",)),
        (("data", "list"), ("{dataset}",)),
        (("data", "versions", "{dataset}"), ()),
        (("webhooks", "list"), ("notify-the-model-review-channel",)),
        (("events", "list"), ("model_version_registered",)),
        (("audit", "list"), ()),
    ],
)
def test_the_domains_lists_fit_80_columns_and_keep_every_column_at_200(
    shamal: Callable[..., str],
    tracked: dict[str, Any],
    command: tuple[str, ...],
    essential: tuple[str, ...],
) -> None:
    names = {"run0": tracked["runs"][0][:12], **tracked}
    args = [part.format(**names) for part in command]
    narrow, wide = shamal(80, *args), shamal(200, *args)
    _fits_80_columns_whole(narrow)
    for cell in essential:
        assert cell.format(**names) in _down_the_columns(narrow), narrow
    assert "…" not in wide, wide
    # A wide console shows at least the columns a narrow one does, and the same rows.
    header = next(line for line in narrow.splitlines() if line.startswith("┃"))
    wide_header = next(line for line in wide.splitlines() if line.startswith("┃"))
    assert {c.strip() for c in header.split("┃")} <= {c.strip() for c in wide_header.split("┃")}
    assert narrow.count("\n│ ") >= wide.count("\n│ ")


def _optimize_report() -> Any:
    from shamal.optimize import OptimizeReport, VariantReport
    from shamal.optimize._measure import Fidelity, Timing

    fidelity = Fidelity(
        "accuracy", 0.9312, 0.9301, 0.0123, 0.999, 0.998, 512, "the dataset", False, ""
    )  # fmt: skip
    variants = tuple(
        VariantReport(
            name,
            Path("/nonexistent"),
            12_345_678,
            fidelity,
            tuple(Timing(b, t, 1.25 * b * t, 800.0 * b / t) for b in (1, 8, 32) for t in (1, 4)),
            "cpu",
        )
        for name in ("original", "onnx-fp32", "openvino-int8-static-quantized")
    )
    source = "models:/resnet50-classifier/3"
    return OptimizeReport(source, "torch", "image-classification", variants)


def test_the_optimize_report_at_80_columns_is_compact_and_cuts_nothing() -> None:
    from shamal.cli.optimize import _report_tables

    report = _optimize_report()
    console = Console(width=80, record=True, color_system=None)
    console.print(*_report_tables(report, (1, 8, 32), (1, 4), 80), sep="\n")
    text = console.export_text()
    _fits_80_columns_whole(text)
    columns = _down_the_columns(text)
    words = " ".join(text.split())
    for variant in report.variants:
        assert variant.name in columns, text
        assert f"{variant.name}: OK; fidelity accuracy 0.9312 -> 0.9301" in words, text
        for timing in variant.timings:
            row = f"│ {timing.threads} │ {timing.batch} │ {timing.p50_ms:.2f} │"
            assert row in " ".join(text.replace("│", " │ ").split()), text
    wide = Console(width=200, record=True, color_system=None)
    wide.print(*_report_tables(report, (1, 8, 32), (1, 4), 200), sep="\n")
    text = wide.export_text()
    assert "…" not in text
    header = next(line for line in text.splitlines() if "┃ variant" in line)
    for column in ("b1 p50 ms", "b32 items/s", "fidelity", "verdict"):
        assert f"┃ {column} " in header, text
    row = next(line for line in text.splitlines() if line.startswith("│ openvino-int8-static"))
    for cell in ("12.3 MB", "40.00", "accuracy 0.9312"):
        assert cell in row, text
