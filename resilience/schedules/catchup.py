"""Which due slots fire and which are recorded missed: the catch-up decision, pure.

At each tick the leader asks `plan` about every entry that is not paused. The due slots are
those in (last_slot, now]. A slot that fell while this leader led and the entry was active
(slot >= `on_time_since`: the later of the leader's start and the entry's last resume)
fires, late or not: the leader owed it. A slot before that was missed (no leader ran, or
the entry was paused), and the entry's catch-up policy decides:

    slots:    m1    m2    m3  | leader starts   n (on time)
    skip:     miss  miss  miss                  fire
    once:     miss  miss  FIRE                  fire
    all:      FIRE  FIRE  FIRE  (oldest first; those older than the window: miss)

Recording is bounded: at most `RECORD_LIMIT` missed slots get a row each (the newest); the
oldest recorded row's detail counts the rest (`also_missed`), so a week-long outage of a
0.1 s entry writes a hundred rows, not six million. A tick fires at most `FIRE_LIMIT` slots
of an entry (oldest first); `last_slot` then stops at the last one fired and the next tick
goes on from there.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from resilience.schedules.policies import CatchUp
from resilience.schedules.timing import newest_slots, slot_count, slots_between

#: Missed slots recorded one row each per catch-up (the newest); the rest are counted.
RECORD_LIMIT = 100
#: Slots an `all` catch-up fires per tick; the next tick fires the next ones.
FIRE_LIMIT = 100


@dataclass(frozen=True)
class Plan:
    """What one tick does for one entry.

    Args:
        fire: slots to fire, oldest first, each with why ("on_time" or "catch_up").
        missed: slots to record as missed, oldest first.
        also_missed: missed slots older than those in `missed`, not recorded one by one.
        last_slot: the entry's new last_slot (the newest slot dealt with).
    """

    fire: list[tuple[dt.datetime, str]] = field(default_factory=list)
    missed: list[dt.datetime] = field(default_factory=list)
    also_missed: int = 0
    last_slot: dt.datetime | None = None

    @property
    def empty(self) -> bool:
        """Nothing to do this tick."""
        return self.last_slot is None


NOTHING = Plan()


def plan(every: Any, last_slot: dt.datetime | None, now: dt.datetime,
         on_time_since: dt.datetime, catch_up: CatchUp,
         window_seconds: float) -> Plan:
    """The fires and missed records of one entry at `now` (see the module doc).

    Args:
        every: the entry's Interval or Cron.
        last_slot: the newest slot already dealt with; None for an entry never planned
            (it starts from now: slots before it existed are not its missed slots).
        on_time_since: slots at or after this fire on time (the leader's start, or the
            entry's resume when later).
        window_seconds: `all` fires missed slots no older than this.
    """
    if last_slot is None:
        return Plan(last_slot=_latest_before(every, now))
    if slot_count(every, last_slot, now, limit=1) == 0:
        return NOTHING
    # (last_slot, missed_until] fell before this leader led / the entry was resumed.
    missed_until = min(now, on_time_since - _TICK)
    fire: list[tuple[dt.datetime, str]] = []
    missed_any = slot_count(every, last_slot, missed_until, limit=1) > 0
    recorded_until = missed_until  # the missed slots not fired are (last_slot, this]
    if missed_any and catch_up is CatchUp.ONCE:
        caught = newest_slots(every, last_slot, missed_until, 1)[0]
        fire.append((caught, "catch_up"))
        recorded_until = caught - _TICK
    elif missed_any and catch_up is CatchUp.ALL:
        horizon = now - dt.timedelta(seconds=window_seconds)
        start = max(last_slot, horizon - _TICK)
        for slot in slots_between(every, start, missed_until):
            fire.append((slot, "catch_up"))
            if len(fire) == FIRE_LIMIT:
                return _with_missed(every, last_slot, start, fire, slot)
        recorded_until = start
    on_time_from = max(last_slot, missed_until)
    for slot in slots_between(every, on_time_from, now):
        fire.append((slot, "on_time"))
        if len(fire) == FIRE_LIMIT:
            break
    new_last = fire[-1][0] if fire and fire[-1][0] > missed_until else max(
        last_slot, newest_slots(every, last_slot, missed_until, 1)[0]
        if missed_any else last_slot)
    return _with_missed(every, last_slot, recorded_until, fire, new_last)


#: One microsecond: (a, b - _TICK] is (a, b), as slots are whole microseconds.
_TICK = dt.timedelta(microseconds=1)
#: A cron entry's due slots are counted up to this many (an interval's exactly).
_COUNT_LIMIT = 100_000


def _with_missed(every: Any, last_slot: dt.datetime, until: dt.datetime,
                 fire: list[tuple[dt.datetime, str]], new_last: dt.datetime) -> Plan:
    """A plan firing `fire`, recording the slots in (last_slot, until] as missed (the newest
    RECORD_LIMIT one by one, the rest counted)."""
    recorded = newest_slots(every, last_slot, until, RECORD_LIMIT)
    rest = 0
    if len(recorded) == RECORD_LIMIT:
        # Only an outage longer than RECORD_LIMIT slots counts the older ones (arithmetic
        # for an interval, whole days for a cron entry: Cron.count_between).
        rest = slot_count(every, last_slot, recorded[0] - _TICK, limit=_COUNT_LIMIT)
    return Plan(fire=fire, missed=recorded, also_missed=rest, last_slot=new_last)


def _latest_before(every: Any, now: dt.datetime) -> dt.datetime:
    """The newest slot <= now for an interval; for a cron entry, `now` itself (its next
    fire is strictly after)."""
    latest = getattr(every, "latest_at_or_before", None)
    return latest(now) if latest is not None else now
