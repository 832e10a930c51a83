"""Cron schedules: parsing, and firings checked against a slow reference that walks wall times.

The reference knows the value sets the strategy drew (never the parser's), walks every minute
of the days around an instant in the zone's local wall time, maps each matching wall time to
its instant by the module's DST rules (checked minute by minute in UTC), and takes the minimum
or maximum. The zones cover one-hour DST both hemispheres' way round (Berlin, New York), a
30-minute DST (Lord Howe) and none (Dubai).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shamal.errors import InvalidParameter
from shamal.pipelines import ON_TIME, CronSchedule, due_ticks

ZONES = ("Europe/Berlin", "America/New_York", "Asia/Dubai", "Australia/Lord_Howe", "UTC")
MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
HORIZON_DAYS = 9


# -- the reference ----------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """What a drawn expression means, computed by the strategy itself."""

    expr: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]

    def day_matches(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        in_days = day.day in self.days
        in_weekdays = day.isoweekday() % 7 in self.weekdays
        if self.days != frozenset(range(1, 32)) and self.weekdays != frozenset(range(7)):
            return in_days or in_weekdays
        return in_days and in_weekdays


def reference_instant(wall: datetime, zone: ZoneInfo) -> datetime:
    """A matching wall time's firing: itself (first occurrence), or the end of its gap."""
    first = wall.replace(tzinfo=zone).astimezone(UTC)
    if first.astimezone(zone).replace(tzinfo=None) == wall:
        return first
    instant = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    while instant.astimezone(zone).replace(tzinfo=None) <= wall:
        instant += timedelta(minutes=1)
    return instant


def reference_firings(spec: Spec, zone: ZoneInfo, first_day: date, days: int) -> list[datetime]:
    """Every firing whose wall time falls on one of ``days`` days from ``first_day``."""
    found = set()
    for offset in range(days):
        day = first_day + timedelta(days=offset)
        if not spec.day_matches(day):
            continue
        for hour in range(24):
            for minute in range(60):
                if hour in spec.hours and minute in spec.minutes:
                    wall = datetime(day.year, day.month, day.day, hour, minute)
                    found.add(reference_instant(wall, zone))
    return sorted(found)


def reference_can_fire(spec: Spec) -> bool:
    day = date(2000, 1, 1)
    while day < date(2009, 1, 1):
        if spec.day_matches(day):
            return True
        day += timedelta(days=1)
    return False


# -- strategies -------------------------------------------------------------------------


@st.composite
def field(draw: st.DrawFn, first: int, last: int, top: int, names: tuple[str, ...] = ()):
    """(text, values) for one field; ``names[i]`` spells ``first + i``."""

    def spell(value: int) -> str:
        if names and value - first < len(names) and draw(st.booleans()):
            name = names[value - first]
            return draw(st.sampled_from((name, name.upper(), name.capitalize())))
        return str(value)

    texts, values = [], set()
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(("star", "star-step", "value", "range", "range-step")))
        # A step over the field's span is refused (*/90 in minutes is not every 90 minutes).
        step = draw(st.integers(1, min(8, last - first + 1))) if kind.endswith("step") else 1
        if kind.startswith("star"):
            low, high, text = first, last, "*"
        elif kind == "value":
            low = high = draw(st.integers(first, top))
            text = spell(low)
        else:
            low = draw(st.integers(first, top))
            high = draw(st.integers(low, top))
            text = f"{spell(low)}-{spell(high)}"
        if kind.endswith("step"):
            text += f"/{step}"
        texts.append(text)
        values |= {v for v in range(first, top + 1) if low <= v <= high and (v - low) % step == 0}
    if top == 7:
        values = {v % 7 for v in values}
    return ",".join(texts), frozenset(values)


@st.composite
def specs(draw: st.DrawFn) -> Spec:
    # Minutes and hours lean to few values so that many schedules fire within the horizon.
    minute = draw(field(0, 59, 59))
    hour = draw(field(0, 23, 23))
    day = draw(st.one_of(st.just(("*", frozenset(range(1, 32)))), field(1, 31, 31)))
    month = draw(st.one_of(st.just(("*", frozenset(range(1, 13)))), field(1, 12, 12, MONTH_NAMES)))
    weekday = draw(st.one_of(st.just(("*", frozenset(range(7)))), field(0, 6, 7, DAY_NAMES)))
    parts = (minute, hour, day, month, weekday)
    return Spec(" ".join(p[0] for p in parts), *(p[1] for p in parts))


def _transitions(zone: ZoneInfo) -> list[datetime]:
    """The zone's offset changes in 2024-2027, to the second."""
    found = []
    hour = datetime(2024, 1, 1, tzinfo=UTC)
    while hour.year < 2028:
        after = hour + timedelta(hours=1)
        if hour.astimezone(zone).utcoffset() != after.astimezone(zone).utcoffset():
            low, high = hour, after
            while high - low > timedelta(seconds=1):
                middle = low + (high - low) / 2
                if middle.astimezone(zone).utcoffset() == hour.astimezone(zone).utcoffset():
                    low = middle
                else:
                    high = middle
            found.append(high)
        hour = after
    return found


TRANSITIONS = {name: _transitions(ZoneInfo(name)) for name in ZONES}


@st.composite
def instants(draw: st.DrawFn, zone: str) -> datetime:
    """Anywhere in 2024-2027, or within three hours of one of the zone's DST changes."""
    near = TRANSITIONS[zone]
    if near and draw(st.booleans()):
        base = draw(st.sampled_from(near))
        seconds = draw(st.integers(-3 * 3600, 3 * 3600))
    else:
        base = datetime(2024, 1, 1, tzinfo=UTC)
        seconds = draw(st.integers(0, 4 * 365 * 86400))
    if draw(st.booleans()):
        seconds -= seconds % 60  # on a whole minute: often a firing itself
    return base + timedelta(seconds=seconds)


# -- properties against the reference ---------------------------------------------------


def _parse_or_never(spec: Spec, zone: str) -> CronSchedule:
    try:
        return CronSchedule.parse(spec.expr, zone)
    except InvalidParameter:
        assert not reference_can_fire(spec), spec.expr
        assume(False)
        raise


@settings(max_examples=150, deadline=None)
@given(data=st.data(), spec=specs(), zone=st.sampled_from(ZONES))
def test_next_after_matches_the_reference(data: st.DataObject, spec: Spec, zone: str) -> None:
    schedule = _parse_or_never(spec, zone)
    t = data.draw(instants(zone))
    tz = ZoneInfo(zone)
    start = t.astimezone(tz).date() - timedelta(days=1)
    expected = [f for f in reference_firings(spec, tz, start, HORIZON_DAYS) if f > t]
    got = schedule.next_after(t)
    assert got.tzinfo is UTC
    if expected:
        assert got == expected[0], (spec.expr, zone, t)
    else:
        assert got > t + timedelta(days=HORIZON_DAYS - 3), (spec.expr, zone, t)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), spec=specs(), zone=st.sampled_from(ZONES))
def test_last_at_or_before_and_ticks_match_the_reference(
    data: st.DataObject, spec: Spec, zone: str
) -> None:
    schedule = _parse_or_never(spec, zone)
    t = data.draw(instants(zone))
    tz = ZoneInfo(zone)
    start = t.astimezone(tz).date() - timedelta(days=HORIZON_DAYS - 2)
    firings = reference_firings(spec, tz, start, HORIZON_DAYS)
    before = [f for f in firings if f <= t]
    got = schedule.last_at_or_before(t)
    if before:
        assert got == before[-1], (spec.expr, zone, t)
    else:
        assert got is None or got < t - timedelta(days=HORIZON_DAYS - 3)
    # ticks_between over the two days before t, limited and not.
    after = t - timedelta(days=2)
    window = [f for f in firings if after < f <= t]
    assert schedule.ticks_between(after, t, 10_000) == window
    assert schedule.ticks_between(after, t, 3) == window[:3]


@settings(max_examples=200, deadline=None)
@given(spec=specs(), zone=st.sampled_from(ZONES))
def test_canonical_text_parses_to_the_same_schedule(spec: Spec, zone: str) -> None:
    schedule = _parse_or_never(spec, zone)
    assert set(schedule.minutes) == spec.minutes
    assert set(schedule.hours) == spec.hours
    assert set(schedule.days) == spec.days
    assert set(schedule.months) == spec.months
    assert set(schedule.weekdays) == spec.weekdays
    again = CronSchedule.parse(str(schedule), zone)
    assert again == schedule
    assert str(again) == str(schedule)


# -- DST, explicitly --------------------------------------------------------------------


def _utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def test_a_time_in_berlins_spring_gap_fires_when_the_gap_ends() -> None:
    # 2025-03-30: 02:00 CET jumps to 03:00 CEST (01:00 UTC).
    schedule = CronSchedule.parse("30 2 * * *", "Europe/Berlin")
    assert schedule.next_after(_utc(2025, 3, 29, 12)) == _utc(2025, 3, 30, 1)
    assert schedule.next_after(_utc(2025, 3, 30, 1)) == _utc(2025, 3, 31, 0, 30)


def test_the_times_of_one_gap_fire_once_together() -> None:
    schedule = CronSchedule.parse("*/30 2-3 * * *", "Europe/Berlin")
    ticks = schedule.ticks_between(_utc(2025, 3, 29, 23), _utc(2025, 3, 30, 3), 100)
    # 02:00, 02:30 and 03:00 CEST are one instant; then 03:30 CEST.
    assert ticks == [_utc(2025, 3, 30, 1), _utc(2025, 3, 30, 1, 30)]


def test_a_repeated_time_in_new_york_fires_once_on_its_first_occurrence() -> None:
    # 2025-11-02: 02:00 EDT falls back to 01:00 EST (06:00 UTC); 01:xx happens twice.
    schedule = CronSchedule.parse("*/30 * * * *", "America/New_York")
    ticks = schedule.ticks_between(_utc(2025, 11, 2, 4), _utc(2025, 11, 2, 7), 100)
    assert ticks == [
        _utc(2025, 11, 2, 4, 30),  # 00:30 EDT
        _utc(2025, 11, 2, 5),  # 01:00 EDT
        _utc(2025, 11, 2, 5, 30),  # 01:30 EDT; 01:00 and 01:30 EST do not fire again
        _utc(2025, 11, 2, 7),  # 02:00 EST
    ]
    once = CronSchedule.parse("30 1 * * *", "America/New_York")
    assert once.next_after(_utc(2025, 11, 2, 5, 30)) == _utc(2025, 11, 3, 6, 30)
    # From inside the second 01:xx, the last firing is the first 01:30.
    assert once.last_at_or_before(_utc(2025, 11, 2, 6, 45)) == _utc(2025, 11, 2, 5, 30)
    # At 01:10 EST the first 01:30 (EDT) has passed, though 01:30 is later on the wall.
    assert once.last_at_or_before(_utc(2025, 11, 2, 6, 10)) == _utc(2025, 11, 2, 5, 30)
    assert once.next_after(_utc(2025, 11, 2, 6, 10)) == _utc(2025, 11, 3, 6, 30)


def test_lord_howes_half_hour_gap_and_fold() -> None:
    # 2025-10-05 02:00 +10:30 jumps to 02:30 +11 (15:30 UTC the day before).
    gap = CronSchedule.parse("15 2 * * *", "Australia/Lord_Howe")
    assert gap.next_after(_utc(2025, 10, 4, 12)) == _utc(2025, 10, 4, 15, 30)
    # 2025-04-06 02:00 +11 falls back to 01:30 +10:30; 01:45 happens twice.
    fold = CronSchedule.parse("45 1 * * *", "Australia/Lord_Howe")
    assert fold.next_after(_utc(2025, 4, 5, 12)) == _utc(2025, 4, 5, 14, 45)
    assert fold.next_after(_utc(2025, 4, 5, 14, 45)) == _utc(2025, 4, 6, 15, 15)


def test_dubai_has_no_dst() -> None:
    schedule = CronSchedule.parse("@daily", "Asia/Dubai")
    ticks = schedule.ticks_between(_utc(2025, 3, 29), _utc(2025, 4, 1), 10)
    assert ticks == [_utc(2025, 3, 29, 20), _utc(2025, 3, 30, 20), _utc(2025, 3, 31, 20)]


def test_day_of_month_or_day_of_week_when_both_are_restricted() -> None:
    # The 13th, or any Friday.
    either = CronSchedule.parse("0 0 13 * FRI")
    days = [t.date() for t in either.ticks_between(_utc(2026, 2, 1), _utc(2026, 3, 1), 20)]
    assert days == [date(2026, 2, d) for d in (6, 13, 20, 27)]
    either = CronSchedule.parse("0 0 13 * 1")
    days = [t.date() for t in either.ticks_between(_utc(2026, 2, 1), _utc(2026, 3, 1), 20)]
    assert days == [date(2026, 2, d) for d in (2, 9, 13, 16, 23)]
    # A full day-of-month range is no restriction: Mondays only.
    mondays = CronSchedule.parse("0 0 1-31 * mon")
    days = [t.date() for t in mondays.ticks_between(_utc(2026, 2, 1), _utc(2026, 3, 1), 20)]
    assert days == [date(2026, 2, d) for d in (2, 9, 16, 23)]


def test_sunday_is_0_and_7_and_names_are_case_insensitive() -> None:
    assert CronSchedule.parse("0 0 * * 7") == CronSchedule.parse("0 0 * * Sun")
    assert CronSchedule.parse("0 0 * * 0") == CronSchedule.parse("0 0 * * SUN")
    assert str(CronSchedule.parse("0 0 * * fri-sun")) == "0 0 * * 0,5,6"
    assert str(CronSchedule.parse("0 0 * Jan-MAR,dec *")) == "0 0 * 1-3,12 *"


@pytest.mark.parametrize(
    ("macro", "expr"),
    [
        ("@hourly", "0 * * * *"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@weekly", "0 0 * * 0"),
        ("@monthly", "0 0 1 * *"),
        ("@yearly", "0 0 1 1 *"),
        ("@ANNUALLY", "0 0 1 1 *"),
    ],
)
def test_macros(macro: str, expr: str) -> None:
    assert str(CronSchedule.parse(macro)) == expr


def test_a_yearly_schedules_next_firing_is_fast() -> None:
    schedules = [
        CronSchedule.parse("@yearly", "Europe/Berlin"),
        CronSchedule.parse("0 0 29 2 *", "America/New_York"),  # every leap year
    ]
    t = _utc(2097, 3, 1)
    assert schedules[1].next_after(t) == _utc(2104, 2, 29, 5)  # 2100 is no leap year
    started = time.perf_counter()
    for _ in range(200):
        for schedule in schedules:
            schedule.next_after(t)
    per_call = (time.perf_counter() - started) / 400
    assert per_call < 0.002, per_call


def test_the_timezone_is_kept_and_results_are_in_utc() -> None:
    schedule = CronSchedule.parse("0 9 * * *", "Europe/Berlin")
    assert schedule.timezone == "Europe/Berlin"
    berlin = datetime(2026, 6, 1, 8, tzinfo=ZoneInfo("Europe/Berlin"))
    assert schedule.next_after(berlin) == _utc(2026, 6, 1, 7)
    assert schedule.next_after(berlin).tzinfo is UTC


# -- due ticks --------------------------------------------------------------------------

EVERY_TEN = CronSchedule.parse("*/10 * * * *")
LAST = _utc(2026, 1, 1, 0, 0)
LATE = _utc(2026, 1, 1, 1, 0, 30)  # 30 s after the 01:00 tick, five ticks missed before it


def test_all_catches_up_every_missed_tick() -> None:
    due = due_ticks(EVERY_TEN, last_tick=LAST, now=LATE, catch_up="all")
    assert due == [_utc(2026, 1, 1, 0, m) for m in (10, 20, 30, 40, 50)] + [_utc(2026, 1, 1, 1)]


def test_all_keeps_the_newest_max_catch_up_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="shamal.pipelines._cron"):
        due = due_ticks(EVERY_TEN, last_tick=LAST, now=LATE, catch_up="all", max_catch_up=2)
    assert due == [_utc(2026, 1, 1, 0, 50), _utc(2026, 1, 1, 1)]
    assert "newest 2" in caplog.text


def test_all_over_a_year_of_minutes_stays_fast() -> None:
    every_minute = CronSchedule.parse("* * * * *", "Europe/Berlin")
    now = _utc(2026, 1, 1)
    started = time.perf_counter()
    due = due_ticks(every_minute, last_tick=now - timedelta(days=365), now=now, catch_up="all")
    assert time.perf_counter() - started < 1.0
    assert len(due) == 100
    assert due[-1] == now
    assert due[0] == now - timedelta(minutes=99)


def test_latest_fires_only_the_newest() -> None:
    assert due_ticks(EVERY_TEN, last_tick=LAST, now=LATE, catch_up="latest") == [
        _utc(2026, 1, 1, 1)
    ]
    # Newest missed, nothing on time.
    now = _utc(2026, 1, 1, 1, 5)
    assert due_ticks(EVERY_TEN, last_tick=LAST, now=now, catch_up="latest") == [_utc(2026, 1, 1, 1)]


def test_none_fires_nothing_missed_only_the_tick_on_time() -> None:
    assert due_ticks(EVERY_TEN, last_tick=LAST, now=LATE, catch_up="none") == [_utc(2026, 1, 1, 1)]
    late_by_two_minutes = _utc(2026, 1, 1, 1, 2)
    assert due_ticks(EVERY_TEN, last_tick=LAST, now=late_by_two_minutes, catch_up="none") == []
    # The next scheduled one fires on time.
    on_time = _utc(2026, 1, 1, 1, 10, 5)
    assert due_ticks(EVERY_TEN, last_tick=LAST, now=on_time, catch_up="none") == [
        _utc(2026, 1, 1, 1, 10)
    ]


def test_a_tick_fired_once_is_not_due_again() -> None:
    tick = _utc(2026, 1, 1, 1)
    for mode in ("all", "latest", "none"):
        assert due_ticks(EVERY_TEN, last_tick=tick, now=LATE, catch_up=mode) == []


@pytest.mark.parametrize("mode", ["all", "latest", "none"])
def test_a_new_schedule_fires_nothing_in_the_past(mode: str) -> None:
    assert due_ticks(EVERY_TEN, last_tick=None, now=_utc(2026, 1, 1, 1, 5), catch_up=mode) == []
    assert due_ticks(EVERY_TEN, last_tick=None, now=LATE, catch_up=mode) == [_utc(2026, 1, 1, 1)]
    exactly = _utc(2026, 1, 1, 1) + ON_TIME
    assert due_ticks(EVERY_TEN, last_tick=None, now=exactly, catch_up=mode) == []


def test_due_ticks_refuses_bad_arguments() -> None:
    naive = datetime(2026, 1, 1)
    with pytest.raises(InvalidParameter, match="aware"):
        due_ticks(EVERY_TEN, last_tick=None, now=naive, catch_up="all")
    with pytest.raises(InvalidParameter, match="aware"):
        due_ticks(EVERY_TEN, last_tick=naive, now=LATE, catch_up="all")
    with pytest.raises(InvalidParameter, match="catch_up"):
        due_ticks(EVERY_TEN, last_tick=None, now=LATE, catch_up="some")  # type: ignore[arg-type]
    with pytest.raises(InvalidParameter, match="max_catch_up"):
        due_ticks(EVERY_TEN, last_tick=LAST, now=LATE, catch_up="all", max_catch_up=0)
    with pytest.raises(InvalidParameter, match="aware"):
        EVERY_TEN.next_after(naive)
    with pytest.raises(InvalidParameter, match="limit"):
        EVERY_TEN.ticks_between(LAST, LATE, -1)


# -- hostile and wrong expressions ------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "says"),
    [
        ("0 0 31 2 *", "never fire"),
        ("0 0 30-31 2 *", "never fire"),
        ("* * * * * *", "every second"),
        ("*/5 * * * * *", "one a minute|once a minute"),
        ("", "empty"),
        ("   ", "empty"),
        ("* * * *", "4 fields"),
        ("* * * * * * *", "7 fields"),
        ("60 * * * *", "out of range"),
        ("* 24 * * *", "out of range"),
        ("* * 0 * *", "out of range"),
        ("* * 32 * *", "out of range"),
        ("* * * 13 *", "out of range"),
        ("* * * * 8", "out of range"),
        ("-1 * * * *", "not a number"),
        ("5-1 * * * *", "backwards"),
        ("* * * dec-jan *", "backwards"),
        ("*/0 * * * *", "step 0"),
        ("1-5/0 * * * *", "step 0"),
        ("*/61 * * * *", "step 61"),
        ("*/ * * * *", "not a value"),
        ("1,,2 * * * *", "empty list item"),
        (",1 * * * *", "empty list item"),
        ("1, * * * *", "empty list item"),
        ("* * * jan-feb mon-funday", "not a number or a name"),
        ("* * * * mon#2", "not a number or a name"),
        ("* * L * *", "not a number or a name"),
        ("* * ? * *", "not a number or a name"),
        ("mon * * * *", "not a number or a name"),
        ("\u0663 * * * *", "not a number or a name"),
        ("\uff11 * * * *", "not a number or a name"),
        ("0\x00 * * * *", "not a number or a name"),
        ("1-2-3 * * * *", "not a number or a name"),
        ("99999999999999999999 * * * *", "not a number"),
        ("@reboot", "unknown macro"),
        ("@every 5m", "unknown macro"),
        ("x" * 10_240, "longer than 200"),
        ("* " * 5_000, "longer than 200"),
    ],
)
def test_hostile_expressions_are_refused_clearly(expr: str, says: str) -> None:
    started = time.perf_counter()
    with pytest.raises(InvalidParameter, match=says) as refused:
        CronSchedule.parse(expr)
    assert time.perf_counter() - started < 0.1
    assert len(str(refused.value)) < 400  # a 10 KB input is not echoed back


@pytest.mark.parametrize(
    "zone",
    [
        "Mars/Olympus_Mons",
        "",
        "../../etc/passwd",
        "/etc/passwd",
        "Europe/../../etc/passwd",
        "Europe",
        "Europe/Berlin\n",
        "Europe/Berlin\x00",
        "Europe\\Berlin",
        "x" * 10_000,
    ],
)
def test_unknown_time_zones_are_refused(zone: str) -> None:
    with pytest.raises(InvalidParameter, match="time zone") as refused:
        CronSchedule.parse("* * * * *", zone)
    assert len(str(refused.value)) < 200


def test_an_expression_that_must_be_a_string() -> None:
    with pytest.raises(InvalidParameter, match="string"):
        CronSchedule.parse(None)  # type: ignore[arg-type]
