"""The operator's side of schedules: add, edit, pause, resume, remove, run now, read.

Every function takes the app's `Stores` (`resilience.stores.stores_for(app)`) and works on
PostgreSQL directly: the beat leader reads the table at its next tick (within a second), so
a change applies without a restart. Bad input raises `InvalidSchedule`, an unknown name
`ScheduleNotFound`, each with one clear line.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from resilience.schedules.cron import Cron, next_fires
from resilience.schedules.errors import InvalidSchedule, ScheduleNotFound
from resilience.schedules.policies import (
    CatchUp,
    Overlap,
    RunOutcome,
    catch_up_policy,
    overlap_policy,
)
from resilience.schedules.seed import schedule_name, timing_columns
from resilience.schedules.store import (
    RunRow,
    ScheduleRow,
    publish_committed,
    schedule_store,
    validate_values,
)
from resilience.schedules.timing import Interval

if TYPE_CHECKING:
    from resilience.stores import Stores

#: How many fires `describe` previews, and how many runs it lists.
PREVIEW = 5
LAST_RUNS = 10


@dataclass(frozen=True)
class RunSummary:
    """One run of a schedule (one slot): when it was due, sent, how it ended."""

    id: int
    schedule: str
    slot: dt.datetime
    fired_at: dt.datetime | None
    task_id: str | None
    outcome: RunOutcome
    finished_at: dt.datetime | None
    late_seconds: float | None
    detail: dict[str, Any] | None

    @classmethod
    def of(cls, row: RunRow) -> RunSummary:
        return cls(id=row.id, schedule=row.schedule, slot=row.slot, fired_at=row.fired_at,
                   task_id=row.task_id, outcome=row.outcome, finished_at=row.finished_at,
                   late_seconds=row.late_seconds, detail=row.detail)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {"id": self.id, "schedule": self.schedule, "slot": _iso(self.slot),
                "fired_at": _iso(self.fired_at), "task_id": self.task_id,
                "outcome": self.outcome.value, "finished_at": _iso(self.finished_at),
                "late_seconds": (None if self.late_seconds is None
                                 else round(self.late_seconds, 3)),
                "detail": self.detail}


@dataclass(frozen=True)
class ScheduleSummary:
    """A schedule as the API, the CLI and the page show it.

    Args:
        every: its timing (Interval or Cron).
        source: "code" (seeded from beat_schedule) or "runtime" (added through the API).
        last_slot: the newest slot fired or recorded missed.
        last_runs: its newest runs, newest first (`describe`: the last ten; `listing`: the
            last one).
        next_fires: its next fire times, aware UTC (`describe`: five; `listing`: one).
    """

    name: str
    task: str
    every: Interval | Cron
    args: list[Any]
    kwargs: dict[str, Any]
    options: dict[str, Any]
    catch_up: CatchUp
    catch_up_window_seconds: float
    overlap: Overlap
    paused: bool
    source: str
    last_slot: dt.datetime | None
    updated_at: dt.datetime | None
    version: int
    last_runs: list[RunSummary] = field(default_factory=list)
    next_fires: list[dt.datetime] = field(default_factory=list)

    @classmethod
    def of(cls, row: ScheduleRow, runs: list[RunRow], fires: int) -> ScheduleSummary:
        now = dt.datetime.now(dt.UTC)
        every = row.every
        return cls(name=row.name, task=row.task, every=every, args=row.args,
                   kwargs=row.kwargs, options=row.options, catch_up=row.catch_up,
                   catch_up_window_seconds=row.catch_up_window_seconds, overlap=row.overlap,
                   paused=row.paused, source=row.source, last_slot=row.last_slot,
                   updated_at=row.updated_at, version=row.version,
                   last_runs=[RunSummary.of(run) for run in runs],
                   next_fires=next_fires(every, max(now, row.last_slot or now), fires))

    @property
    def schedule(self) -> str:
        """The timing as text: `every 2s` or `*/5 * * * * (Europe/Paris)`."""
        if isinstance(self.every, Interval):
            return self.every.describe()
        return f"{self.every.expression} ({self.every.timezone})"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {
            "name": self.name, "task": self.task, "schedule": self.schedule,
            **timing_columns(self.every), "args": self.args, "kwargs": self.kwargs,
            "options": self.options, "catch_up": self.catch_up.value,
            "catch_up_window_seconds": self.catch_up_window_seconds,
            "overlap": self.overlap.value, "paused": self.paused, "source": self.source,
            "last_slot": _iso(self.last_slot), "updated_at": _iso(self.updated_at),
            "version": self.version, "last_runs": [run.as_dict() for run in self.last_runs],
            "next_fires": [_iso(moment) for moment in self.next_fires],
        }


def _iso(moment: dt.datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _name(name: Any) -> str:
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise InvalidSchedule(f"a schedule name is a non-empty string of at most 200 "
                              f"characters, got {name!r}")
    return name


def _task(task: Any) -> str:
    if not isinstance(task, str) or not task.strip():
        raise InvalidSchedule(f"task must be a task name, got {task!r}")
    return task


def _window(seconds: Any) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        raise InvalidSchedule(f"catch_up_window_seconds must be a number >= 0, got {seconds!r}")
    return float(seconds)


def _check_json(column: str, value: Any, kind: type) -> Any:
    if not isinstance(value, kind):
        raise InvalidSchedule(f"{column} must be a {kind.__name__}, got {value!r}")
    return value


def add(stores: Stores, name: str, *, task: str, every: Interval | Cron,
        args: list[Any] | tuple[Any, ...] = (), kwargs: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None, catch_up: CatchUp | str = CatchUp.SKIP,
        catch_up_window_seconds: float = 3600.0, overlap: Overlap | str = Overlap.ALLOW,
        paused: bool = False) -> ScheduleSummary:
    """Add a runtime schedule; the leader fires it from its next slot on.

    Raises:
        InvalidSchedule: a bad value, a name outside A-Z a-z 0-9 _ . : - (or longer than 200:
            the name is its page's address), or the name is taken.
        StorageError: PostgreSQL failed.
    """
    values = {
        "name": schedule_name(name), "task": _task(task), **timing_columns(every),
        "args": list(_check_json("args", args, list | tuple)),
        "kwargs": dict(_check_json("kwargs", kwargs or {}, Mapping)),
        "options": dict(_check_json("options", options or {}, Mapping)),
        "catch_up": catch_up_policy(catch_up).value,
        "catch_up_window_seconds": _window(catch_up_window_seconds),
        "overlap": overlap_policy(overlap).value, "paused": bool(paused), "source": "runtime",
    }
    validate_values(values)
    if not schedule_store(stores).insert(values):
        raise InvalidSchedule(f"a schedule named {name!r} already exists (edit it, or remove "
                              "it first)", name=name)
    return describe(stores, name)


#: What `edit` may change, and which of it code owns for a code entry.
_EDITABLE = ("task", "every", "args", "kwargs", "options", "catch_up",
             "catch_up_window_seconds", "overlap")
_CODE_OWNED = ("task", "every", "args", "kwargs", "options")


def edit(stores: Stores, name: str, **changes: Any) -> ScheduleSummary:
    """Change a schedule's task, timing (`every`), arguments, options or policies; the
    leader applies it at its next tick. A code entry's task, timing, arguments and options
    come from code (the next seeding would undo an edit): only its policies may change.

    Raises:
        InvalidSchedule: an unknown field, a bad value, or a code-owned field of a code entry.
        ScheduleNotFound: no schedule has this name.
    """
    unknown = sorted(set(changes) - set(_EDITABLE))
    if unknown:
        raise InvalidSchedule(f"cannot edit {', '.join(unknown)}: editable fields are "
                              f"{', '.join(_EDITABLE)} (pause/resume have their own calls)")
    if not changes:
        return describe(stores, name)
    store = schedule_store(stores)
    current = store.read(_name(name))
    if current is None:
        raise ScheduleNotFound(f"no schedule named {name!r}", name=name)
    owned = sorted(set(changes) & set(_CODE_OWNED))
    if current.source == "code" and owned:
        raise InvalidSchedule(f"{name!r} comes from the code's beat schedule: its "
                              f"{', '.join(owned)} change in code; only its policies may be "
                              "edited here", name=name)
    columns: dict[str, Any] = {}
    for key, value in changes.items():
        if key == "every":
            columns.update(timing_columns(value))
        elif key == "task":
            columns["task"] = _task(value)
        elif key == "args":
            columns["args"] = list(_check_json("args", value, list | tuple))
        elif key in ("kwargs", "options"):
            columns[key] = dict(_check_json(key, value, Mapping))
        elif key == "catch_up":
            columns["catch_up"] = catch_up_policy(value).value
        elif key == "overlap":
            columns["overlap"] = overlap_policy(value).value
        else:
            columns["catch_up_window_seconds"] = _window(value)
    validate_values(columns)
    if not store.update(name, columns):
        raise ScheduleNotFound(f"no schedule named {name!r}", name=name)
    return describe(stores, name)


def pause(stores: Stores, name: str) -> ScheduleSummary:
    """Stop firing `name` from the leader's next tick; its slots are then missed (and
    caught up on resume by its catch-up policy). Raises ScheduleNotFound."""
    if not schedule_store(stores).set_paused(_name(name), True):
        raise ScheduleNotFound(f"no schedule named {name!r}", name=name)
    return describe(stores, name)


def resume(stores: Stores, name: str) -> ScheduleSummary:
    """Fire `name` again from the leader's next tick; the slots missed while it was paused
    go to its catch-up policy. Raises ScheduleNotFound."""
    if not schedule_store(stores).set_paused(_name(name), False):
        raise ScheduleNotFound(f"no schedule named {name!r}", name=name)
    return describe(stores, name)


def remove(stores: Stores, name: str) -> None:
    """Delete `name` and its run history. A code entry comes back at the next seeding
    unless it is removed from code too. Raises ScheduleNotFound."""
    if not schedule_store(stores).delete(_name(name)):
        raise ScheduleNotFound(f"no schedule named {name!r}", name=name)


def run_now(stores: Stores, name: str, app: Any = None) -> str:
    """Fire `name` once now, outside its slots (a run row whose slot is now); returns the
    job's task id. The job is published at once through `app` when given, else by the
    outbox relay. Raises ScheduleNotFound."""
    store = schedule_store(stores)
    entry = store.read(_name(name))
    if entry is None:
        raise ScheduleNotFound(f"no schedule named {name!r}", name=name)
    _, task_id, outbox_id = store.run_now(entry)
    if app is not None:
        publish_committed(store.engine, app, [outbox_id])
    return task_id


def describe(stores: Stores, name: str) -> ScheduleSummary:
    """`name` with its last ten runs and its next five fires. Raises ScheduleNotFound."""
    store = schedule_store(stores)
    row = store.read(_name(name))
    if row is None:
        raise ScheduleNotFound(f"no schedule named {name!r}", name=name)
    return ScheduleSummary.of(row, store.recent_runs(name, LAST_RUNS), PREVIEW)


def recent_runs(stores: Stores, name: str, limit: int = 20) -> list[RunSummary]:
    """The newest `limit` runs of `name`, newest first (an unknown name has none)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidSchedule(f"limit must be a positive integer, got {limit!r}")
    return [RunSummary.of(row) for row in schedule_store(stores).recent_runs(_name(name), limit)]


def listing(stores: Stores) -> list[ScheduleSummary]:
    """Every schedule by name, each with its last run and its next fire."""
    store = schedule_store(stores)
    latest = store.latest_runs()
    return [ScheduleSummary.of(row, [latest[row.name]] if row.name in latest else [], 1)
            for row in store.read_all()]
