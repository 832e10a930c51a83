"""Cron schedules: parsing five-field expressions and finding their firings in a time zone.

Pure: the standard library only (``datetime``, ``zoneinfo``), no database or web imports.

A schedule names local wall times in its time zone (``0 9 * * MON-FRI`` is nine o'clock on
weekdays wherever the zone's clocks say so). Two days a year in zones with daylight saving a
wall time is not one instant, and the rules here are:

- a wall time that a DST gap skips (02:30 in Berlin on the last Sunday of March) fires at the
  first instant after the gap (03:00 local there); several skipped wall times of one gap fire
  once, together, at that instant;
- a wall time that happens twice (01:30 in New York on the first Sunday of November) fires once,
  on its first occurrence; during the repeated hour nothing fires a second time.

Every firing is returned as an aware datetime in UTC. Firings are found by skipping through the
fields (month, then day, then hour, then minute), never by walking minute by minute, so a
yearly schedule's next firing costs microseconds.
"""

from __future__ import annotations

import calendar
import logging
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from shamal.errors import InvalidParameter

logger = logging.getLogger(__name__)

CatchUp = Literal["all", "latest", "none"]
"""What a scheduler does with ticks it missed: see :func:`due_ticks`."""

ON_TIME = timedelta(minutes=1)
"""A tick is on time while it is at most this old: a scheduler polls at least once a minute."""

MAX_EXPRESSION_CHARS = 200
_MAX_ZONE_CHARS = 64
_ZONE_NAME = re.compile(r"[A-Za-z0-9_+\-]+(?:/[A-Za-z0-9_+\-]+)*", re.ASCII)
_NUMBER = re.compile(r"[0-9]{1,3}", re.ASCII)
_ITEM = re.compile(r"(?P<base>[^/]+)(?:/(?P<step>[^/]+))?", re.ASCII)
_ONE_MINUTE = timedelta(minutes=1)

_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = {
    name: number
    for number, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1
    )
}
_WEEKDAYS = {
    name: number for number, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))
}


@dataclass(frozen=True)
class _Field:
    """One of the five fields: its name, the values ``*`` covers and the names it accepts.

    ``top`` is the largest value written (7 for the day of week, where 7 is Sunday like 0);
    ``last`` the largest value ``*`` covers.
    """

    name: str
    first: int
    last: int
    top: int
    names: dict[str, int]

    @property
    def everything(self) -> tuple[int, ...]:
        return tuple(range(self.first, self.last + 1))


_FIELDS = (
    _Field("minute", 0, 59, 59, {}),
    _Field("hour", 0, 23, 23, {}),
    _Field("day of month", 1, 31, 31, {}),
    _Field("month", 1, 12, 12, _MONTHS),
    _Field("day of week", 0, 6, 7, _WEEKDAYS),
)


def _refuse(expr: str, why: str) -> InvalidParameter:
    # The expression is echoed only when short: a 10 KB input is not copied into the message.
    shown = f"{expr!r}: " if len(expr) <= MAX_EXPRESSION_CHARS else ""
    return InvalidParameter(f"invalid cron schedule {shown}{why}")


def _value(token: str, field: _Field, expr: str) -> int:
    if _NUMBER.fullmatch(token):
        number = int(token)
    elif token in field.names:
        number = field.names[token]
    else:
        raise _refuse(expr, f"{field.name}: {token!r} is not a number or a name it accepts")
    if not field.first <= number <= field.top:
        raise _refuse(expr, f"{field.name}: {number} is out of range {field.first}-{field.top}")
    return number


def _bounds(base: str, field: _Field, expr: str) -> tuple[int, int, bool]:
    """The first and last value an item's base names, and whether it was a single value."""
    if base == "*":
        return field.first, field.last, False
    low_text, dash, high_text = base.partition("-")
    low = _value(low_text, field, expr)
    if not dash:
        return low, low, True
    high = _value(high_text, field, expr)
    if field.names is _WEEKDAYS and high_text == "sun" and low > 0:
        high = 7  # FRI-SUN: Sunday closes the week here
    if low > high:
        raise _refuse(expr, f"{field.name}: range {base!r} runs backwards")
    return low, high, False


def _item_values(item: str, field: _Field, expr: str) -> set[int]:
    match = _ITEM.fullmatch(item)
    if match is None:
        raise _refuse(expr, f"{field.name}: {item!r} is not a value, range or step")
    low, high, single = _bounds(match["base"], field, expr)
    step_text = match["step"]
    if step_text is None:
        return set(range(low, high + 1))
    if not _NUMBER.fullmatch(step_text):
        raise _refuse(expr, f"{field.name}: step {step_text!r} is not a number")
    step = int(step_text)
    span = field.last - field.first + 1
    if not 1 <= step <= span:
        raise _refuse(expr, f"{field.name}: step {step} is outside 1-{span}")
    if single:
        high = field.last  # 5/15 is 5-59/15
    return set(range(low, high + 1, step))


def _field_values(text: str, field: _Field, expr: str) -> tuple[int, ...]:
    values: set[int] = set()
    for item in text.split(","):
        if not item:
            raise _refuse(expr, f"{field.name}: an empty list item")
        values |= _item_values(item, field, expr)
    if field.names is _WEEKDAYS and 7 in values:
        values = (values - {7}) | {0}
    return tuple(sorted(values))


def _field_text(values: tuple[int, ...], field: _Field) -> str:
    """The canonical spelling of a field's values: ``*``, ``*/n``, ``a-b/n``, runs and lists."""
    if values == field.everything:
        return "*"
    steps = {b - a for a, b in zip(values, values[1:], strict=False)}
    if len(values) >= 3 and len(steps) == 1 and (step := steps.pop()) > 1:
        if values == tuple(range(field.first, field.last + 1, step)):
            return f"*/{step}"
        return f"{values[0]}-{values[-1]}/{step}"
    parts: list[str] = []
    start = previous = values[0]
    for value in (*values[1:], None):
        if value is not None and value == previous + 1:
            previous = value
            continue
        if previous - start >= 2:
            parts.append(f"{start}-{previous}")
        else:
            parts.extend(str(v) for v in range(start, previous + 1))
        if value is not None:
            start = previous = value
    return ",".join(parts)


def _zone(name: str) -> ZoneInfo:
    if not isinstance(name, str) or not name or len(name) > _MAX_ZONE_CHARS:
        raise InvalidParameter("unknown time zone: give an IANA name such as 'Europe/Berlin'")
    if not _ZONE_NAME.fullmatch(name) or ".." in name:
        raise InvalidParameter("unknown time zone: give an IANA name such as 'Europe/Berlin'")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidParameter(
            f"unknown time zone {name!r}: give an IANA name such as 'Europe/Berlin'"
        ) from None


def _aware(t: datetime, what: str) -> datetime:
    if not isinstance(t, datetime) or t.tzinfo is None or t.utcoffset() is None:
        raise InvalidParameter(f"{what} must be an aware datetime (with a time zone)")
    return t


@dataclass(frozen=True)
class CronSchedule:
    """A parsed cron schedule in a time zone; compare, hash and print it (canonically).

    Build one with :meth:`parse`. The fields hold each field's values, sorted; the day of week
    counts 0 (Sunday) to 6. ``str(schedule)`` is the canonical five-field expression, and
    ``CronSchedule.parse(str(s), s.timezone) == s``.
    """

    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...]
    months: tuple[int, ...]
    weekdays: tuple[int, ...]
    timezone: str = "UTC"

    @classmethod
    def parse(cls, expr: str, timezone: str = "UTC") -> CronSchedule:
        """Parse a five-field cron expression (minute hour day-of-month month day-of-week).

        Accepted: ``*``, lists (``1,15``), ranges (``1-5``), steps (``*/15``, ``1-30/5``,
        ``5/15`` meaning ``5-59/15``), month names JAN-DEC and weekday names SUN-SAT (any case),
        0 and 7 both Sunday, and the macros ``@hourly @daily @midnight @weekly @monthly
        @yearly @annually``. When both the day of month and the day of week are restricted
        (neither covers its whole range), a day matches when either matches, as in Vixie cron;
        when one covers its whole range, the other alone decides.

        Args:
            expr: the expression.
            timezone: an IANA time-zone name; the fields are wall times there.

        Returns:
            The schedule.

        Raises:
            InvalidParameter: an unknown time zone; a seconds field (six fields: the finest
                schedule is one a minute); a wrong number of fields; an empty field or list
                item; a value out of range or unknown; a backwards range; a step of 0 or
                larger than the field; an expression over 200 characters; an expression that
                can never fire (``0 0 31 2 *``).
        """
        if not isinstance(expr, str):
            raise InvalidParameter("a cron schedule must be a string")
        zone = _zone(timezone)
        if len(expr) > MAX_EXPRESSION_CHARS:
            raise _refuse(expr, f"longer than {MAX_EXPRESSION_CHARS} characters")
        text = expr.strip().lower()
        text = _MACROS.get(text, text)
        if text.startswith("@"):
            raise _refuse(expr, f"unknown macro; known: {', '.join(sorted(_MACROS))}")
        fields = text.split()
        if not fields:
            raise _refuse(
                expr, "empty; give five fields: minute hour day-of-month month day-of-week"
            )
        if len(fields) == 6:
            raise _refuse(
                expr,
                "six fields: a seconds field is not accepted, schedules that fire every "
                "second are refused (the finest schedule fires once a minute); give five "
                "fields: minute hour day-of-month month day-of-week",
            )
        if len(fields) != 5:
            raise _refuse(
                expr,
                f"{len(fields)} fields; give five: minute hour day-of-month month day-of-week",
            )
        minutes, hours, days, months, weekdays = (
            _field_values(f, spec, expr) for f, spec in zip(fields, _FIELDS, strict=True)
        )
        schedule = cls(minutes, hours, days, months, weekdays, timezone=zone.key)
        if not schedule._can_fire():
            raise _refuse(expr, "it can never fire (no month has such a day)")
        return schedule

    def __str__(self) -> str:
        fields = (self.minutes, self.hours, self.days, self.months, self.weekdays)
        return " ".join(_field_text(v, f) for v, f in zip(fields, _FIELDS, strict=True))

    @property
    def zone(self) -> ZoneInfo:
        """The schedule's time zone."""
        return ZoneInfo(self.timezone)

    @property
    def _days_restricted(self) -> bool:
        return self.days != _FIELDS[2].everything

    @property
    def _weekdays_restricted(self) -> bool:
        return self.weekdays != _FIELDS[4].everything

    def _can_fire(self) -> bool:
        if self._weekdays_restricted or not self._days_restricted:
            return True  # some weekday comes round in every month
        # 2000 is a leap year: February's longest.
        return any(self.days[0] <= calendar.monthrange(2000, m)[1] for m in self.months)

    # -- wall times --------------------------------------------------------------------

    def _matching_days(self, year: int, month: int, days: range) -> list[int]:
        """The days of ``days`` (in one month) that the day fields accept, in ``days``'s order."""
        if not self._weekdays_restricted:
            return [d for d in days if d in self.days]
        weekday_of_first = (date(year, month, 1).weekday() + 1) % 7  # cron: Sunday is 0
        both = self._days_restricted
        return [
            d
            for d in days
            if ((weekday_of_first + d - 1) % 7 in self.weekdays) or (both and d in self.days)
        ]

    def _next_day(self, start: date) -> date | None:
        """The first day on or after ``start`` that the day and month fields accept."""
        for year in range(start.year, 10000):
            for month in self.months:
                if (year, month) < (start.year, start.month):
                    continue
                first = start.day if (year, month) == (start.year, start.month) else 1
                last = calendar.monthrange(year, month)[1]
                found = self._matching_days(year, month, range(first, last + 1))
                if found:
                    return date(year, month, found[0])
        return None

    def _previous_day(self, start: date) -> date | None:
        """The last day on or before ``start`` that the day and month fields accept."""
        for year in range(start.year, 0, -1):
            for month in reversed(self.months):
                if (year, month) > (start.year, start.month):
                    continue
                last = calendar.monthrange(year, month)[1]
                if (year, month) == (start.year, start.month):
                    last = start.day
                found = self._matching_days(year, month, range(last, 0, -1))
                if found:
                    return date(year, month, found[0])
        return None

    def _next_wall(self, start: datetime) -> datetime | None:
        """The first naive wall time at or after ``start`` (a whole minute) that matches."""
        day: date | None = start.date()
        while day is not None:
            day = self._next_day(day)
            if day is None:
                return None
            after = (start.hour, start.minute) if day == start.date() else (0, 0)
            for hour in self.hours:
                if hour < after[0]:
                    continue
                for minute in self.minutes:
                    if (hour, minute) >= after:
                        return datetime(day.year, day.month, day.day, hour, minute)
            day = day + timedelta(days=1) if day < date.max else None
        return None

    def _previous_wall(self, start: datetime) -> datetime | None:
        """The last naive wall time at or before ``start`` (a whole minute) that matches."""
        day: date | None = start.date()
        while day is not None:
            day = self._previous_day(day)
            if day is None:
                return None
            before = (start.hour, start.minute) if day == start.date() else (23, 59)
            for hour in reversed(self.hours):
                if hour > before[0]:
                    continue
                for minute in reversed(self.minutes):
                    if (hour, minute) <= before:
                        return datetime(day.year, day.month, day.day, hour, minute)
            day = day - timedelta(days=1) if day > date.min else None
        return None

    # -- instants ----------------------------------------------------------------------

    def _instant(self, wall: datetime, zone: ZoneInfo) -> datetime:
        """When a matching wall time fires, in UTC (see the module's rules for DST)."""
        # fold=0 is a repeated wall time's first occurrence.
        instant = wall.replace(tzinfo=zone).astimezone(UTC)
        if instant.astimezone(zone).replace(tzinfo=None) == wall:
            return instant
        # Skipped by a gap. fold=1 reads it with the offset after the transition, which
        # puts it before the transition; fold=0 with the offset before it, after. The
        # transition (the first instant after the gap) is the first instant between the
        # two whose wall time has passed ``wall``.
        low = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
        high = instant
        while high - low > timedelta(seconds=1):
            middle = low + (high - low) / 2
            middle = middle.replace(microsecond=0)
            if middle.astimezone(zone).replace(tzinfo=None) > wall:
                high = middle
            else:
                low = middle
        return high

    def _wall_floor(self, t: datetime, zone: ZoneInfo) -> tuple[datetime, datetime]:
        """``t`` in the zone, and its wall time floored to the minute (naive)."""
        local = t.astimezone(zone)
        return local, local.replace(tzinfo=None, second=0, microsecond=0, fold=0)

    def next_after(self, t: datetime) -> datetime:
        """The first firing strictly after ``t``.

        Args:
            t: an aware datetime, in any zone.

        Returns:
            An aware datetime in UTC.

        Raises:
            InvalidParameter: ``t`` is naive, or the schedule does not fire again before the
                year 10000.
        """
        _aware(t, "t")
        zone = self.zone
        try:
            _, wall = self._wall_floor(t, zone)
            while (found := self._next_wall(wall)) is not None:
                instant = self._instant(found, zone)
                if instant > t:
                    return instant
                # A first occurrence before t (t is in a repeated hour) or a gap's firing
                # already passed: try the next wall time.
                wall = found + _ONE_MINUTE
        except OverflowError:
            pass
        raise InvalidParameter(f"schedule {self} does not fire after {t.isoformat()}")

    def last_at_or_before(self, t: datetime) -> datetime | None:
        """The latest firing at or before ``t``, in UTC; None if it never fired before.

        Raises:
            InvalidParameter: ``t`` is naive.
        """
        _aware(t, "t")
        zone = self.zone
        try:
            local, wall = self._wall_floor(t, zone)
            if local.fold == 1:
                # t is in a repeated hour's second pass: first occurrences up to the end of
                # the repeated stretch fired before t.
                shift = local.replace(fold=0).utcoffset() - local.utcoffset()  # type: ignore[operator]
                wall += shift
            while (found := self._previous_wall(wall)) is not None:
                instant = self._instant(found, zone)
                if instant <= t:
                    return instant
                wall = found - _ONE_MINUTE
        except OverflowError:
            pass
        return None

    def ticks_between(self, after: datetime, until: datetime, limit: int) -> list[datetime]:
        """The firings strictly after ``after`` and at or before ``until``, oldest first, at
        most ``limit`` of them (the earliest).

        Raises:
            InvalidParameter: a naive datetime, or a negative limit.
        """
        _aware(after, "after")
        _aware(until, "until")
        if not isinstance(limit, int) or limit < 0:
            raise InvalidParameter("limit must be a whole number, 0 or more")
        ticks: list[datetime] = []
        current = after
        while len(ticks) < limit:
            try:
                current = self.next_after(current)
            except InvalidParameter:
                break  # no more firings before the year 10000
            if current > until:
                break
            ticks.append(current)
        return ticks


def due_ticks(
    schedule: CronSchedule,
    *,
    last_tick: datetime | None,
    now: datetime,
    catch_up: CatchUp,
    max_catch_up: int = 100,
) -> list[datetime]:
    """The ticks a scheduler fires now, oldest first.

    The ticks that have come are the firings in ``(last_tick, now]``. A tick is *on time* when
    it is at most :data:`ON_TIME` (one minute) old; older ones were *missed* (the scheduler was
    down or late). The scheduler calls this at least once a minute and records the newest
    tick it fired as ``last_tick``.

    - ``"all"``: every tick that has come, missed ones included, oldest first; when more than
      ``max_catch_up`` have come only the newest ``max_catch_up`` are returned (and a warning
      is logged saying how many were dropped).
    - ``"latest"``: only the newest tick that has come (on time or missed), so a long outage
      fires once.
    - ``"none"``: nothing missed is fired; only an on-time tick (one that came within the
      last minute) is. After an outage the schedule resumes with its next tick.
    - ``last_tick=None`` (a schedule that never fired): nothing in the past is fired, whatever
      ``catch_up`` says; only an on-time tick is. A store that wants the ticks missed since a
      schedule's creation caught up passes the creation time as ``last_tick``.

    Args:
        schedule: the schedule.
        last_tick: the newest tick already fired, or None.
        now: the current instant (aware).
        catch_up: ``"all"``, ``"latest"`` or ``"none"``.
        max_catch_up: at most this many ticks for ``"all"`` (1 or more).

    Returns:
        Aware datetimes in UTC, oldest first; empty when nothing is due.

    Raises:
        InvalidParameter: naive datetimes, an unknown ``catch_up``, ``max_catch_up`` under 1.
    """
    _aware(now, "now")
    if last_tick is not None:
        _aware(last_tick, "last_tick")
    if catch_up not in ("all", "latest", "none"):
        raise InvalidParameter("catch_up must be 'all', 'latest' or 'none'")
    if not isinstance(max_catch_up, int) or max_catch_up < 1:
        raise InvalidParameter("max_catch_up must be a whole number, 1 or more")
    on_time_since = now - ON_TIME
    if last_tick is None or catch_up == "none":
        floor = on_time_since if last_tick is None else max(last_tick, on_time_since)
    else:
        floor = last_tick
    newest = schedule.last_at_or_before(now)
    if newest is None or newest <= floor:
        return []
    if catch_up != "all" or last_tick is None:
        return [newest]
    ticks = [newest]
    while (earlier := schedule.last_at_or_before(ticks[-1] - timedelta(microseconds=1))) and (
        earlier > floor
    ):
        if len(ticks) == max_catch_up:
            logger.warning(
                "schedule %s: more than %d ticks missed since %s; firing the newest %d only",
                schedule,
                max_catch_up,
                floor.isoformat(),
                max_catch_up,
            )
            break
        ticks.append(earlier)
    ticks.reverse()
    return ticks
