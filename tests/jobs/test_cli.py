"""`shamal job` and `shamal cost` as users type them: what the CLI refuses before it asks
the server, how it reads sizes and durations, and what its help shows."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from shamal.cli import app
from shamal.cli.job import parse_duration_s, parse_memory_mib
from shamal.client import ShamalClient
from shamal.errors import InvalidParameter
from shamal.jobs._rules import duration_text
from shamal.scheduler.core import (
    DEFAULT_POLICY,
    get_policy,
    policy_defaults,
    policy_names,
    policy_options,
)
from tests.cli_checks import one_clean_error


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        ("4GiB", 4096),
        ("4Gi", 4096),
        ("4 gib", 4096),
        ("512Mi", 512),
        ("512MiB", 512),
        ("1.5GiB", 1536),
        ("4G", 3815),  # decimal: 4 * 10^9 bytes, rounded up to whole MiB
        ("4GB", 3815),
        ("1536", 1536),  # a bare number is MiB
        ("100Ki", 1),
    ],
)
def test_memory_sizes_binary_decimal_and_bare(text: str, mib: int) -> None:
    assert parse_memory_mib(text, "--memory") == mib


@pytest.mark.parametrize("text", ["0", "0GiB", "0.0Mi", "lots", "-1", "4Gx", ""])
def test_memory_sizes_that_are_refused(text: str) -> None:
    with pytest.raises(InvalidParameter, match="--memory"):
        parse_memory_mib(text, "--memory")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("2h", 7200),
        ("2H", 7200),
        ("2 h", 7200),
        ("2 hours", 7200),
        ("30min", 1800),
        ("90s", 90),
        ("1h30m", 5400),
        ("1h 30m", 5400),
        ("7d", 7 * 86400),
        ("45", 45),
    ],
)
def test_durations_in_the_forms_people_write(text: str, seconds: float) -> None:
    assert parse_duration_s(text, "--time-limit") == seconds


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (45, "45s"),
        (90, "1m30s"),
        (600, "10m"),
        (5400, "1h30m"),
        (7200, "2h"),
        (7 * 86400 + 1, "7d1s"),
    ],
)
def test_durations_print_as_time_limit_takes_them(seconds: float, text: str) -> None:
    assert duration_text(seconds) == text
    assert parse_duration_s(text, "--time-limit") == seconds


@pytest.mark.parametrize("text", ["forever", "", "h", "1h30", "2hh", "1x", "2h-"])
def test_garbage_durations_are_refused_with_examples(text: str) -> None:
    with pytest.raises(InvalidParameter, match=r"--time-limit takes a duration such as 90s"):
        parse_duration_s(text, "--time-limit")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--memory", "0"], "--memory must be at least 1MiB"),
        (["--memory", "lots"], "--memory takes sizes such as 4GiB"),
        (["--time-limit", "forever"], "--time-limit takes a duration such as 90s, 30min, 2h"),
        (["--mig", "big"], "a MIG profile is written like 1g.10gb or 3g.40gb"),
        (["--env", "SHAMAL_X=1"], "starting with SHAMAL_, and MLFLOW_TRACKING_TOKEN"),
        (["--env", "CUDA_VISIBLE_DEVICES=0"], "are set by the platform and cannot be"),
        (["--env", "1BAD=x"], "is not an environment variable name"),
        (["--env", "NOVALUE"], "--env takes KEY=VALUE"),
        (["--workdir", "/nonexistent"], "--workdir /nonexistent is not a folder"),
        (["--executor", "slurm"], "--executor: Input should be 'local' or 'ray'"),
    ],
)
def test_submit_refuses_bad_options_with_a_clear_message(
    offline_cli: CliRunner, options: list[str], message: str
) -> None:
    result = offline_cli.invoke(app, ["job", "submit", *options, "--", "true"])
    one_clean_error(result, message)


def test_cost_report_since_names_both_accepted_forms(offline_cli: CliRunner) -> None:
    result = offline_cli.invoke(app, ["cost", "report", "--since", "forever"])
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    assert "--since takes a duration such as 7d" in text
    assert "or an ISO date such as 2026-01-31" in text


def test_the_sdk_refuses_a_missing_folder_as_an_invalid_parameter(tmp_path: Path) -> None:
    with (
        ShamalClient("http://127.0.0.1:9", "t") as api,
        pytest.raises(InvalidParameter, match="is not a folder"),
    ):
        api.upload_snapshot(tmp_path / "missing")


@pytest.mark.parametrize("number", [float("nan"), float("inf"), -float("inf")])
def test_the_sdk_refuses_a_number_json_cannot_carry_before_sending(number: float) -> None:
    # Nothing listens at port 9: the refusal must come before any connection is tried.
    with (
        ShamalClient("http://127.0.0.1:9", "t") as api,
        pytest.raises(InvalidParameter, match="NaN or infinite"),
    ):
        api.submit_job(["true"], cpus=number)


@pytest.mark.parametrize(
    "command",
    [[], ["job"], ["job", "submit"], ["cost", "report"], ["job", "list"], ["tune"], ["db"]],
)
def test_help_shows_no_value_type_for_flags(offline_cli: CliRunner, command: list[str]) -> None:
    result = offline_cli.invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "--help" in result.output
    assert "<bool>" not in result.output


def test_help_still_shows_the_types_of_options_that_take_values(offline_cli: CliRunner) -> None:
    result = offline_cli.invoke(app, ["job", "submit", "--help"])
    lines = {line.split()[1]: line for line in result.output.splitlines() if "--" in line[:6]}
    assert "<float>" in lines["--cpus"]
    assert "<str>" in lines["--memory"]
    assert "4Gi or 4GiB (binary), 4G or 4GB (decimal" in result.output
    assert "<bool>" not in lines["--no-snapshot"]


@pytest.mark.parametrize(
    ("since", "message"),
    [
        ("99999999999999999999d", "--since takes a duration such as 7d, 24h or 90min"),
        ("9" * 400, "--since takes a duration such as 7d, 24h or 90min"),
        ("9999-12-31", "--since '9999-12-31' is in the future: give a past date"),
        ("7d\x1b[2J", "not '7d\\x1b[2J'"),
        ("x" * 5000, "... (5000 characters)"),
    ],
)
def test_cost_report_refuses_hostile_since_values_cleanly(
    offline_cli: CliRunner, since: str, message: str
) -> None:
    one_clean_error(
        offline_cli.invoke(app, ["cost", "report", "--since", since, "--no-csv"]), message
    )


@pytest.mark.parametrize(
    ("where", "message"),
    [("missing/cost.csv", "its folder does not exist"), (".", "it is a folder")],
)
def test_cost_report_refuses_a_csv_path_it_cannot_write_before_asking(
    offline_cli: CliRunner, tmp_path: Path, where: str, message: str
) -> None:
    result = offline_cli.invoke(app, ["cost", "report", "--csv", str(tmp_path / where)])
    one_clean_error(result, message)
    assert "name a file in a folder that exists, or give --no-csv" in " ".join(
        result.output.split()
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--time-limit", "9" * 400], "--time-limit takes a duration of at most 100 years"),
        (["--time-limit", "99999999999999999999d"], "--time-limit takes a duration of at most"),
        (["--memory", "99999999999999999999999GiB"], "--memory may be at most 16TiB"),
        (["--memory", "x" * 5000], "... (5000 characters)"),
    ],
)
def test_submit_refuses_sizes_and_durations_too_large_to_mean_anything(
    offline_cli: CliRunner, options: list[str], message: str
) -> None:
    one_clean_error(offline_cli.invoke(app, ["job", "submit", *options, "--", "true"]), message)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--cpus", "nan"], "--cpus takes a number such as 0.5 or 2, not nan"),
        (["--cpus", "inf"], "--cpus takes a number such as 0.5 or 2, not inf"),
        (["--cpus", "1e309"], "--cpus takes a number such as 0.5 or 2, not inf"),
        (["--gpu-fraction", "nan"], "--gpu-fraction takes a number such as 0.5 or 2"),
        (["--cpus", "-1"], "--cpus: Input should be greater than 0"),
        (["--gpus", "99999999999999999999"], "--gpus: Input should be less than or equal to 64"),
        (["--workers", "0"], "--workers: Input should be greater than or equal to 1"),
        (["--time-limit", "31d"], "--time-limit: Input should be less than or equal to 2592000"),
        (["--retries", "-1"], "--retries: Input should be greater than or equal to 0"),
        (["--name", "x" * 5000], "--name: String should have at most"),
        (["--team", "t" * 65], "--team: String should have at most 64 characters"),
    ],
)
def test_submit_checks_the_request_before_uploading_and_names_the_flag(
    offline_cli: CliRunner, options: list[str], message: str
) -> None:
    # The server is unreachable: an error about it would mean the check came too late.
    one_clean_error(offline_cli.invoke(app, ["job", "submit", *options, "--", "true"]), message)


@pytest.mark.parametrize("command", ["show", "logs", "cancel", "preempt"])
@pytest.mark.parametrize(
    "job_id",
    ["", "abc", "../../etc/passwd", "%2e%2e%2fabcdef", "abcdef;id", "[red]abcdef", "a" * 5000,
     "abcdef\x00", "\uff41\uff42\uff43\uff44\uff45\uff46"],
)  # fmt: skip
def test_job_ids_that_cannot_be_one_are_refused_before_any_request(
    offline_cli: CliRunner, command: str, job_id: str
) -> None:
    result = offline_cli.invoke(app, ["job", command, job_id])
    one_clean_error(result, "a job id is 6 to 32 hexadecimal digits, as `shamal job list` shows")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--state", "bogus"], "--state takes one of queued, admitted, running, succeeded"),
        (["--state", "running", "--state", "[red]x"], "not '[red]x'"),
        (["--state", ""], "--state takes one of"),
        (["--team", "t" * 65], "--team takes a name of 1 to 64 characters"),
        (["--team", ""], "--team takes a name of 1 to 64 characters"),
        (["--user", "u" * 257], "--user takes a name of 1 to 256 characters"),
    ],
)
def test_job_list_names_the_flag_of_a_filter_it_refuses_before_any_request(
    offline_cli: CliRunner, options: list[str], message: str
) -> None:
    result = offline_cli.invoke(app, ["job", "list", *options])
    one_clean_error(result, message)


def test_scheduler_policies_lists_each_policys_options_and_their_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What SHAMAL_SCHEDULER__POLICY_OPTIONS takes, read off the policies themselves."""
    monkeypatch.setenv("COLUMNS", "250")
    result = CliRunner().invoke(app, ["scheduler", "policies"])
    assert result.exit_code == 0, result.output
    rows = {
        cells[0]: cells
        for line in result.stdout.splitlines()
        if len(cells := [c.strip() for c in line.strip().strip("│").split("│")]) == 3
    }
    for name in policy_names():
        defaults = policy_defaults(name)
        assert list(defaults) == policy_options(name)
        assert get_policy(name).min_run_s == defaults["min_run_s"]
        label = f"{name} (default)" if name == DEFAULT_POLICY else name
        assert f"min_run_s={defaults['min_run_s']:g}" in rows[label][2]
        assert rows[label][1]  # what it does
    assert "SHAMAL_SCHEDULER__POLICY_OPTIONS" in " ".join(result.stdout.split())
