"""`LeaderElectedScheduler`: run N `celery beat` processes, exactly one of them schedules.

    celery -A jobs beat -S resilience.locks.beat:LeaderElectedScheduler

Leadership is a PostgreSQL session advisory lock on a connection the beat process opens for
itself to the direct lock URL (`Stores.locks_database_url`, `LOCKS_DATABASE_URL` when
DATABASE_URL is a transaction pooler; backends/postgres.py): one connection per beat
process, leader or standby. Chosen over a Redis lease because:
  * SIGKILL / crash of the leader: the kernel closes its socket, PostgreSQL ends the
    session and frees the lock at once; a standby polls every `leader_poll_seconds`
    (default 1 s), so takeover happens within ~1 s of the leader's death (a whole host
    vanishing, or cut off by a partition, is noticed by the server's keepalives, which
    `AdvisorySession` sets per session, ~11 s after its last packet). A Redis lease would make the
    standby wait out the TTL, and a short TTL is fragile under load.
  * SIGTERM: beat exits, the session closes, the lock is free immediately.
  * no clocks involved, no lease to renew from a blocking scheduler loop.
The leader checks its session before every scheduling pass (`verify`), and a send whose
last check is older than `CHECK_VALID_SECONDS` checks again first; if the session was lost
(PostgreSQL restart, terminated backend, partition) it stops sending until it leads again.

When the leader is cut off from PostgreSQL its sends stop before its successor's start:
the cut leader's next check blocks on the dead session and fails after its TCP user
timeout (10 s), while PostgreSQL ends the session, freeing the lock, no sooner than 10 s
after the leader's last packet (server-side keepalives and user timeout; ~11 s measured),
so every send of the old leader (made within `CHECK_VALID_SECONDS` of the start of a check
that succeeded) comes at least ~8 s before the new leader's first, unless the process
stalls between a check and its send. That alone keeps apart the slots of entries with
periods up to ~8 s, while the beat hosts' clocks agree (slots are wall-clock periods). A
longer entry may be due for the new leader at
once (its own last run is older) in the period its predecessor already sent it in: so
each send also claims
`resilience:beat:sent:<entry>:<slot>` with SET NX in the shared Redis, where the slot is
the entry's period index (`floor(now / run_every)`, one minute for crontab entries). The
message carries the slot and its sender in headers (`SLOT_HEADER`, `SENDER_HEADER`). The
first claimant sends; any other send of that entry in that slot is dropped. If that Redis
is down the leader sends anyway (leadership on PostgreSQL is the primary guarantee) and
logs it.

A test or a deployment may point the scheduler at another schedule module with
`app.conf.resilience_beat_schedule = "package.module"` (its `SCHEDULE` dict replaces
`beat_schedule`; the platform sets it from `RESILIENCE_BEAT_SCHEDULE`).
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import socket
import time
from typing import Any

from celery.beat import PersistentScheduler, ScheduleEntry

from resilience.errors import ResilienceError
from resilience.locks.backends.postgres import AdvisorySession
from resilience.stores import stores_for

logger = logging.getLogger("resilience.locks.beat")

#: Name of the leader lock (its advisory id is derived from it).
LEADER_KEY = "resilience:beat:leader"
DEDUPE_PREFIX = "resilience:beat:sent:"
#: The slot header a scheduled message carries (visible in the task's request).
SLOT_HEADER = "resilience_beat_slot"
#: The header naming the beat process that sent it (`beat:<host>:<pid>`), so a task, a log
#: or a test can tell which leader sent which slot.
SENDER_HEADER = "resilience_beat_sender"
#: A send is made at most this long (s) after a check of the leader session that reached
#: PostgreSQL, else it checks again: well under the 10 s after which PostgreSQL may end a
#: silent leader's session, so a cut leader's slots all precede its successor's.
CHECK_VALID_SECONDS = 2.0


def entry_period_seconds(entry: ScheduleEntry) -> float:
    """The length of one schedule slot of `entry`: its interval, or a minute for crontab."""
    run_every = getattr(entry.schedule, "run_every", None)
    seconds = run_every.total_seconds() if hasattr(run_every, "total_seconds") else None
    if isinstance(entry.schedule, int | float):
        seconds = float(entry.schedule)
    if not seconds or seconds <= 0 or type(entry.schedule).__name__ == "crontab":
        return 60.0
    return float(seconds)


class LeaderElectedScheduler(PersistentScheduler):
    """A `PersistentScheduler` that only sends due tasks while it holds the leader lock."""

    #: Seconds between a standby's attempts to lead (and the leader's session checks):
    #: `app.conf.resilience_beat_poll_seconds`, else this.
    leader_poll_seconds: float = 1.0

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        poll = app.conf.get("resilience_beat_poll_seconds")
        if poll is not None:
            self.leader_poll_seconds = float(poll)
        module = app.conf.get("resilience_beat_schedule")
        if module:
            app.conf.beat_schedule = dict(importlib.import_module(module).SCHEDULE)
        self.session: AdvisorySession | None = None
        self.node = f"beat:{socket.gethostname()}:{os.getpid()}"
        self.leading_since: float | None = None
        #: `time.monotonic()` when the last successful check of the leader session began.
        self.checked_at: float | None = None
        super().__init__(app, *args, **kwargs)

    # -- leadership --------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        return self.leading_since is not None

    def ensure_leadership(self) -> bool:
        """Lead if possible; confirm a held lead. True while this process may schedule."""
        try:
            if self.session is not None and self.is_leader:
                # The check's start: PostgreSQL heard from this session no earlier.
                started = time.monotonic()
                self.session.verify(LEADER_KEY)
                self.checked_at = started
                return True
            if self.session is None:
                stores = stores_for(self.app)
                self.session = AdvisorySession(stores.locks_database_url, label=self.node,
                                               pool_mode=stores.locks_pool_mode)
            started = time.monotonic()
            if self.session.try_acquire(LEADER_KEY):
                self.leading_since = self.checked_at = started
                # A new leader starts from now: it must not replay the sends it missed.
                self._heap = None
                logger.warning("beat %s is now the leader", self.node)
                return True
            return False
        except ResilienceError as exc:
            if self.is_leader:
                logger.error("beat %s lost leadership: %s", self.node, exc)
            self.step_down()
            return False

    def step_down(self) -> None:
        """Give leadership up at once (closing the session frees the lock)."""
        self.leading_since = self.checked_at = None
        if self.session is not None:
            self.session.close()
            self.session = None

    # -- scheduling ----------------------------------------------------------------------
    def tick(self, *args: Any, **kwargs: Any) -> float:
        if not self.ensure_leadership():
            return self.leader_poll_seconds
        return min(super().tick(*args, **kwargs), self.leader_poll_seconds)

    def apply_async(self, entry: ScheduleEntry, producer: Any = None, advance: bool = True,
                    **kwargs: Any) -> Any:
        """Send `entry` once per slot, as the leader: a send more than `CHECK_VALID_SECONDS`
        after the last check of the leader session checks again first (not the leader: not
        sent), and only the first claimant of the slot sends."""
        if not self.leadership_checked() and not self.ensure_leadership():
            logger.warning("beat %s: not the leader (session lost), %s not sent",
                           self.node, entry.name)
            return None
        period = entry_period_seconds(entry)
        slot = f"{entry.name}:{math.floor(time.time() / period)}"
        if not self.claim(slot, period):
            logger.warning("beat %s: %s already sent in slot %s, not sending again",
                           self.node, entry.name, slot)
            return None
        original = entry.options
        entry.options = {**original, "headers": {**(original.get("headers") or {}),
                                                 SLOT_HEADER: slot, SENDER_HEADER: self.node}}
        try:
            return super().apply_async(entry, producer=producer, advance=advance, **kwargs)
        finally:
            entry.options = original

    def leadership_checked(self) -> bool:
        """True while the last successful check of the leader session is recent enough
        (`CHECK_VALID_SECONDS`) for a send to rely on it."""
        return (self.is_leader and self.checked_at is not None
                and time.monotonic() - self.checked_at <= CHECK_VALID_SECONDS)

    def claim(self, slot: str, period_seconds: float) -> bool:
        """SET NX the slot's dedupe key; True when this process may send."""
        ttl_ms = int(max(60.0, 3 * period_seconds) * 1000)
        try:
            return bool(stores_for(self.app).redis().set(
                DEDUPE_PREFIX + slot, self.node, nx=True, px=ttl_ms))
        except Exception as exc:  # noqa: BLE001 - leadership on PostgreSQL still holds
            logger.warning("beat %s: dedupe store failed (%s); sending as the leader",
                           self.node, exc)
            return True

    def close(self) -> None:
        self.step_down()
        super().close()
