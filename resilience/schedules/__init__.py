"""Schedules: periodic jobs kept in PostgreSQL, fired exactly once per slot (issue 28).

    from resilience.schedules import Interval, Cron, CatchUp, add, pause, describe
    add(stores, "nightly-report", task="reports.build", every=Cron("0 2 * * *", "Europe/Paris"),
        catch_up=CatchUp.ONCE)

    celery -A app beat -S resilience.schedules.scheduler:Scheduler

    models.py      the tables: resilience_schedules, resilience_schedule_runs
    timing.py      Interval and the slot arithmetic; cron.py: Cron (crontab in a time zone)
    catchup.py     which due slots fire and which are recorded missed (pure)
    overlap.py     per fire, from the previous run: send, skip, queue or cancel the previous
    singleton.py   ScheduleSingletonGuard: a skip / queue_one entry's runs never overlap
    store.py       every statement; `fire` is the one transaction that makes a slot fire once
    seed.py        the code's beat_schedule upserted by the leader
    scheduler.py   Scheduler: the celery beat scheduler (leader-elected, resilience.locks.beat)
    guard.py       ScheduleRunGuard: a job's end recorded on its run row
    history.py     prune_runs: old finished run rows deleted (a maintenance entry runs it)
    api.py         add, edit, pause, resume, remove, run_now, describe, recent_runs, listing
"""

from resilience.schedules.api import (
    RunSummary,
    ScheduleSummary,
    add,
    describe,
    edit,
    listing,
    pause,
    recent_runs,
    remove,
    resume,
    run_now,
)
from resilience.schedules.cron import Cron, next_fires
from resilience.schedules.cron import Schedule as Schedule
from resilience.schedules.errors import InvalidSchedule, ScheduleNotFound
from resilience.schedules.guard import ScheduleRunGuard
from resilience.schedules.history import history_days_of, prune_runs
from resilience.schedules.policies import CatchUp, Overlap, RunOutcome
from resilience.schedules.singleton import ScheduleSingletonGuard
from resilience.schedules.store import SCHEDULE_RUN_HEADER
from resilience.schedules.timing import Interval

__all__ = [
    "SCHEDULE_RUN_HEADER",
    "CatchUp",
    "Cron",
    "Interval",
    "InvalidSchedule",
    "Overlap",
    "RunOutcome",
    "RunSummary",
    "Schedule",
    "ScheduleNotFound",
    "ScheduleRunGuard",
    "ScheduleSingletonGuard",
    "ScheduleSummary",
    "add",
    "describe",
    "edit",
    "history_days_of",
    "listing",
    "next_fires",
    "pause",
    "prune_runs",
    "recent_runs",
    "remove",
    "resume",
    "run_now",
]
