"""Crontab schedules in time zones: parsing, validation, next fire times, DST transitions.

Generated expressions are checked against croniter (a test dependency): its field matching
on local wall times, each placed by the documented DST rule computed here on its own
(`_croniter_fires`), and its own time-zone mode away from transitions, where conventions
cannot differ. Explicit cases pin the DST rule on the transition days.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from functools import cache
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest
from celery.schedules import crontab
from croniter import croniter
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from resilience.schedules.cron import Cron, next_fires
from resilience.schedules.errors import InvalidSchedule

UTC = timezone.utc
ZONES = ("UTC", "Europe/Paris", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata")
PARIS = ZoneInfo("Europe/Paris")
NEW_YORK = ZoneInfo("America/New_York")
LORD_HOWE = ZoneInfo("Australia/Lord_Howe")

MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def utc(*fields: int) -> datetime:
    return datetime(*fields, tzinfo=UTC)


def local(zone: ZoneInfo, *fields: int, fold: int = 0) -> datetime:
    return datetime(*fields, tzinfo=zone, fold=fold)


@cache
def transitions(name: str) -> tuple[datetime, ...]:
    """The zone's UTC-offset changes from 2024 to 2031, to the minute (UTC instants)."""
    zone = ZoneInfo(name)
    found = []
    day = utc(2024, 1, 1)
    while day.year < 2031:
        following = day + timedelta(days=1)
        if day.astimezone(zone).utcoffset() != following.astimezone(zone).utcoffset():
            low, high = day, following
            while high - low > timedelta(minutes=1):
                middle = low + (high - low) / 2
                if middle.astimezone(zone).utcoffset() == day.astimezone(zone).utcoffset():
                    low = middle
                else:
                    high = middle
            found.append(high.replace(second=0, microsecond=0))
        day = following
    return tuple(found)


def _croniter_expression(expression: str) -> str:
    """The expression croniter reads as we read `expression`.

    Both day fields restricted (neither exactly `*`) means either matches, for us and for
    croniter; but croniter reads a day field covering its whole range (`*/1`, `1-31`) as
    `*` when the other field's text holds a `*`, which makes the rule AND. We keep OR, so
    such a field means every day: say it with `* * *` for croniter.
    """
    minute, hour, days, month, weekdays = expression.split()
    days_full = croniter.expand(f"* * {days} * *")[0][2] == ["*"]
    weekdays_full = croniter.expand(f"* * * * {weekdays}")[0][4] == ["*"]
    if days != "*" and weekdays != "*" and (days_full or weekdays_full):
        days, weekdays = "*", "*"
    return " ".join((minute, hour, days, month, weekdays))


def _first_instant_showing(wall: datetime, tz: ZoneInfo) -> datetime:
    """The documented rule, computed apart from `resilience.schedules.cron`: the first
    instant at which the clock of `tz` shows `wall` or later."""
    offsets = {tz.utcoffset(wall + timedelta(hours=hours)) for hours in (-6, 0, 6)}
    shown = [instant for instant in ((wall - offset).replace(tzinfo=UTC) for offset in offsets)
             if instant.astimezone(tz).replace(tzinfo=None) == wall]
    if shown:
        return min(shown)  # the first occurrence of a repeated local time
    # A spring-forward gap: from an instant after it, walk back while the clock shows `wall`
    # or later (transitions fall on whole minutes).
    instant = (wall - min(offsets)).replace(tzinfo=UTC)
    step = timedelta(minutes=1)
    while (instant - step).astimezone(tz).replace(tzinfo=None) >= wall:
        instant -= step
    return instant


def _croniter_fires(expression: str, zone: str, start: datetime, n: int) -> list[datetime]:
    """The next `n` fires after `start` by croniter's field matching on naive local wall
    times, each placed by the documented DST rule (`_first_instant_showing`).

    croniter's own time-zone mode keeps a different convention on DST days (it fires a
    repeated local time twice, and skips a nonexistent `02:01` of an hourly entry for
    `03:01`), so it is compared as is only away from transitions
    (`test_next_fires_match_croniter_in_its_own_time_zone_mode`).
    """
    tz = ZoneInfo(zone)
    wall = start.astimezone(tz).replace(tzinfo=None, second=0, microsecond=0, fold=0)
    iterator = croniter(_croniter_expression(expression), wall - timedelta(minutes=1))
    fires: list[datetime] = []
    while len(fires) < n:
        instant = _first_instant_showing(iterator.get_next(datetime), tz)
        if instant > start and (not fires or instant > fires[-1]):
            fires.append(instant)
    return fires


def _transition_between(zone: str, start: datetime, end: datetime) -> bool:
    return any(start <= change <= end for change in transitions(zone))


@st.composite
def fields(draw: st.DrawFn, low: int, high: int, names: tuple[str, ...] | None = None) -> str:
    """One crontab field in croniter's and our common syntax (no wrap-around ranges)."""

    def number(value: int) -> str:
        if names and draw(st.booleans()):
            name = names[value - low]
            return name.upper() if draw(st.booleans()) else name
        return str(value)

    def part() -> str:
        kind = draw(st.sampled_from(("one", "range", "range_step")))
        start = draw(st.integers(low, high))
        if kind == "one" or start == high:
            return number(start)
        # croniter reads `a-a` as the whole field (its hashed-range rule): a < b here.
        end = draw(st.integers(start + 1, high))
        text = f"{number(start)}-{number(end)}"
        if kind == "range_step":
            text += f"/{draw(st.integers(1, high - low + 1))}"
        return text

    kind = draw(st.sampled_from(("star", "star_step", "list")))
    if kind == "star":
        return "*"
    if kind == "star_step":
        return f"*/{draw(st.integers(1, high - low + 1))}"
    return ",".join(part() for _ in range(draw(st.integers(1, 3))))


@st.composite
def expressions(draw: st.DrawFn) -> str:
    return " ".join((
        draw(fields(0, 59)),
        draw(fields(0, 23)),
        draw(fields(1, 31)),
        draw(fields(1, 12, MONTHS)),
        draw(fields(0, 6, DAYS)),
    ))


@st.composite
def starts(draw: st.DrawFn, zone: str) -> datetime:
    """A moment from 2024 to 2030; in a zone with DST, two times in three within two days
    of a transition, half of those in the four hours before it (so the next fires cross it)
    or the hour after."""
    changes = transitions(zone)
    near = draw(st.sampled_from(("anywhere", "days", "hours"))) if changes else "anywhere"
    if near != "anywhere":
        low, high = (-2 * 86400, 2 * 86400) if near == "days" else (-4 * 3600, 3600)
        return draw(st.sampled_from(changes)) + timedelta(seconds=draw(st.integers(low, high)))
    return utc(2024, 1, 1) + timedelta(seconds=draw(st.integers(0, 7 * 365 * 86400)))


class TestAgainstCroniter:
    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(data=st.data(), expression=expressions(), zone=st.sampled_from(ZONES))
    def test_next_fires_match_croniter(self, data: st.DataObject, expression: str,
                                       zone: str) -> None:
        """The next fires of any expression in any zone are the local times croniter
        matches, each at the first instant the local clock shows it (a nonexistent one at the
        end of its gap, a repeated one at its first occurrence), each instant once."""
        try:
            cron = Cron(expression, timezone=zone)
        except InvalidSchedule:
            assume(False)  # a day no month it names has (`0 0 31 2 *`), refused by design
        start = data.draw(starts(zone))
        n = data.draw(st.integers(1, 8))
        ours = next_fires(cron, start, n)
        assert ours == _croniter_fires(expression, zone, start, n)

    @settings(max_examples=100, deadline=None)
    @given(data=st.data(), expression=expressions(),
           zone=st.sampled_from(("Europe/Paris", "America/New_York", "Australia/Lord_Howe")))
    def test_fires_across_a_transition_match_croniter(self, data: st.DataObject,
                                                      expression: str, zone: str) -> None:
        """From the four hours before a DST transition, the next eight fires are the
        croniter-matched local times placed by the documented rule."""
        try:
            cron = Cron(expression, timezone=zone)
        except InvalidSchedule:
            assume(False)
        change = data.draw(st.sampled_from(transitions(zone)))
        start = change - timedelta(seconds=data.draw(st.integers(0, 4 * 3600)))
        assert next_fires(cron, start, 8) == _croniter_fires(expression, zone, start, 8)

    @settings(max_examples=50, deadline=None)
    @given(data=st.data(), expression=expressions(), zone=st.sampled_from(ZONES))
    def test_next_fires_match_croniter_in_its_own_time_zone_mode(
            self, data: st.DataObject, expression: str, zone: str) -> None:
        """Away from DST transitions, croniter's aware fires are ours."""
        try:
            cron = Cron(expression, timezone=zone)
        except InvalidSchedule:
            assume(False)
        start = utc(2024, 1, 1) + timedelta(seconds=data.draw(st.integers(0, 7 * 365 * 86400)))
        ours = next_fires(cron, start, 3)
        assume(ours[-1].year < 2031)
        assume(not _transition_between(zone, start - timedelta(days=1),
                                       ours[-1] + timedelta(days=1)))
        iterator = croniter(_croniter_expression(expression), start.astimezone(ZoneInfo(zone)))
        assert ours == [iterator.get_next(datetime).astimezone(UTC) for _ in range(3)]

    @settings(max_examples=50, deadline=None)
    @given(data=st.data(), expression=expressions(), zone=st.sampled_from(ZONES))
    def test_fires_increase_and_are_found_again(self, data: st.DataObject, expression: str,
                                                zone: str) -> None:
        """Fires are aware UTC, on the minute, strictly increasing and after the start; the
        fire after a moment just before a fire is that fire."""
        try:
            cron = Cron(expression, timezone=zone)
        except InvalidSchedule:
            assume(False)
        start = data.draw(starts(zone))
        fires = next_fires(cron, start, 6)
        assert fires[0] > start
        assert all(earlier < later for earlier, later in pairwise(fires))
        for fire in fires:
            assert fire.tzinfo is UTC
            assert fire.second == 0 and fire.microsecond == 0
            assert cron.next_after(fire - timedelta(microseconds=1)) == fire


    @settings(max_examples=50, deadline=None)
    @given(data=st.data(), expression=expressions(), zone=st.sampled_from(ZONES))
    def test_latest_at_or_before_is_the_slot_before(self, data: st.DataObject,
                                                    expression: str, zone: str) -> None:
        """The newest slot at or before a moment is a slot, and the next slot is after the
        moment (none lies between)."""
        try:
            cron = Cron(expression, timezone=zone)
        except InvalidSchedule:
            assume(False)
        moment = data.draw(starts(zone))
        latest = cron.latest_at_or_before(moment)
        assert latest <= moment < cron.next_after(latest)
        assert cron.next_after(latest - timedelta(microseconds=1)) == latest
        assert cron.latest_at_or_before(latest) == latest


class TestDaylightSaving:
    def test_paris_spring_gap_fires_at_the_end_of_the_gap(self) -> None:
        """02:30 does not exist in Paris on 2026-03-29: that day's slot fires at 03:00 CEST,
        the first instant after the gap; the days around keep 02:30."""
        cron = Cron("30 2 * * *", timezone="Europe/Paris")
        assert next_fires(cron, utc(2026, 3, 27, 12), 3) == [
            local(PARIS, 2026, 3, 28, 2, 30).astimezone(UTC),
            utc(2026, 3, 29, 1, 0),
            local(PARIS, 2026, 3, 30, 2, 30).astimezone(UTC),
        ]

    def test_slots_of_a_gap_fire_once(self) -> None:
        """Every slot of the gap and the 03:00 slot are one instant: it fires once."""
        cron = Cron("*/15 2,3 * * *", timezone="Europe/Paris")
        fires = next_fires(cron, utc(2026, 3, 29, 0, 0), 4)
        assert [fire.astimezone(PARIS).strftime("%H:%M%z") for fire in fires] == [
            "03:00+0200", "03:15+0200", "03:30+0200", "03:45+0200"]

    def test_an_hourly_slot_in_the_gap_fires_at_its_end(self) -> None:
        """`1 * * * *` on Paris's spring day 2024: 01:01 CET, then 02:01 (which does not
        exist) at 03:00 CEST, then 03:01 CEST. (croniter skips 02:01 instead.)"""
        fires = next_fires(Cron("1 * * * *", timezone="Europe/Paris"), utc(2024, 3, 31), 3)
        assert fires == [utc(2024, 3, 31, 0, 1), utc(2024, 3, 31, 1, 0), utc(2024, 3, 31, 1, 1)]

    def test_paris_fall_back_fires_the_repeated_hour_once(self) -> None:
        """02:00-02:59 happens twice in Paris on 2026-10-25: each slot fires at its first
        occurrence (CEST) and not again in the repeated hour (CET)."""
        cron = Cron("*/20 2 * * *", timezone="Europe/Paris")
        assert next_fires(cron, utc(2026, 10, 24, 12), 4) == [
            utc(2026, 10, 25, 0, 0), utc(2026, 10, 25, 0, 20), utc(2026, 10, 25, 0, 40),
            local(PARIS, 2026, 10, 26, 2, 0).astimezone(UTC),
        ]

    def test_from_inside_the_repeated_hour(self) -> None:
        """Asked from the second 02:10 (CET), the next fire is 03:00 CET: 02:20 and 02:40
        already fired at their first occurrence."""
        cron = Cron("*/20 * * * *", timezone="Europe/Paris")
        second_0210 = local(PARIS, 2026, 10, 25, 2, 10, fold=1)
        assert second_0210.astimezone(UTC) == utc(2026, 10, 25, 1, 10)
        assert cron.next_after(second_0210) == utc(2026, 10, 25, 2, 0)

    def test_latest_at_or_before_around_the_transitions(self) -> None:
        """From the second 02:10 (CET) the newest slot is the first 02:40 (CEST); just after
        the spring gap it is the gap's end, where the gap's slots fired."""
        cron = Cron("*/20 2 * * *", timezone="Europe/Paris")
        second_0210 = local(PARIS, 2026, 10, 25, 2, 10, fold=1)
        assert cron.latest_at_or_before(second_0210) == utc(2026, 10, 25, 0, 40)
        assert cron.latest_at_or_before(utc(2026, 3, 29, 1, 5)) == utc(2026, 3, 29, 1, 0)
        assert cron.latest_at_or_before(utc(2026, 3, 29, 0, 59)) == (
            local(PARIS, 2026, 3, 28, 2, 40).astimezone(UTC))

    def test_new_york_spring_and_fall(self) -> None:
        """New York: 02:30 on 2026-03-08 fires at 03:00 EDT; 01:30 on 2026-11-01 fires once,
        in EDT."""
        cron = Cron("30 1,2 * * *", timezone="America/New_York")
        assert next_fires(cron, local(NEW_YORK, 2026, 3, 8, 0, 0), 3) == [
            local(NEW_YORK, 2026, 3, 8, 1, 30).astimezone(UTC),
            local(NEW_YORK, 2026, 3, 8, 3, 0).astimezone(UTC),
            local(NEW_YORK, 2026, 3, 9, 1, 30).astimezone(UTC),
        ]
        assert next_fires(cron, local(NEW_YORK, 2026, 11, 1, 0, 0), 3) == [
            utc(2026, 11, 1, 5, 30),  # 01:30 EDT (-4)
            utc(2026, 11, 1, 7, 30),  # 02:30 EST (-5); 01:30 EST is not fired again
            utc(2026, 11, 2, 6, 30),
        ]

    def test_lord_howe_half_hour_shift(self) -> None:
        """Lord Howe moves its clock by 30 minutes: 02:00-02:29 does not exist on
        2026-10-04 (02:15 fires at 02:30 +11), and 01:30-01:59 repeats on 2026-04-05 (01:45
        fires once, at +11)."""
        spring = Cron("15 2 * * *", timezone="Australia/Lord_Howe")
        assert spring.next_after(local(LORD_HOWE, 2026, 10, 4, 0, 0)) == (
            local(LORD_HOWE, 2026, 10, 4, 2, 30).astimezone(UTC))
        assert local(LORD_HOWE, 2026, 10, 4, 2, 30).utcoffset() == timedelta(hours=11)
        fall = Cron("45 1 * * *", timezone="Australia/Lord_Howe")
        first, following = next_fires(fall, local(LORD_HOWE, 2026, 4, 5, 0, 0), 2)
        assert first == utc(2026, 4, 4, 14, 45)  # 01:45 +11:00
        assert following == local(LORD_HOWE, 2026, 4, 6, 1, 45).astimezone(UTC)

    def test_kolkata_has_a_half_hour_offset_and_no_dst(self) -> None:
        cron = Cron("0 9 * * *", timezone="Asia/Kolkata")
        assert next_fires(cron, utc(2026, 6, 1), 2) == [utc(2026, 6, 1, 3, 30),
                                                        utc(2026, 6, 2, 3, 30)]

    @pytest.mark.parametrize("zone", ZONES)
    def test_a_daily_entry_fires_once_every_day_of_a_year(self, zone: str) -> None:
        """Whatever the transitions, a daily 02:30 entry fires once per local day."""
        cron = Cron("30 2 * * *", timezone=zone)
        fires = next_fires(cron, utc(2026, 1, 1), 365)
        days = [fire.astimezone(ZoneInfo(zone)).date() for fire in fires]
        assert len(set(days)) == 365


class TestFields:
    def test_day_of_month_or_day_of_week_when_both_are_restricted(self) -> None:
        """`0 0 1 * mon` fires on the 1st and on Mondays (cron's rule; Celery's is AND)."""
        fires = next_fires(Cron("0 0 1 * mon"), utc(2026, 6, 1), 4)
        assert [fire.day for fire in fires] == [8, 15, 22, 29]  # June 1st 2026 is a Monday
        fires = next_fires(Cron("0 0 1 * mon"), utc(2026, 6, 29, 1), 2)
        assert [(fire.month, fire.day) for fire in fires] == [(7, 1), (7, 6)]

    def test_only_the_restricted_day_field_counts(self) -> None:
        assert [f.day for f in next_fires(Cron("0 0 13 * *"), utc(2026, 1, 1), 2)] == [13, 13]
        assert [f.weekday() for f in next_fires(Cron("0 0 * * fri"), utc(2026, 1, 1), 3)] == [4] * 3

    def test_names_sunday_seven_wrap_and_start_step(self) -> None:
        """Names in any case, 7 as Sunday, a wrapping range and `N/STEP` all expand."""
        assert Cron("0 0 * * 7") == Cron("0 0 * * 7") != Cron("0 0 * * 0")  # text compares
        assert next_fires(Cron("0 0 * * 7"), utc(2026, 1, 1), 1) == next_fires(
            Cron("0 0 * * SUN"), utc(2026, 1, 1), 1) == [utc(2026, 1, 4)]
        fires = next_fires(Cron("0 0 * * fri-mon"), utc(2026, 1, 1), 5)
        assert [fire.strftime("%a") for fire in fires] == ["Fri", "Sat", "Sun", "Mon", "Fri"]
        fires = next_fires(Cron("5/20 22-1 * * *"), utc(2026, 1, 1, 0, 30), 4)
        assert [fire.strftime("%H:%M") for fire in fires] == ["00:45", "01:05", "01:25",
                                                              "01:45"]
        assert Cron("0 0 1 JANUARY,jul *").next_after(utc(2026, 2, 1)) == utc(2026, 7, 1)

    def test_leap_day_is_found_without_scanning_minutes(self) -> None:
        """29 February 2100 does not exist: the next after 2097 is 2104 (skips by field)."""
        started = time.perf_counter()
        assert next_fires(Cron("0 0 29 2 *"), utc(2097, 3, 1), 2) == [utc(2104, 2, 29),
                                                                      utc(2108, 2, 29)]
        assert time.perf_counter() - started < 1.0  # a minute scan would take minutes

    def test_whitespace_is_collapsed(self) -> None:
        assert Cron("  */5   *  * * * ").expression == "*/5 * * * *"

    def test_strictly_after(self) -> None:
        cron = Cron("*/5 * * * *")
        assert cron.next_after(utc(2026, 1, 1, 0, 5)) == utc(2026, 1, 1, 0, 10)
        assert cron.next_after(utc(2026, 1, 1, 0, 4, 59, 999999)) == utc(2026, 1, 1, 0, 5)
        paris_moment = local(PARIS, 2026, 1, 1, 1, 2)
        assert cron.next_after(paris_moment) == utc(2026, 1, 1, 0, 5)

    def test_latest_at_or_before(self) -> None:
        cron = Cron("*/5 * * * *")
        assert cron.latest_at_or_before(utc(2026, 1, 1, 0, 5)) == utc(2026, 1, 1, 0, 5)
        assert cron.latest_at_or_before(utc(2026, 1, 1, 0, 9, 59)) == utc(2026, 1, 1, 0, 5)
        assert Cron("0 0 29 2 *").latest_at_or_before(utc(2104, 2, 28)) == utc(2096, 2, 29)
        with pytest.raises(InvalidSchedule, match="naive datetime"):
            cron.latest_at_or_before(datetime(2026, 1, 1))

    def test_fires_iterates(self) -> None:
        fires = Cron("0 * * * *").fires(utc(2026, 1, 1))
        assert [next(fires) for _ in range(3)] == [utc(2026, 1, 1, hour) for hour in (1, 2, 3)]


class TestValidation:
    @pytest.mark.parametrize(("expression", "says"), [
        ("* * * *", "has 4 fields; expected 5"),
        ("* * * * * *", "has 6 fields"),
        ("60 * * * *", "minute '60': 60 is out of range 0-59"),
        ("* 24 * * *", "hour '24'"),
        ("* * 0 * *", "day of month '0': 0 is out of range 1-31"),
        ("* * * 13 *", "month '13'"),
        ("* * * * 8", "day of week '8': 8 is out of range 0-7"),
        ("*/0 * * * *", "a step of 0"),
        ("1-5/2/3 * * * *", "cannot parse '1-5/2/3'"),
        ("1-2-3 * * * *", "cannot parse"),
        ("-1 * * * *", "cannot parse"),
        (", * * * *", "cannot parse ''"),
        ("* * * mon *", "month 'mon': 'mon' is not a number or a name"),
        ("* * * * jan", "day of week 'jan'"),
        ("x * * * *", "minute 'x': 'x' is not a number"),
        ("0 0 30 2 *", "never fires: no month it names has day 30"),
        ("0 0 31 4,6,9,11 *", "never fires"),
        ("@daily", "has 1 fields"),
    ])
    def test_bad_expressions_name_the_field(self, expression: str, says: str) -> None:
        with pytest.raises(InvalidSchedule) as raised:
            Cron(expression)
        assert says in str(raised.value)

    def test_feb_29_and_day_31_with_another_month_are_valid(self) -> None:
        Cron("0 0 29 2 *")
        Cron("0 0 31 2,3 *")
        Cron("0 0 31 2 mon")  # either day field: Mondays of February

    @pytest.mark.parametrize("zone", ["Mars/Olympus", "", "../etc/passwd", "Europe/", 5])
    def test_unknown_time_zone(self, zone: object) -> None:
        with pytest.raises(InvalidSchedule, match="time zone"):
            Cron("* * * * *", timezone=zone)  # type: ignore[arg-type]

    def test_not_a_string(self) -> None:
        with pytest.raises(InvalidSchedule, match="is a string"):
            Cron(5)  # type: ignore[arg-type]

    def test_invalid_schedule_is_a_value_error(self) -> None:
        with pytest.raises(ValueError):
            Cron("nope")

    def test_naive_moment_is_refused(self) -> None:
        with pytest.raises(InvalidSchedule, match="naive datetime"):
            Cron("* * * * *").next_after(datetime(2026, 1, 1))

    def test_next_fires_counts(self) -> None:
        assert next_fires(Cron("* * * * *"), utc(2026, 1, 1), 0) == []
        with pytest.raises(ValueError):
            next_fires(Cron("* * * * *"), utc(2026, 1, 1), -1)


class TestFromCelery:
    def test_a_celery_crontab_becomes_its_expression(self) -> None:
        cron = Cron.from_celery(crontab(minute="*/15", hour="9-17", day_of_week="mon-fri"),
                                timezone="Europe/Paris")
        assert cron == Cron("*/15 9-17 * * mon-fri", timezone="Europe/Paris")

    def test_both_day_fields_restricted_is_refused(self) -> None:
        with pytest.raises(InvalidSchedule, match="both match"):
            Cron.from_celery(crontab(minute=0, hour=0, day_of_month=1, day_of_week="mon"))
