"""What every CLI command shares: the client, Rich output and one error path."""

from __future__ import annotations

import functools
import json
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape as escape_markup
from rich.table import Table
from typer.core import TyperGroup, TyperOption

from shamal.client import ShamalClient
from shamal.errors import ServiceUnavailable, ShamalError, Unauthenticated

if TYPE_CHECKING:
    from typer._click import Command, Context, Parameter  # the click typer vendors

console = Console()
err_console = Console(stderr=True)

P = ParamSpec("P")
R = TypeVar("R")

_HINTS: dict[type[ShamalError], str] = {
    Unauthenticated: "set SHAMAL_TOKEN (the admin token of a local server is in ~/.shamal/token)",
    ServiceUnavailable: "start the server with `shamal server`, or point SHAMAL_URL at it",
}


_open_clients: list[ShamalClient] = []

# Control characters (ESC, CR, BEL...), format characters (bidi overrides and isolates,
# zero-width joiners), line and paragraph separators and lone surrogates: a name holding one
# could rewrite the terminal, hide text, or show another name. Shown as escapes instead.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def _escaped(ch: str) -> str:
    code = ord(ch)
    return (
        f"\\x{code:02x}"
        if code < 0x100
        else f"\\u{code:04x}"
        if code < 0x10000
        else f"\\U{code:08x}"
    )


def safe_text(text: str) -> str:
    """``text`` with every control, format or invisible character written as its escape
    (``\\x1b``, ``\\u202e``), so a name that holds one prints as plain, harmless text."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(
        _escaped(ch) if unicodedata.category(ch) in _UNSAFE_CATEGORIES else ch for ch in text
    )


def escape(text: str) -> str:
    """``text`` ready to go inside Rich markup: control characters neutralized
    (:func:`safe_text`) and markup escaped. Every name a user chose goes through this."""
    return escape_markup(safe_text(text))


def _untyped_flags(params: Iterable[Parameter]) -> None:
    """Give flags an empty metavar: typer's Rich help prints a type for every option
    (``--json <bool>``, ``--help <bool>``), though a flag takes no value."""
    for param in params:
        if isinstance(param, TyperOption) and (param.is_flag or param.count):
            param.metavar = ""


def _untype_command(command: Command, ctx: Context) -> None:
    _untyped_flags([*command.params, *filter(None, [command.get_help_option(ctx)])])
    if isinstance(command, TyperGroup):
        for sub in command.commands.values():
            _untype_command(sub, ctx)


class ShamalGroup(TyperGroup):
    """The root command group: its help, and that of every command under it, shows no
    value type for flags."""

    def get_params(self, ctx: Context) -> list[Parameter]:
        params = super().get_params(ctx)
        _untyped_flags(params)
        return params

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            _untype_command(command, ctx)
        return command


def client() -> ShamalClient:
    """A client for the current command; closed by :func:`handle_errors` when it returns."""
    opened = ShamalClient()
    _open_clients.append(opened)
    return opened


SETTINGS_HINT = (
    "settings come from SHAMAL_* environment variables and command options; the README's "
    "'Running it for a team' lists them"
)


def explain_invalid(exc: ValidationError) -> str:
    """A pydantic error in one line, naming each field (as its ``SHAMAL_*`` variable for the
    platform's settings) but never echoing the value given, which may be a secret."""
    settings = exc.title == "Settings"
    said = []
    for error in exc.errors()[:5]:
        path = [str(part) for part in error["loc"]]
        name = "SHAMAL_" + "__".join(path).upper() if settings else ".".join(path)
        said.append(f"{name}: {error['msg']}")
    more = f" (and {exc.error_count() - 5} more)" if exc.error_count() > 5 else ""
    what = "invalid settings" if settings else "invalid input"
    return f"{what}: {'; '.join(said)}{more}"


def handle_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn Shamal errors (and invalid settings) into a one-line message, a hint and exit 1."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except ValidationError as exc:
            err_console.print(f"[bold red]error:[/] {escape(explain_invalid(exc))}")
            if exc.title == "Settings":
                err_console.print(f"[yellow]hint:[/] {SETTINGS_HINT}")
            raise typer.Exit(1) from None
        except ShamalError as exc:
            # Messages quote names users chose: never read as markup.
            err_console.print(f"[bold red]error:[/] {escape(exc.message)} [dim]({exc.code})[/]")
            for cls, hint in _HINTS.items():
                if isinstance(exc, cls):
                    err_console.print(f"[yellow]hint:[/] {hint}")
            raise typer.Exit(1) from None
        finally:
            while _open_clients:
                _open_clients.pop().close()

    return wrapper


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str) and len(value) > 19 and value[10:11] == "T":
        try:
            return datetime.fromisoformat(value).strftime("%Y-%m-%d %H:%M:%S")
        except ValueError:
            return safe_text(value)
    return safe_text(str(value))


def add_column(table: Table, name: str, cells: Iterable[str]) -> None:
    """Add the column ``name`` (underscores shown as spaces). An id column (``id``,
    ``*_id``) is never wrapped or cut in a narrow terminal: ids are copied back into
    commands, and ``5f5e5…`` cannot be."""
    header = name.replace("_", " ")
    if name == "id" or name.endswith("_id"):
        widest = max((len(cell) for cell in cells), default=0)
        table.add_column(header, no_wrap=True, min_width=max(widest, len(header)))
    else:
        table.add_column(header)


def print_table(
    title: str, columns: Sequence[str], rows: Iterable[dict[str, Any]], *, as_json: bool = False
) -> None:
    """Rows as a Rich table, or as JSON for scripts."""
    materialized = list(rows)
    if as_json:
        console.print_json(json.dumps(materialized))
        return
    table = Table(title=title, title_justify="left", header_style="bold")
    cells = [[fmt(row.get(c)) for c in columns] for row in materialized]
    for index, column in enumerate(columns):
        add_column(table, column, (row[index] for row in cells))
    for row in cells:
        table.add_row(*(escape(cell) for cell in row))
    if not materialized:
        console.print(f"[dim]{title}: none[/]")
        return
    console.print(table)


JsonOption = typer.Option(False, "--json", help="Print JSON instead of a table.")
