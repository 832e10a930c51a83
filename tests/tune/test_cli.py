"""`shamal tune` as users type it: what the CLI refuses before it asks the server."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from shamal.cli import app


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    # Nothing listens here: every refusal below must come before a request.
    monkeypatch.setenv("SHAMAL_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("SHAMAL_TOKEN", "not-used")
    monkeypatch.setenv("COLUMNS", "200")
    return CliRunner()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--time-limit", "forever"], "--time-limit takes a duration such as 90s, 30min, 2h"),
        (["--time-limit", "1h30"], "--time-limit takes a duration such as 90s, 30min, 2h"),
        (["--memory", "lots"], "--memory takes sizes such as 4GiB"),
        (["--memory", "0"], "--memory must be at least 1MiB"),
        (["--cpus", "nan"], "--cpus takes a number such as 0.5 or 2, not nan"),
        (["--poll", "inf"], "--poll takes a number such as 0.5 or 2, not inf"),
    ],
)
def test_tune_names_the_option_whose_value_is_refused(
    cli: CliRunner, options: list[str], message: str
) -> None:
    result = cli.invoke(app, ["tune", "--study", "s", *options, "--", "true"])
    assert result.exit_code == 1, result.output
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
