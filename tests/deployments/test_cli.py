"""`shamal deploy` as users type it: what the CLI refuses before it asks the server."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from shamal.cli import app
from tests.cli_checks import one_clean_error


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--interval", "forever"], "--interval takes a duration such as 90s, 30min, 2h"),
        (["--interval", "5mm"], "--interval takes a duration such as 90s, 30min, 2h"),
        (["--steps", "10,x"], "--steps takes percentages such as 10,25,50,100"),
        (["--weights", "models:/m/1"], "--weights takes URI=WEIGHT,URI=WEIGHT"),
        (["--sample-rate", "nan"], "--sample-rate takes a number such as 0.5 or 2, not nan"),
        (["--slo-p99-ms", "inf"], "--slo-p99-ms takes a number such as 0.5 or 2, not inf"),
        (["--slo-error-rate", "1e309"], "--slo-error-rate takes a number such as 0.5 or 2"),
    ],
)
def test_deploy_names_the_option_whose_value_is_refused(
    offline_cli: CliRunner, options: list[str], message: str
) -> None:
    primary = [] if "--weights" in options else ["--model", "models:/m/1"]
    result = offline_cli.invoke(app, ["deploy", "d", *primary, *options])
    one_clean_error(result, message)
