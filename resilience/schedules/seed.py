"""Seeding: the code's schedule (`beat_schedule`) upserted into the table by the leader.

A code entry is a Celery beat entry, `{"task": ..., "schedule": ..., "args": [...],
"kwargs": {...}, "options": {...}}`, whose `schedule` is seconds, a `timedelta`, a
`celery.schedules.schedule`, a `crontab` (read in `app.conf.timezone`, else UTC), an
`Interval` or a `Cron`. It may also name the schedule's policies: `catch_up`,
`catch_up_window_seconds`, `overlap`, `paused`.

Code stays the source of a code entry's task, timing, arguments and options: they are
written at every seeding. Its policies and paused flag are written only when the code entry
names them, so what an operator set at runtime survives a restart otherwise. A code entry
that left the code is deleted (runtime entries are never touched). An entry that names no
catch-up policy gets `skip` (as Celery's own beat does with missed slots, but recorded).
"""

from __future__ import annotations

import datetime as dt
import importlib
import math
import re
from collections.abc import Mapping
from typing import Any

from resilience.schedules.cron import Cron
from resilience.schedules.errors import InvalidSchedule
from resilience.schedules.policies import CatchUp, catch_up_policy, overlap_policy
from resilience.schedules.store import ScheduleStore, validate_values
from resilience.schedules.timing import Interval

#: Defaults of the policy columns, for a code entry that does not name them.
DEFAULTS = {"catch_up": CatchUp.SKIP.value, "catch_up_window_seconds": 3600.0,
            "overlap": "allow", "paused": False}
_POLICIES = tuple(DEFAULTS)


def timing_columns(every: Interval | Cron) -> dict[str, Any]:
    """The kind/every_seconds/cron/timezone columns of a timing."""
    if isinstance(every, Interval):
        return {"kind": "interval", "every_seconds": every.seconds, "cron": None,
                "timezone": "UTC"}
    if isinstance(every, Cron):
        return {"kind": "cron", "every_seconds": None, "cron": every.expression,
                "timezone": every.timezone}
    raise InvalidSchedule(f"every must be an Interval or a Cron, got {every!r}")


def timing_of(schedule: Any, timezone: str = "UTC") -> Interval | Cron:
    """The Interval or Cron of a beat entry's `schedule`.

    Raises:
        InvalidSchedule: a schedule kind that has no slots here (solar, custom classes).
    """
    if isinstance(schedule, Interval | Cron):
        return schedule
    if isinstance(schedule, bool):
        raise InvalidSchedule(f"a schedule is seconds, a timedelta or a crontab, not {schedule!r}")
    if isinstance(schedule, int | float):
        return Interval(float(schedule))
    if isinstance(schedule, dt.timedelta):
        return Interval(schedule.total_seconds())
    kind = type(schedule).__name__
    if kind == "crontab":
        return Cron.from_celery(schedule, timezone=timezone)
    run_every = getattr(schedule, "run_every", None)
    if kind == "schedule" and isinstance(run_every, dt.timedelta):
        return Interval(run_every.total_seconds())
    raise InvalidSchedule(f"schedule {schedule!r} ({kind}) is not supported: use seconds, a "
                          "timedelta, a crontab, an Interval or a Cron")


def code_schedule(app: Any) -> Mapping[str, Any]:
    """The code's entries: the `SCHEDULE` of `app.conf.resilience_beat_schedule` (a module
    name) when set, else `app.conf.beat_schedule`."""
    module = app.conf.get("resilience_beat_schedule")
    if module:
        return dict(importlib.import_module(module).SCHEDULE)
    return dict(app.conf.beat_schedule or {})


def code_entries(app: Any) -> list[dict[str, Any]]:
    """The code entries as column values (plus `named`: the policies each names).

    Raises:
        InvalidSchedule: an entry that cannot be used (named in the message).
    """
    timezone = str(app.conf.timezone or "UTC")
    entries = []
    for name, entry in code_schedule(app).items():
        try:
            entries.append(entry_values(name, entry, timezone))
        except InvalidSchedule as exc:
            raise InvalidSchedule(f"beat schedule entry {name!r}: {exc}") from None
    return entries


#: A schedule's name: 1-200 printable characters, so Celery's own entry names ("add every
#: 10 seconds") seed as they are; the page quotes it in its address.
NAME = re.compile(r"[^\x00-\x1f\x7f]{1,200}")


def schedule_name(name: Any) -> str:
    """`name` if it can name a schedule (1-200 characters, none a control character, not
    blank).

    Raises:
        InvalidSchedule: another name, in one line.
    """
    if not isinstance(name, str) or NAME.fullmatch(name) is None or not name.strip():
        raise InvalidSchedule(f"a schedule name is 1-200 printable characters, not blank, "
                              f"got {name!r}")
    return name


def entry_values(name: str, entry: Mapping[str, Any], timezone: str) -> dict[str, Any]:
    """One code entry as column values."""
    schedule_name(name)
    if not isinstance(entry, Mapping) or not isinstance(entry.get("task"), str):
        raise InvalidSchedule("an entry is a dict with a task name and a schedule")
    every = timing_of(entry.get("schedule"), timezone)
    named = frozenset(policy for policy in _POLICIES if policy in entry)
    values: dict[str, Any] = {
        "name": name, "task": entry["task"], "args": list(entry.get("args") or ()),
        "kwargs": dict(entry.get("kwargs") or {}), "options": dict(entry.get("options") or {}),
        **timing_columns(every), **{policy: entry.get(policy, DEFAULTS[policy])
                                    for policy in _POLICIES},
        "source": "code", "named": named,
    }
    values["catch_up"] = catch_up_policy(values["catch_up"]).value
    values["overlap"] = overlap_policy(values["overlap"]).value
    window = values["catch_up_window_seconds"]
    if not isinstance(window, int | float) or isinstance(window, bool) \
            or not math.isfinite(window):
        raise InvalidSchedule(f"catch_up_window_seconds must be a number, got {window!r}")
    values["paused"] = bool(values["paused"])
    validate_values(values)
    return values


def seed(store: ScheduleStore, entries: list[dict[str, Any]]) -> tuple[int, int]:
    """Upsert `entries` and delete code entries no longer in code; (changed, removed)."""
    return store.seed(entries)
