"""Crontab schedules in a time zone: `Cron("30 2 * * mon-fri", timezone="Europe/Paris")`.

An expression has the five classic fields, `minute hour day-of-month month day-of-week`.
Each field is `*`, a number, a range `a-b`, any of these with a step (`*/15`, `8-18/2`,
`5/10` = `5-59/10`), or a comma list of them. Months and week days may be named (`jan`..`dec`,
`sun`..`sat`, or the full English names, any case); day of week 0 and 7 are both Sunday. A
range whose end is below its start wraps around (`fri-mon`, `22-2`), as in Celery's
`crontab`. The field syntax is expanded by Celery's own `crontab_parser`, after a strict
check of each part (Celery's parser quietly ignores trailing text such as the `/3` of
`1-5/2/3`).

Day of month and day of week combine as in cron (and croniter): when both are restricted
(neither is exactly `*`), a day matches if EITHER matches — `0 0 1 * mon` fires on the 1st
and on every Monday; a field naming every day is restricted too (`0 0 1-31 * mon` is
daily). Celery's `crontab` requires both instead; a Celery entry restricting both days has
no five-field equivalent (`from_celery` refuses it).

Time zones and daylight saving time. Slots are local wall-clock times in the entry's time
zone (IANA name, `zoneinfo`). A slot fires at the first instant at which the local clock
shows that time or later:

- a local time that does not exist (spring forward: Paris skips 02:00-02:59 on the last
  Sunday of March) fires at the first instant after the gap, 03:00 local; the slots of the
  gap and a 03:00 slot are then the same instant and fire once;
- a local time that occurs twice (fall back: Paris lives 02:00-02:59 twice in October)
  fires once, at its first occurrence; the repeated hour fires nothing again.

So every day of a daily entry fires exactly once, and fire times strictly increase.
"""

from __future__ import annotations

import calendar
import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celery.schedules import crontab_parser

from resilience.schedules.errors import InvalidSchedule

UTC = timezone.utc

_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_MONTH_NAMES = {name: number for number, name in enumerate(_MONTHS, start=1)}
_MONTH_NAMES.update(
    (full, _MONTH_NAMES[full[:3]])
    for full in (
        "january", "february", "march", "april", "june", "july", "august", "september",
        "october", "november", "december",
    )
)
_DAY_NAMES = {name: number for number, name in enumerate(
    ("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
_DAY_NAMES.update(
    (full, _DAY_NAMES[full[:3]])
    for full in ("sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday")
)

# One part of a comma list: `*`, `a` or `a-b`, then an optional `/step` (checked whole, since
# Celery's parser matches prefixes only).
_PART = re.compile(r"(?:\*|([0-9a-z]+)(?:-([0-9a-z]+))?)(?:/([0-9]+))?")


@dataclass(frozen=True)
class _Field:
    """One crontab field: its name (for messages), bounds and the names it accepts."""

    label: str
    low: int
    high: int
    names: dict[str, int] | None = None


_FIELDS = (
    _Field("minute", 0, 59),
    _Field("hour", 0, 23),
    _Field("day of month", 1, 31),
    _Field("month", 1, 12, _MONTH_NAMES),
    # 7 is Sunday too (cron's habit); expanded over 0-7, then folded onto 0.
    _Field("day of week", 0, 7, _DAY_NAMES),
)

# A leap day recurs within 8 years (1896 -> 1904); no valid expression needs longer.
_SEARCH_YEARS = 9


class Schedule(Protocol):
    """What `next_fires` needs of a schedule: its first slot strictly after a moment."""

    def next_after(self, moment: datetime) -> datetime: ...


@dataclass(frozen=True)
class Cron:
    """A five-field crontab expression whose slots are wall-clock times in `timezone`.

    Args:
        expression: `minute hour day-of-month month day-of-week`, e.g. `*/5 * * * *`.
        timezone: an IANA time zone name (`Europe/Paris`); UTC by default.

    Raises:
        InvalidSchedule: the expression does not parse, never fires (`0 0 30 2 *`), or the
            time zone is unknown. The message names the field and the value at fault.
    """

    expression: str
    timezone: str = "UTC"
    _minutes: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _hours: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _days: frozenset[int] = field(init=False, repr=False, compare=False)
    _months: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _weekdays: frozenset[int] = field(init=False, repr=False, compare=False)
    _day_rule: str = field(init=False, repr=False, compare=False)
    _zone: ZoneInfo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.expression, str):
            raise InvalidSchedule(
                f"a cron expression is a string, not {type(self.expression).__name__}")
        if not isinstance(self.timezone, str) or not self.timezone:
            raise InvalidSchedule(f"a time zone is an IANA name such as 'Europe/Paris', "
                                  f"not {self.timezone!r}")
        given = self.expression.split()
        if len(given) != 5:
            raise InvalidSchedule(
                f"cron expression {self.expression!r} has {len(given)} fields; expected 5: "
                "minute hour day-of-month month day-of-week", expression=self.expression)
        object.__setattr__(self, "expression", " ".join(given))
        texts = [text.lower() for text in given]
        minutes, hours, days, months, weekdays = (
            _expand(text, spec, self.expression)
            for text, spec in zip(texts, _FIELDS, strict=True))
        weekdays = {day % 7 for day in weekdays}
        object.__setattr__(self, "_minutes", tuple(sorted(minutes)))
        object.__setattr__(self, "_hours", tuple(sorted(hours)))
        object.__setattr__(self, "_days", frozenset(days))
        object.__setattr__(self, "_months", tuple(sorted(months)))
        object.__setattr__(self, "_weekdays", frozenset(weekdays))
        # cron's rule: both day fields restricted -> either matches; else the restricted one.
        day_rule = ("either" if texts[2] != "*" and texts[4] != "*"
                    else "weekday" if texts[2] == "*" else "day")
        object.__setattr__(self, "_day_rule", day_rule)
        if day_rule == "day" and not any(
                min(days) <= _longest_month(month) for month in months):
            raise InvalidSchedule(
                f"cron expression {self.expression!r} never fires: no month it names has "
                f"day {min(days)}", expression=self.expression)
        object.__setattr__(self, "_zone", _zone(self.timezone))

    @classmethod
    def from_celery(cls, schedule: Any, timezone: str = "UTC") -> Cron:
        """The `Cron` of a Celery `crontab` (as written in a beat schedule).

        Raises:
            InvalidSchedule: the crontab restricts both day of month and day of week (Celery
                requires both to match; five-field cron requires either).
        """
        texts = [str(getattr(schedule, f"_orig_{name}")) for name in (
            "minute", "hour", "day_of_month", "month_of_year", "day_of_week")]
        if texts[2] != "*" and texts[4] != "*":
            raise InvalidSchedule(
                f"crontab with day_of_month={texts[2]!r} and day_of_week={texts[4]!r} fires "
                "only when both match, which a five-field cron expression cannot say")
        return cls(" ".join(texts), timezone=timezone)

    def next_after(self, moment: datetime) -> datetime:
        """The first slot strictly after `moment`, as an aware UTC datetime.

        Args:
            moment: an aware datetime (any time zone).

        Raises:
            InvalidSchedule: `moment` is naive (its time zone would be a guess).
        """
        if moment.tzinfo is None or moment.utcoffset() is None:
            raise InvalidSchedule(f"a naive datetime cannot place a slot: {moment!r} (give an "
                                  "aware datetime; UTC is datetime.UTC)")
        after = moment.astimezone(UTC)
        wall = after.astimezone(self._zone).replace(
            tzinfo=None, second=0, microsecond=0, fold=0)
        # The instant of a wall time never decreases as the wall time grows, and a wall time
        # before `moment`'s own has its instant at or before `moment`: start there. Only the
        # repeated hour of a fall back (whose slots fired at their first occurrence) or the
        # slot of `moment`'s own minute make this loop turn more than once.
        while True:
            wall = self._next_wall(wall)
            instant = _instant(wall, self._zone)
            if instant > after:
                return instant
            wall += timedelta(minutes=1)

    def latest_at_or_before(self, moment: datetime) -> datetime:
        """The newest slot at or before `moment`, as an aware UTC datetime (the catch-up's
        "newest missed slot" without walking every slot since the last fire).

        Raises:
            InvalidSchedule: `moment` is naive.
        """
        if moment.tzinfo is None or moment.utcoffset() is None:
            raise InvalidSchedule(f"a naive datetime cannot place a slot: {moment!r} (give an "
                                  "aware datetime; UTC is datetime.UTC)")
        at = moment.astimezone(UTC)
        shown = at.astimezone(self._zone)
        wall = shown.replace(tzinfo=None, second=0, microsecond=0, fold=0)
        if shown.fold:
            # The second pass of a repeated hour: every wall time of that hour fired at its
            # first occurrence, before `moment`; start from the hour's end.
            first = wall.replace(tzinfo=self._zone)
            wall += first.utcoffset() - shown.utcoffset()
        while True:
            wall = self._previous_wall(wall)
            instant = _instant(wall, self._zone)
            if instant <= at:
                return instant
            wall -= timedelta(minutes=1)

    def count_between(self, after: datetime, until: datetime) -> int:
        """How many slots fall in (after, until]: a whole local day with no UTC-offset
        change counts its matching days' hours x minutes; only the partial first and last
        days and a day with a transition are walked, so a year costs ~365 steps.

        Raises:
            InvalidSchedule: a naive datetime.
        """
        for moment in (after, until):
            if moment.tzinfo is None or moment.utcoffset() is None:
                raise InvalidSchedule(f"a naive datetime cannot place a slot: {moment!r}")
        start, end = after.astimezone(UTC), until.astimezone(UTC)
        if end <= start:
            return 0
        zone, tick = self._zone, timedelta(microseconds=1)
        first = start.astimezone(zone).date() + timedelta(days=1)
        last = end.astimezone(zone).date()
        if first >= last:
            return self._walk(start, end)

        def day_start(day: Any) -> datetime:
            return _instant(datetime(day.year, day.month, day.day), zone)

        count = self._walk(start, day_start(first) - tick)
        per_day = len(self._hours) * len(self._minutes)
        day = first
        while day < last:
            following = day + timedelta(days=1)
            if day.month in self._months and self._day_matches(day.year, day.month, day.day):
                midnight = datetime(day.year, day.month, day.day)
                if zone.utcoffset(midnight) == zone.utcoffset(midnight + timedelta(days=1)) \
                        == zone.utcoffset(midnight + timedelta(hours=12)):
                    count += per_day
                else:
                    count += self._walk(day_start(day) - tick, day_start(following) - tick)
            day = following
        return count + self._walk(day_start(last) - tick, end)

    def _walk(self, after: datetime, until: datetime) -> int:
        count, moment = 0, self.next_after(after)
        while moment <= until:
            count += 1
            moment = self.next_after(moment)
        return count

    def fires(self, after: datetime) -> Iterator[datetime]:
        """The slots strictly after `after`, in order, without end (aware UTC datetimes)."""
        moment = after
        while True:
            moment = self.next_after(moment)
            yield moment

    def _next_wall(self, wall: datetime) -> datetime:
        """The first naive local time at or after `wall` that the fields match.

        Skips by field: a month that does not match jumps to the next one that does, a day
        to the next matching day of the month, an hour to the next matching hour.
        """
        limit = wall.year + _SEARCH_YEARS
        while wall.year <= limit:
            month_index = bisect_left(self._months, wall.month)
            if month_index == len(self._months):
                wall = datetime(wall.year + 1, self._months[0], 1)
                continue
            if self._months[month_index] != wall.month:
                wall = datetime(wall.year, self._months[month_index], 1)
            day = self._first_day(wall.year, wall.month, wall.day)
            if day is None:
                wall = _first_of_next_month(wall)
                continue
            if day != wall.day:
                wall = datetime(wall.year, wall.month, day)
            hour_index = bisect_left(self._hours, wall.hour)
            if hour_index == len(self._hours):
                wall = datetime(wall.year, wall.month, wall.day) + timedelta(days=1)
                continue
            if self._hours[hour_index] != wall.hour:
                wall = wall.replace(hour=self._hours[hour_index], minute=0)
            minute_index = bisect_left(self._minutes, wall.minute)
            if minute_index == len(self._minutes):
                wall = wall.replace(minute=0) + timedelta(hours=1)
                continue
            return wall.replace(minute=self._minutes[minute_index])
        # Unreachable for a validated expression (every one fires within _SEARCH_YEARS).
        raise InvalidSchedule(f"cron expression {self.expression!r} never fires",
                              expression=self.expression)

    def _previous_wall(self, wall: datetime) -> datetime:
        """The last naive local time at or before `wall` that the fields match (skips by
        field, as `_next_wall` does forward)."""
        limit = wall.year - _SEARCH_YEARS
        while wall.year >= limit:
            month_index = bisect_right(self._months, wall.month) - 1
            if month_index < 0:
                wall = _last_minute(wall.year - 1, self._months[-1])
                continue
            if self._months[month_index] != wall.month:
                wall = _last_minute(wall.year, self._months[month_index])
            day = self._last_day(wall.year, wall.month, wall.day)
            if day is None:
                wall = datetime(wall.year, wall.month, 1) - timedelta(minutes=1)
                continue
            if day != wall.day:
                wall = datetime(wall.year, wall.month, day, 23, 59)
            hour_index = bisect_right(self._hours, wall.hour) - 1
            if hour_index < 0:
                wall = datetime(wall.year, wall.month, wall.day) - timedelta(minutes=1)
                continue
            if self._hours[hour_index] != wall.hour:
                wall = wall.replace(hour=self._hours[hour_index], minute=59)
            minute_index = bisect_right(self._minutes, wall.minute) - 1
            if minute_index < 0:
                wall = wall.replace(minute=0) - timedelta(minutes=1)
                continue
            return wall.replace(minute=self._minutes[minute_index])
        raise InvalidSchedule(f"cron expression {self.expression!r} never fires",
                              expression=self.expression)

    def _first_day(self, year: int, month: int, start: int) -> int | None:
        """The first day of `year`-`month` from `start` on that the day fields match."""
        length = calendar.monthrange(year, month)[1]
        for day in range(start, length + 1):
            if self._day_matches(year, month, day):
                return day
        return None

    def _last_day(self, year: int, month: int, end: int) -> int | None:
        """The last day of `year`-`month` up to `end` that the day fields match."""
        for day in range(min(end, calendar.monthrange(year, month)[1]), 0, -1):
            if self._day_matches(year, month, day):
                return day
        return None

    def _day_matches(self, year: int, month: int, day: int) -> bool:
        if self._day_rule == "day":
            return day in self._days
        # date.weekday() counts Monday as 0; cron counts Sunday as 0.
        weekday = (calendar.weekday(year, month, day) + 1) % 7
        if self._day_rule == "weekday":
            return weekday in self._weekdays
        return day in self._days or weekday in self._weekdays


def next_fires(every: Schedule, after: datetime, n: int = 5) -> list[datetime]:
    """The next `n` slots of `every` strictly after `after` (aware UTC datetimes, increasing).

    Args:
        every: a `Cron`, or any schedule with `next_after(moment) -> datetime`.
        after: an aware datetime.
        n: how many slots (0 or more).
    """
    if n < 0:
        raise ValueError(f"next_fires needs n >= 0, not {n}")
    fires: list[datetime] = []
    moment = after
    for _ in range(n):
        moment = every.next_after(moment)
        fires.append(moment)
    return fires


def _expand(text: str, spec: _Field, expression: str) -> set[int]:
    """The values one field's text names, checked strictly, expanded by Celery's parser."""
    def invalid(reason: str) -> InvalidSchedule:
        return InvalidSchedule(f"cron expression {expression!r}: {spec.label} {text!r}: {reason}",
                               expression=expression, field=spec.label)

    numeric: list[str] = []
    for part in text.split(","):
        match = _PART.fullmatch(part)
        if match is None:
            raise invalid(f"cannot parse {part!r} (expected *, N or N-M, each with an "
                          "optional /STEP)")
        start, end, step = match.groups()
        if step is not None and int(step) == 0:
            raise invalid("a step of 0")
        bounds = [_number(token, spec, invalid) for token in (start, end) if token is not None]
        if end is None and step is not None and start is not None:
            bounds.append(spec.high)  # `N/STEP` steps from N to the field's end, as in cron
        rewritten = "*" if start is None else "-".join(str(bound) for bound in bounds)
        numeric.append(rewritten if step is None else f"{rewritten}/{int(step)}")
    try:
        return crontab_parser(spec.high - spec.low + 1, spec.low).parse(",".join(numeric))
    except ValueError as exc:  # also Celery's ParseException
        raise invalid(str(exc)) from None


def _number(token: str, spec: _Field, invalid: Any) -> int:
    """A field's number or name as its number, within the field's bounds."""
    if token.isdigit():
        value = int(token)
    elif spec.names is not None and token in spec.names:
        value = spec.names[token]
    else:
        raise invalid(f"{token!r} is not a number"
                      + (f" or a name ({', '.join(list(spec.names)[:7])}, ...)"
                         if spec.names else ""))
    if not spec.low <= value <= spec.high:
        raise invalid(f"{value} is out of range {spec.low}-{spec.high}")
    return value


def _zone(name: str) -> ZoneInfo:
    """The `ZoneInfo` of an IANA name, or InvalidSchedule."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise InvalidSchedule(f"unknown time zone {name!r} (expected an IANA name such as "
                              "'Europe/Paris')", timezone=name) from exc


def _longest_month(month: int) -> int:
    """The most days `month` can have (February: 29)."""
    return 29 if month == 2 else calendar.monthrange(2001, month)[1]


def _last_minute(year: int, month: int) -> datetime:
    """23:59 on the last day of `year`-`month`."""
    return datetime(year, month, calendar.monthrange(year, month)[1], 23, 59)


def _first_of_next_month(wall: datetime) -> datetime:
    return datetime(wall.year + wall.month // 12, wall.month % 12 + 1, 1)


def _instant(wall: datetime, zone: ZoneInfo) -> datetime:
    """The first instant (UTC) at which the clock of `zone` shows `wall` or later.

    An existing local time: its instant (the first of two in a fall back, fold=0). A local
    time in a spring-forward gap: the transition, the first instant after the gap.
    """
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if first.astimezone(zone).replace(tzinfo=None) == wall:
        return first
    # In a gap, fold=0 reads the wall time with the offset from before the transition (an
    # instant after the gap) and fold=1 with the offset from after it (an instant before):
    # the transition lies between; find it to the second.
    late = int(first.timestamp())
    early = int(wall.replace(tzinfo=zone, fold=1).astimezone(UTC).timestamp())
    late_offset = datetime.fromtimestamp(late, zone).utcoffset()
    while late - early > 1:
        middle = (early + late) // 2
        if datetime.fromtimestamp(middle, zone).utcoffset() == late_offset:
            late = middle
        else:
            early = middle
    return datetime.fromtimestamp(late, UTC)
