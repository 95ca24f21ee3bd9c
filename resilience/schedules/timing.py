"""When a schedule fires: `Interval` entries, the slot arithmetic, and `next_fires`.

Slots are wall-clock instants. An interval entry's slots are the multiples of its period
since the Unix epoch (a 2 s entry fires at :00, :02, :04 ..., whoever leads and whenever it
started), so every beat process computes the same slots and two of them can never disagree
about which slot is due. A cron entry's slots are its fire times in its time zone
(`resilience.schedules.cron.Cron`). Slot times are kept to the microsecond (PostgreSQL's
`timestamptz`), so the slot a row records is the slot the scheduler computes again.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from resilience.schedules.errors import InvalidSchedule

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class Interval:
    """Every `seconds` seconds, on the multiples of `seconds` since the epoch.

    Args:
        seconds: the period, > 0 and at least a millisecond.

    Raises:
        InvalidSchedule: a period that is not a finite number >= 0.001.
    """

    seconds: float

    def __post_init__(self) -> None:
        seconds = self.seconds
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) \
                or not math.isfinite(seconds) or seconds < 0.001:
            raise InvalidSchedule(f"an interval must be a number of seconds >= 0.001, "
                                  f"got {seconds!r}")
        object.__setattr__(self, "seconds", float(seconds))

    @property
    def period_microseconds(self) -> int:
        """The period in whole microseconds (the slot arithmetic's unit)."""
        return max(1, round(self.seconds * 1_000_000))

    def latest_at_or_before(self, moment: dt.datetime) -> dt.datetime:
        """The newest slot <= `moment`."""
        period = self.period_microseconds
        return _from_micros((_micros(moment) // period) * period)

    def next_after(self, moment: dt.datetime) -> dt.datetime:
        """The first slot strictly after `moment` (aware, UTC)."""
        period = self.period_microseconds
        return _from_micros((_micros(moment) // period + 1) * period)

    def describe(self) -> str:
        """`every 2s`, as listings print it."""
        return f"every {self.seconds:g}s"


def _micros(moment: dt.datetime) -> int:
    if moment.tzinfo is None:
        raise InvalidSchedule(f"a naive datetime cannot place a slot: {moment!r} (give a "
                              "time zone; UTC is datetime.UTC)")
    delta = moment - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _from_micros(micros: int) -> dt.datetime:
    return EPOCH + dt.timedelta(microseconds=micros)


#: Up to this limit, a cron entry's slots are walked (a few steps) rather than counted by day.
_WALK_LIMIT = 1000


def slot_count(every: Any, after: dt.datetime, until: dt.datetime, limit: int) -> int:
    """How many slots fall in (after, until]: exact for an interval, and for a cron entry
    when `limit` is large (`Cron.count_between`, by whole days); else walked, at most
    `limit` + 1 (more than `limit` means "more than `limit`": `limit=1` asks "any?")."""
    if until <= after:
        return 0
    if isinstance(every, Interval):
        period = every.period_microseconds
        return max(0, _micros(until) // period - _micros(after) // period)
    counted = getattr(every, "count_between", None)
    if counted is not None and limit > _WALK_LIMIT:
        return counted(after, until)
    count = 0
    for _ in slots_between(every, after, until):
        count += 1
        if count > limit:
            break
    return count


def slots_between(every: Any, after: dt.datetime, until: dt.datetime) -> Iterator[dt.datetime]:
    """The slots in (after, until], oldest first (lazily: a long range costs what is read)."""
    moment = every.next_after(after)
    while moment <= until:
        yield moment
        moment = every.next_after(moment)


def newest_slots(every: Any, after: dt.datetime, until: dt.datetime,
                 n: int) -> list[dt.datetime]:
    """The newest `n` slots in (after, until], oldest first: found backward from `until`
    (`latest_at_or_before`), so a long range costs `n` steps, not one per slot in it."""
    if isinstance(every, Interval):
        newest = every.latest_at_or_before(until)
        step = dt.timedelta(microseconds=every.period_microseconds)
        found = []
        moment = newest
        while moment > after and len(found) < n:
            found.append(moment)
            moment -= step
        return found[::-1]
    found = []
    moment = until
    while len(found) < n:
        moment = every.latest_at_or_before(moment)
        if moment <= after:
            break
        found.append(moment)
        moment -= _TICK
    return found[::-1]


#: One microsecond: slots are whole microseconds, so the slot before `s` is at or before
#: `s - _TICK`.
_TICK = dt.timedelta(microseconds=1)
