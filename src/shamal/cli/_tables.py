"""How a list fits the console: every column when there is room, the most useful ones when
there is not.

A table keeps its full layout (today's columns, timestamps to the second) in a console of
:data:`WIDE` columns or more, and in a narrower one when it fits whole. Otherwise it is laid
out compact: timestamps read as ages ("3m ago", "in 5d") and columns are left out, least
useful first, until the rest fit. Essential columns (:func:`is_essential`: the first, ids,
names and states) are always shown, and never cut with '…': an id is copied back into
commands, and a state is what a list is read for.

Everything here is pure: the caller measures nothing but the console's width and passes
the time it calls now.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

__all__ = [
    "NAME_WIDTH",
    "WIDE",
    "compact_columns",
    "is_essential",
    "is_folded",
    "is_identifier",
    "is_state",
    "relative_time",
    "table_width",
    "timestamp_of",
]

WIDE: Final = 120
"""Consoles at least this wide show every table in its full layout."""

NAME_WIDTH: Final = 30
"""The most a wrapping column (a name, the first column) counts for when a compact layout
chooses its columns: a longer name wraps rather than leave out every other column."""

_STATES: Final = frozenset({"state", "status", "phase"})
_UNITS: Final = (("y", 365 * 86400), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def timestamp_of(value: Any) -> datetime | None:
    """The time an API value holds when it is an ISO 8601 timestamp (``2026-11-22T02:30:00``
    and longer, as the API writes them), else None. A time without a zone is UTC."""
    if not (isinstance(value, str) and len(value) > 19 and value[10:11] == "T"):
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def relative_time(when: datetime, now: datetime) -> str:
    """How long before (``3m ago``) or after (``in 5d``) ``now`` a moment is, in its largest
    whole unit: seconds, minutes, hours, days or years (of 365 days); ``now`` under a second.
    """
    seconds = (now - when).total_seconds()
    span = abs(seconds)
    if span < 1:
        return "now"
    unit, size = next((unit, size) for unit, size in _UNITS if span >= size)
    amount = f"{int(span // size)}{unit}"
    return f"{amount} ago" if seconds > 0 else f"in {amount}"


def is_identifier(column: str) -> bool:
    """``id`` or ``*_id``: cells copied back into commands, never wrapped or cut."""
    return column == "id" or column.endswith("_id")


def is_state(column: str) -> bool:
    """A state, status or phase: one word, never wrapped or cut."""
    return column in _STATES


def is_essential(column: str, position: int) -> bool:
    """Whether every layout shows ``column``: the first column (what each row is), ids,
    names (``name``, ``*_name``) and states."""
    return (
        position == 0
        or is_identifier(column)
        or is_state(column)
        or column == "name"
        or column.endswith("_name")
    )


def is_folded(column: str, position: int) -> bool:
    """An essential column that wraps (a name, the first column), folding a word longer than
    the column rather than cutting it; the other essential columns never wrap."""
    return is_essential(column, position) and not (is_identifier(column) or is_state(column))


def table_width(widths: Iterable[int]) -> int:
    """The width of a table whose columns are ``widths`` wide: a space either side of each
    cell and a rule between and around them (Rich's default box and padding)."""
    sizes = list(widths)
    return sum(sizes) + 3 * len(sizes) + 1


def compact_columns(
    columns: Sequence[str], widths: Mapping[str, int], rank: Sequence[str], room: int
) -> list[str]:
    """The columns of a compact layout, in their order: the essential ones, then the others,
    most useful first (``rank``, then the rest in order), each one that still fits in
    ``room`` with those already chosen. A folded column (:func:`is_folded`) counts for
    :data:`NAME_WIDTH` at most: it wraps to leave the others their width.

    Args:
        columns: every column, in the order the table shows them.
        widths: the widest cell (or the header) of each column, as the compact layout
            writes them.
        rank: the columns worth showing first when there is no room for all.
        room: the console's width.
    """

    def room_for(column: str) -> int:
        folded = is_folded(column, columns.index(column))
        return min(widths[column], NAME_WIDTH) if folded else widths[column]

    chosen = {c for position, c in enumerate(columns) if is_essential(c, position)}
    used = table_width(room_for(c) for c in chosen)
    for column in dict.fromkeys([*rank, *columns]):
        if column not in chosen and used + room_for(column) + 3 <= room:
            chosen.add(column)
            used += room_for(column) + 3
    return [c for c in columns if c in chosen]
