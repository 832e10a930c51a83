"""`shamal tune` as users type it: what the CLI refuses before it asks the server."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from shamal.cli import app
from tests.cli_checks import one_clean_error


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
    offline_cli: CliRunner, options: list[str], message: str
) -> None:
    result = offline_cli.invoke(app, ["tune", "--study", "s", *options, "--", "true"])
    one_clean_error(result, message)
