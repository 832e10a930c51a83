"""What every CLI command shares: the client, Rich output and one error path."""

from __future__ import annotations

import functools
import json
import unicodedata
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import typer
from pydantic import ValidationError
from rich.cells import cell_len
from rich.console import Console, JustifyMethod
from rich.markup import escape as escape_markup
from rich.table import Table
from typer.core import TyperGroup, TyperOption

from shamal.cli._tables import (
    WIDE,
    compact_columns,
    is_folded,
    is_identifier,
    is_state,
    relative_time,
    table_width,
    timestamp_of,
)
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
    """A value as a table cell: ``-`` for None, yes/no, timestamps to the second (their zone
    left out), and any other text with its control characters escaped (:func:`safe_text`)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    when = timestamp_of(value)
    if when is not None:
        return when.strftime("%Y-%m-%d %H:%M:%S")
    return safe_text(str(value))


def _compact_cell(value: Any, now: datetime) -> str:
    """A cell of the compact layout: a timestamp as its age, anything else as :func:`fmt`."""
    when = timestamp_of(value)
    return fmt(value) if when is None else relative_time(when, now)


def _header(column: str) -> str:
    return column.replace("_", " ")


def _column_widths(columns: Sequence[str], cells: list[list[str]]) -> dict[str, int]:
    """The widest cell of each column, its header included."""
    return {
        column: max([cell_len(_header(column)), *(cell_len(row[i]) for row in cells)])
        for i, column in enumerate(columns)
    }


def add_column(
    table: Table,
    name: str,
    cells: Iterable[str],
    *,
    position: int = 1,
    right: bool = False,
    compact: bool = False,
) -> None:
    """Add the column ``name`` (underscores shown as spaces). An id or state column is never
    wrapped or cut in a narrow terminal (ids are copied back into commands, and ``5f5e5…``
    cannot be); the other essential columns (the first, names: :func:`is_folded`) wrap,
    folding a word longer than the column, but are never cut. In a compact layout only
    those wrap: the others were chosen because they fit."""
    header = _header(name)
    shown = escape(header)  # headers are read as markup; some (metric keys) users chose
    justify: JustifyMethod = "right" if right else "left"
    if is_folded(name, position):
        table.add_column(shown, justify=justify, overflow="fold")
    elif compact or is_identifier(name) or is_state(name):
        widest = max((cell_len(cell) for cell in cells), default=0)
        table.add_column(
            shown, justify=justify, no_wrap=True, min_width=max(widest, cell_len(header))
        )
    else:
        table.add_column(shown, justify=justify)


def _layout(
    columns: Sequence[str], values: list[list[Any]], rank: Sequence[str], now: datetime | None
) -> tuple[list[str], list[list[str]], bool]:
    """The columns a table shows in this console, the cells of every column, and whether
    the layout is the compact one (:mod:`shamal.cli._tables`)."""
    cells = [[fmt(value) for value in row] for row in values]
    room = console.width
    if room >= WIDE or table_width(_column_widths(columns, cells).values()) <= room:
        return list(columns), cells, False
    moment = now or datetime.now(UTC)
    cells = [[_compact_cell(value, moment) for value in row] for row in values]
    return compact_columns(columns, _column_widths(columns, cells), rank, room), cells, True


def list_table(
    title: str,
    columns: Sequence[str],
    rows: Iterable[Mapping[str, Any]],
    *,
    rank: Sequence[str] = (),
    right: Collection[str] = (),
    now: datetime | None = None,
) -> Table:
    """Rows as a Rich table that fits the console (see :mod:`shamal.cli._tables`): the full
    layout in a wide console or when it fits whole, else the compact one.

    Args:
        columns: the keys of ``rows`` to show, in order (headers show ``_`` as spaces).
        rank: the columns a narrow console shows first after the essential ones; the
            others follow in order while they fit.
        right: the columns aligned right (numbers).
        now: the moment ages are counted to in the compact layout (default: now).
    """
    values = [[row.get(c) for c in columns] for row in rows]
    shown, cells, compact = _layout(columns, values, rank, now)
    table = Table(title=title, title_justify="left", header_style="bold")
    kept = [columns.index(column) for column in shown]
    for position, index in enumerate(kept):
        column = columns[index]
        add_column(
            table,
            column,
            (row[index] for row in cells),
            position=position,
            right=column in right,
            compact=compact,
        )
    for row in cells:
        table.add_row(*(escape(row[index]) for index in kept))
    return table


def print_table(
    title: str,
    columns: Sequence[str],
    rows: Iterable[dict[str, Any]],
    *,
    as_json: bool = False,
    rank: Sequence[str] = (),
    right: Collection[str] = (),
    now: datetime | None = None,
) -> None:
    """Rows as a table that fits the console (:func:`list_table`), or as JSON for scripts:
    the rows as given, whatever the console's width."""
    materialized = list(rows)
    if as_json:
        console.print_json(json.dumps(materialized))
        return
    if not materialized:
        console.print(f"[dim]{title}: none[/]")
        return
    console.print(list_table(title, columns, materialized, rank=rank, right=right, now=now))


JsonOption = typer.Option(False, "--json", help="Print JSON instead of a table.")
