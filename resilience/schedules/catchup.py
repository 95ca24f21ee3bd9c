"""Which due slots fire and which are recorded missed: the catch-up decision, pure.

At each tick the leader asks `plan` about every entry that is not paused. The due slots are
those in (last_slot, now]. The newest of them fires on time when it fell while this leader
led and the entry was active (slot >= `on_time_since`: the later of the leader's start and
the entry's last resume). Every other due slot was missed (no leader ran, the entry was
paused, or the leader stalled for more than a period) and the entry's policy decides:

    slots:    m1    m2    m3  | leader starts   n (on time)
    skip:     miss  miss  miss                  fire
    once:     miss  miss  FIRE                  fire
    all:      FIRE  FIRE  FIRE  (oldest first; those older than the window: miss)

Recording is bounded: at most `RECORD_LIMIT` missed slots get a row each (the newest); the
oldest recorded row's detail counts the rest (`also_missed`), so a week-long outage of a
0.1 s entry writes a hundred rows, not six million. `ALL` fires at most `FIRE_LIMIT` slots
per tick (the oldest within the window first); the next tick goes on from there.
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
    due_count = slot_count(every, last_slot, now, limit=_COUNT_LIMIT)
    if due_count == 0:
        return NOTHING
    newest = newest_slots(every, last_slot, now, 1)[0]
    on_time = newest >= on_time_since
    fire: list[tuple[dt.datetime, str]] = [(newest, "on_time")] if on_time else []
    # The missed slots are (last_slot, missed_until].
    missed_until = newest - _TICK if on_time else newest
    missed_total = due_count - (1 if on_time else 0)
    if missed_total <= 0:
        return Plan(fire=fire, last_slot=newest)
    if catch_up is CatchUp.ONCE:
        caught = newest_slots(every, last_slot, missed_until, 1)
        fire.insert(0, (caught[0], "catch_up"))
        return _with_missed(every, last_slot, caught[0] - _TICK, fire, newest)
    if catch_up is CatchUp.ALL:
        horizon = now - dt.timedelta(seconds=window_seconds)
        start = max(last_slot, horizon - _TICK)
        inside: list[dt.datetime] = []
        for slot in slots_between(every, start, missed_until):
            inside.append(slot)
            if len(inside) > FIRE_LIMIT:
                break
        if len(inside) > FIRE_LIMIT:
            # More than one tick's worth: fire FIRE_LIMIT now; the next tick goes on (the
            # on-time slot is still due then, still on time).
            chosen = [(slot, "catch_up") for slot in inside[:FIRE_LIMIT]]
            return _with_missed(every, last_slot, start, chosen, inside[FIRE_LIMIT - 1])
        fire[:0] = [(slot, "catch_up") for slot in inside]
        return _with_missed(every, last_slot, start, fire, newest)
    return _with_missed(every, last_slot, missed_until, fire, newest)


#: One microsecond: (a, b - _TICK] is (a, b), as slots are whole microseconds.
_TICK = dt.timedelta(microseconds=1)
#: A cron entry's due slots are counted up to this many (an interval's exactly).
_COUNT_LIMIT = 100_000


def _with_missed(every: Any, last_slot: dt.datetime, until: dt.datetime,
                 fire: list[tuple[dt.datetime, str]], new_last: dt.datetime) -> Plan:
    """A plan firing `fire`, recording the slots in (last_slot, until] as missed (the newest
    RECORD_LIMIT one by one, the rest counted)."""
    total = slot_count(every, last_slot, until, limit=_COUNT_LIMIT)
    recorded = newest_slots(every, last_slot, until, RECORD_LIMIT) if total else []
    return Plan(fire=fire, missed=recorded, also_missed=max(0, total - len(recorded)),
                last_slot=new_last)


def _latest_before(every: Any, now: dt.datetime) -> dt.datetime:
    """The newest slot <= now for an interval; for a cron entry, `now` itself (its next
    fire is strictly after)."""
    latest = getattr(every, "latest_at_or_before", None)
    return latest(now) if latest is not None else now
