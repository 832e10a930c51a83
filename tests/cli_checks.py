"""What every CLI refusal must look like, for tests that run commands as users type them."""

from __future__ import annotations

from typer.testing import Result


def one_clean_error(result: Result, message: str) -> None:
    """One error line that says what to do (``message``, however Rich wrapped it): exit 1,
    no traceback."""
    assert result.exit_code == 1, result.output
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
