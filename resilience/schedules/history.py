"""Run history retention: `prune_runs` deletes old, finished run rows.

Every slot writes a run row (a 2 s entry: 43,200 a day), so history needs a bound. A row
goes when it is finished (anything but `sent` and `queued`: a run in flight or waiting is
never touched), its slot is older than the retention (`resilience_schedule_history_days`,
default 7) and it is not among its entry's newest `keep_last` runs (so `describe` and the
overlap policies always see an entry's recent past, however old). Deletion runs in batches,
one short transaction each, so the beat's fires and the guard's records never wait long.
The missed and skipped_overlap rows deleted are added to the schedule row (`pruned_missed`,
`pruned_skipped`), so the metrics' counters never go down.

A beat schedules it like any task:

    @app.task
    def prune_schedule_history() -> dict:
        return prune_runs(stores_for(app), history_days=history_days_of(app.conf))
"""

from __future__ import annotations

import datetime as dt
import time
from typing import TYPE_CHECKING, Any

from resilience.errors import ConfigurationError
from resilience.schedules.errors import InvalidSchedule
from resilience.schedules.store import schedule_store

if TYPE_CHECKING:
    from resilience.stores import Stores

#: Days of finished runs kept when `resilience_schedule_history_days` is unset.
HISTORY_DAYS = 7.0
#: An entry's newest runs kept whatever their age.
KEEP_LAST = 20


def history_days_of(conf: Any) -> float:
    """`resilience_schedule_history_days` of an app's conf (HISTORY_DAYS when unset).

    Raises:
        ConfigurationError: not a number > 0.
    """
    value = conf.get("resilience_schedule_history_days")
    if value is None:
        return HISTORY_DAYS
    try:
        days = float(value)
    except (TypeError, ValueError):
        days = float("nan")
    if isinstance(value, bool) or not days > 0:
        raise ConfigurationError("resilience_schedule_history_days must be a number of days "
                                 f"> 0, got {value!r}")
    return days


def _positive(name: str, value: Any, kind: type | tuple[type, ...]) -> None:
    if isinstance(value, bool) or not isinstance(value, kind) or not value > 0:
        raise InvalidSchedule(f"{name} must be a positive number, got {value!r}")


def prune_runs(stores: Stores, *, history_days: float = HISTORY_DAYS,
               keep_last: int = KEEP_LAST, batch_size: int = 1000,
               time_budget_seconds: float = 30.0,
               now: dt.datetime | None = None) -> dict[str, Any]:
    """Delete finished run rows older than `history_days`, keeping each entry's newest
    `keep_last` runs and every run not finished, in batches of `batch_size` until none is
    left or `time_budget_seconds` are spent (the next call goes on).

    Returns:
        {"deleted": rows deleted, "schedules": entries that lost rows, "done": False when
        the time budget cut it short}.

    Raises:
        InvalidSchedule: a bad argument. StorageError: PostgreSQL failed (rows already
            deleted stay deleted, each batch with its counts).
    """
    _positive("history_days", history_days, (int, float))
    _positive("keep_last", keep_last, int)
    _positive("batch_size", batch_size, int)
    _positive("time_budget_seconds", time_budget_seconds, (int, float))
    store = schedule_store(stores)
    before = (now or dt.datetime.now(dt.UTC)) - dt.timedelta(days=history_days)
    deadline = time.monotonic() + time_budget_seconds
    deleted, touched = 0, 0
    for name in store.names():
        pruned = 0
        while True:
            if time.monotonic() > deadline:
                return {"deleted": deleted + pruned, "schedules": touched + bool(pruned),
                        "done": False}
            batch = store.prune(name, before, keep_last, batch_size)
            pruned += batch
            if batch < batch_size:
                break
        deleted += pruned
        touched += bool(pruned)
    return {"deleted": deleted, "schedules": touched, "done": True}
