"""`Scheduler`: celery beat driven by the schedules table, one leader among N beats.

    celery -A app beat -S resilience.schedules.scheduler:Scheduler

Each tick (at most `max_interval`, 1 s, apart; sooner when a slot is due sooner):

1. leadership (`resilience.locks.beat.BeatLeadership`): a standby only tries to lead;
2. on taking the lead, the code entries (`app.conf.beat_schedule`, or the `SCHEDULE` of the
   module named by `app.conf.resilience_beat_schedule`) are seeded (`seed.py`);
3. one SELECT of every schedule, so an edit, a pause or a resume made through the API
   applies at this tick, with no restart;
4. per entry not paused, `catchup.plan` says which due slots fire and which are recorded
   missed, and one transaction (`ScheduleStore.fire`) does it: run rows, outbox rows,
   last_slot. Then the fired jobs are published at once (`publish_committed`); what a
   crash leaves in the outbox, the relay publishes.

A beat that is not the leader, or whose leader session cannot be confirmed, fires nothing.
PostgreSQL down: the tick logs and waits `poll_seconds`; nothing is lost, as `last_slot`
did not move, and the slots that fell meanwhile are caught up by the entry's policy.
"""

from __future__ import annotations

import datetime as dt
import logging
from functools import partial
from typing import Any

from celery.beat import Scheduler as CeleryScheduler

from resilience.cancel.view import cancel_job
from resilience.errors import ResilienceError
from resilience.locks.beat import BeatLeadership
from resilience.schedules.catchup import plan
from resilience.schedules.errors import InvalidSchedule
from resilience.schedules.overlap import decide, releases_queued, trust_seconds_of
from resilience.schedules.policies import Overlap, RunOutcome
from resilience.schedules.seed import code_entries, seed
from resilience.schedules.store import ScheduleRow, publish_committed
from resilience.schedules.store import schedule_store as store_of
from resilience.stores import stores_for

logger = logging.getLogger("resilience.schedules")

#: The longest wait between two ticks (s): an edit applies within it.
MAX_TICK_SECONDS = 1.0


class Scheduler(CeleryScheduler):
    """Celery beat's scheduler over `resilience_schedules` (see the module doc)."""

    #: Seconds between ticks at most (`beat_max_loop_interval` may lower it, never raise it).
    max_interval: float = MAX_TICK_SECONDS

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.pop("schedule_filename", None)  # nothing is kept in a local file
        self.leadership = BeatLeadership(app)
        self.seeded = False
        #: Overlap.QUEUE_ONE entries that may have a queued run (checked each tick until
        #: it fires); None: not known yet (check every queue_one entry once).
        self.queued: set[str] | None = None
        trust = trust_seconds_of(app.conf)
        self.decide = partial(decide, trust_seconds=trust)
        self.releases_queued = partial(releases_queued, trust_seconds=trust)
        super().__init__(app, *args, **kwargs)
        self.max_interval = min(float(self.max_interval), MAX_TICK_SECONDS)

    # -- celery's Scheduler interface: the schedule lives in PostgreSQL ----------------------
    def setup_schedule(self) -> None:
        """Nothing to load: each tick reads the table."""

    @property
    def info(self) -> str:
        return f"    . db -> resilience_schedules (node {self.leadership.node})"

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One pass (see the module doc); returns the seconds until the next."""
        if not self.leadership.ensure():
            self.seeded = False
            self.queued = None
            return self.leadership.poll_seconds
        try:
            return self.run_due()
        except ResilienceError as exc:
            self.queued = None  # a pass cut short: check every queue_one entry again
            logger.error("beat %s: schedules not run this tick: %s", self.leadership.node, exc)
            return self.leadership.poll_seconds

    def run_due(self) -> float:
        """Seed if needed, then fire what is due; the seconds until the next slot (capped)."""
        app = self.app
        store = store_of(stores_for(app))
        if not self.seeded:
            changed, removed = seed(store, code_entries(app))
            self.seeded = True
            logger.info("beat %s seeded the code schedule (%s changed, %s removed)",
                        self.leadership.node, changed, removed)
        now = dt.datetime.now(dt.UTC)
        wait = self.max_interval
        written: list[int] = []
        check_all = self.queued is None
        queued = self.queued = set() if check_all else self.queued
        try:
            for entry in store.read_all():
                if entry.paused:
                    continue
                try:
                    if entry.overlap is Overlap.QUEUE_ONE and (check_all or entry.name in queued):
                        self._fire_queued(store, entry, queued, written)
                    due = self._fire_due(store, entry, now, written)
                    following = entry.every.next_after(max(now, due or now))
                except InvalidSchedule as exc:
                    # One entry that cannot be planned (its time zone left tzdata, ...)
                    # must not stop the others.
                    logger.error("beat %s: schedule %s not run: %s", self.leadership.node,
                                 entry.name, exc)
                    continue
                wait = min(wait, (following - dt.datetime.now(dt.UTC)).total_seconds())
        finally:
            # One publishing transaction per tick for every entry's fired jobs, those of a
            # tick an error cut short included (the relay would publish them, later).
            publish_committed(store.engine, self.app, written)
        return max(0.0, wait)

    def _fire_due(self, store: Any, entry: ScheduleRow, now: dt.datetime,
                  written: list[int] | None = None) -> dt.datetime | None:
        """Fire `entry`'s due slots; its new last_slot (None if nothing was due). The
        outbox rows written are added to `written` (published by the caller), or
        published now when it is None."""
        on_time_since = self.leadership.leading_since_wall or now
        if entry.resumed_at is not None and entry.resumed_at > on_time_since:
            on_time_since = entry.resumed_at
        planned = plan(entry.every, entry.last_slot, now, on_time_since, entry.catch_up,
                       entry.catch_up_window_seconds)
        if planned.empty:
            return None
        if not self.leadership.checked():
            logger.warning("beat %s: not the leader (session lost), %s not fired",
                           self.leadership.node, entry.name)
            return None
        fired = store.fire(entry, planned, decide=self.decide,
                           detail={"sender": self.leadership.node},
                           cancel=partial(self._cancel, entry))
        if fired.stale:
            return None
        if self.queued is not None and any(outcome is RunOutcome.QUEUED
                                           for _, outcome in fired.skipped):
            self.queued.add(entry.name)  # fired by a later tick, once the previous ended
        for task_id in fired.cancel:
            logger.info("schedule %s: previous job %s cancelled (overlap cancel_previous)",
                        entry.name, task_id)
        if written is None:
            publish_committed(store.engine, self.app, [sent[3] for sent in fired.sent])
        else:
            written.extend(sent[3] for sent in fired.sent)
        for run_id, slot, late, _ in fired.sent:
            logger.info("schedule %s: slot %s fired (run %s, %.3fs late)", entry.name,
                        slot.isoformat(), run_id, late)
        if fired.missed:
            logger.warning("schedule %s: %s slot(s) missed (catch-up %s)", entry.name,
                           fired.missed, entry.catch_up.value)
        return planned.last_slot

    def _fire_queued(self, store: Any, entry: ScheduleRow, queued: set[str],
                     written: list[int]) -> None:
        """Overlap.QUEUE_ONE: fire the entry's queued run once the run before it ended
        (one short transaction per tick, only while the entry has a queued run)."""
        if not self.leadership.checked():
            return
        sent, waiting = store.fire_queued(entry, released=self.releases_queued)
        if waiting:
            queued.add(entry.name)
        else:
            queued.discard(entry.name)
        if sent is not None:
            run_id, slot, late, outbox_id = sent
            written.append(outbox_id)
            logger.info("schedule %s: queued slot %s fired (run %s, %.3fs late)", entry.name,
                        slot.isoformat(), run_id, late)

    def _cancel(self, entry: ScheduleRow, task_id: str) -> None:
        """Cancel `task_id` through resilience.cancel (inside the fire's transaction: a
        cancellation that cannot be recorded rolls the fire back). A failed `revoke`
        broadcast is only logged: the recorded cancellation already stops the job."""
        reason = f"schedule {entry.name}: overlap cancel_previous"
        try:
            cancel_job(self.app, task_id, reason=reason)
        except ResilienceError:
            raise
        except Exception as exc:  # noqa: BLE001 - the record sticks; the broadcast is a bonus
            logger.warning("schedule %s: revoke of %s not sent: %s", entry.name, task_id, exc)

    def close(self) -> None:
        self.leadership.step_down()
        super().close()
