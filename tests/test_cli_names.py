"""Names users chose are printed with control and escape characters neutralized: an ESC
sequence, a carriage return or a bidi override in an experiment, run, job or model name
prints as its escape (``\\x1b``), never reaching the terminal, in tables and in messages."""

from __future__ import annotations

import pytest
import typer
from rich.console import Console

from shamal.cli import _common, job
from shamal.errors import NotFound

HOSTILE = "evil\x1b[2J\x1b]0;pwned\x07\rname\u202egpj.exe\u200b"
SHOWN = "evil\\x1b[2J\\x1b]0;pwned\\x07\\x0dname\\u202egpj.exe\\u200b"
RAW = ("\x1b", "\r", "\x07", "\u202e", "\u200b")


@pytest.fixture
def screen(monkeypatch: pytest.MonkeyPatch) -> Console:
    console = Console(width=200, record=True, color_system=None)
    for module in (_common, job):
        monkeypatch.setattr(module, "console", console)
    monkeypatch.setattr(_common, "err_console", console)
    return console


def _shows_no_raw_control(text: str) -> None:
    for ch in RAW:
        assert ch not in text, f"{ch!r} reached the terminal"


def test_a_table_shows_a_hostile_name_as_escapes(screen: Console) -> None:
    rows = [{"name": HOSTILE, "owner": "ana\u2066x\u2069", "created_at": "nope\x1b"}]
    _common.print_table("Experiments", ["name", "owner", "created_at"], rows)
    text = screen.export_text()
    _shows_no_raw_control(text)
    assert SHOWN in text
    assert "ana\\u2066x\\u2069" in text


def test_job_list_shows_a_hostile_job_name_as_escapes(screen: Console) -> None:
    jobs = [
        {
            "id": "0123456789abcdef0123456789abcdef",
            "name": HOSTILE,
            "team": "vision",
            "state": "queued",
            "waiting": None,
            "reason": "submitted\x1b[1m",
            "priority": "normal",
            "resources": "1 CPU",
            "attempt": 0,
            "submitted_at": "2026-11-22T02:30:00+00:00",
            "preemptions": 0,
        }
    ]
    job._print_jobs(jobs, "Jobs")
    text = screen.export_text()
    _shows_no_raw_control(text)
    assert "evil\\x1b" in text


def test_an_error_quoting_a_hostile_name_is_neutralized(screen: Console) -> None:
    @_common.handle_errors
    def fails() -> None:
        raise NotFound(f"experiment {HOSTILE!s} does not exist")

    with pytest.raises(typer.Exit):
        fails()
    text = screen.export_text()
    _shows_no_raw_control(text)
    assert f"experiment {SHOWN} does not exist" in text


def test_plain_names_are_unchanged() -> None:
    for name in ("resnet50-lr0.1", "résumé 日本語 модель", "a[b]c", "tab\tname"[:3]):
        assert _common.safe_text(name) == name
