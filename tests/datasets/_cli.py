"""The `shamal` CLI run in-process against a live server, as the datasets' CLI tests use it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from typer.testing import CliRunner

from shamal.cli import app
from tests.live import LiveServer

#: Runs ``shamal ARGS...``; answers its exit code and its output.
Shamal = Callable[..., tuple[int, str]]


def cli_against(server: LiveServer, monkeypatch: pytest.MonkeyPatch, columns: int = 160) -> Shamal:
    """``shamal`` pointed at ``server`` with its admin token, in a terminal ``columns`` wide."""
    monkeypatch.setenv("SHAMAL_URL", server.url)
    monkeypatch.setenv("SHAMAL_TOKEN", server.token)
    runner = CliRunner()

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, list(args), env={"COLUMNS": str(columns)})
        return result.exit_code, result.output

    return run
