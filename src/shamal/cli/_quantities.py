"""Sizes and durations as people type them on the command line (``4GiB``, ``512Mi``,
``1h30m``, ``7d``), read into the numbers the API takes, and what to say when they are not.

Every error names the flag the value came from, so the user knows which option to correct.
"""

from __future__ import annotations

import math
import re

from shamal.errors import InvalidParameter
from shamal.jobs import MAX_MEMORY_MIB

__all__ = [
    "DURATION_EXAMPLES",
    "MAX_DURATION_S",
    "MEMORY_HELP",
    "parse_duration_s",
    "parse_memory_mib",
    "require_finite",
    "shown",
]

_BINARY = {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_MEMORY = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(?:([kmgt]i?)b?|b)?\s*", re.IGNORECASE)
MEMORY_HELP = (
    "Memory per worker: 4Gi or 4GiB (binary), 4G or 4GB (decimal, 4*10^9 bytes), "
    "512Mi; a bare number is MiB."
)

_SECONDS_PER = {
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600),
    **dict.fromkeys(("d", "day", "days"), 86400),
    **dict.fromkeys(("w", "week", "weeks"), 7 * 86400),
}
_DURATION_PART = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-z]+)\s*")
DURATION_EXAMPLES = "90s, 30min, 2h, 1h30m or 7d (a bare number is seconds)"
MAX_DURATION_S = 100 * 365 * 86400
"""Longer than any duration a command takes (each then checks its own limit): beyond it,
a duration is refused here, before it overflows a float or a date."""


def shown(text: str, limit: int = 40) -> str:
    """A value the user typed, quoted for an error message: escapes visible, cut short."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


def require_finite(numbers: dict[str, float | None]) -> None:
    """Refuse NaN and the infinities, naming the flag: typer reads ``nan``, ``inf`` and
    ``1e309`` as floats, and no option means any of them.

    Args:
        numbers: each flag (``--cpus``) with the value given; None (not given) passes.

    Raises:
        InvalidParameter: the first flag whose value is not a finite number.
    """
    for flag, value in numbers.items():
        if value is not None and not math.isfinite(value):
            raise InvalidParameter(f"{flag} takes a number such as 0.5 or 2, not {value!r}")


def parse_memory_mib(text: str, option: str) -> int:
    """A memory size -> whole MiB (rounded up): '4GiB', '4Gi', '512Mi', '4G' and '4GB'
    (decimal), '1536' (MiB). Units are case-insensitive.

    Args:
        text: what the user typed.
        option: the flag it came from (``--memory``), named in every error so the user
            knows which option to correct.

    Raises:
        InvalidParameter: not a size, or less than 1 MiB.
    """
    match = _MEMORY.fullmatch(text)
    if not match:
        raise InvalidParameter(
            f"{option} takes sizes such as 4GiB, 4Gi, 512Mi or 4G (decimal), not {shown(text)}"
        )
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    if match.group(2) is None and not text.strip().lower().endswith("b"):
        mib = number  # a bare number is MiB
    elif match.group(2) is None:
        mib = number / 2**20  # bytes
    else:
        mib = number * (_BINARY.get(unit) or _DECIMAL[unit]) / 2**20
    if mib <= 0:
        raise InvalidParameter(f"{option} must be at least 1MiB, not {shown(text)}")
    if not mib <= MAX_MEMORY_MIB:
        raise InvalidParameter(f"{option} may be at most 16TiB, not {shown(text)}")
    return math.ceil(mib - 1e-9)


def parse_duration_s(text: str, option: str) -> float:
    """'90s', '30min', '2h', '2 H', '1h30m', '7d' or plain seconds -> seconds.

    Args:
        text: what the user typed.
        option: the flag it came from (``--time-limit``, ``--interval``), named in every
            error so the user knows which option to correct.

    Raises:
        InvalidParameter: anything else (the message gives examples), or more than
            :data:`MAX_DURATION_S`.
    """
    cleaned = text.strip().lower()
    if re.fullmatch(r"[0-9]+(\.[0-9]+)?", cleaned):
        return _bounded(float(cleaned), text, option)
    total, position = 0.0, 0
    for part in _DURATION_PART.finditer(cleaned):
        if part.start() != position or part.group(2) not in _SECONDS_PER:
            position = -1
            break
        total += float(part.group(1)) * _SECONDS_PER[part.group(2)]
        position = part.end()
    if 0 < position == len(cleaned):
        return _bounded(total, text, option)
    raise InvalidParameter(
        f"{option} takes a duration such as {DURATION_EXAMPLES}, not {shown(text)}"
    )


def _bounded(seconds: float, text: str, option: str) -> float:
    if not seconds <= MAX_DURATION_S:  # also NaN and infinity, from hundreds of digits
        raise InvalidParameter(f"{option} takes a duration of at most 100 years, not {shown(text)}")
    return seconds
