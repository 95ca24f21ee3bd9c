"""`BeatLeadership`: run N `celery beat` processes, exactly one of them schedules.

The leader election of `resilience.schedules.scheduler:Scheduler`: a PostgreSQL session
advisory lock on a connection each beat process opens to the direct lock URL (why not a
Redis lease, and the takeover bounds: docs/locks.md, "Leader-elected beat"). The leader
checks its session before every pass (`ensure`), and a fire whose last check is older than
`CHECK_VALID_SECONDS` checks again first (`checked`); a lost session stops its fires.
Leadership only keeps two beats from firing side by side: the run row's UNIQUE(schedule,
slot) makes a slot fire once (`resilience.schedules.store`).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import time
from typing import Any

from resilience.errors import ResilienceError
from resilience.locks.backends.postgres import AdvisorySession
from resilience.stores import stores_for

logger = logging.getLogger("resilience.locks.beat")

#: Name of the leader lock (its advisory id is derived from it).
LEADER_KEY = "resilience:beat:leader"
#: A fire is made at most this long (s) after a check of the leader session that reached
#: PostgreSQL, else it checks again: well under the 10 s after which PostgreSQL may end a
#: silent leader's session.
CHECK_VALID_SECONDS = 2.0


class BeatLeadership:
    """The leader lock of one beat process.

    Args:
        app: the Celery app (its stores give the lock URL).
        poll_seconds: a standby's wait between attempts to lead;
            `app.conf.resilience_beat_poll_seconds`, else 1 s.
    """

    def __init__(self, app: Any, poll_seconds: float | None = None) -> None:
        self.app = app
        configured = app.conf.get("resilience_beat_poll_seconds")
        self.poll_seconds = float(poll_seconds if poll_seconds is not None
                                  else configured if configured is not None else 1.0)
        self.session: AdvisorySession | None = None
        #: `beat:<host>:<pid>`: the lock session's label (its application_name).
        self.node = f"beat:{socket.gethostname()}:{os.getpid()}"
        #: `time.monotonic()` when this process took the lead; None while standing by.
        self.leading_since: float | None = None
        #: The wall-clock time it took the lead (slots before it fell while it did not lead).
        self.leading_since_wall: dt.datetime | None = None
        #: `time.monotonic()` when the last successful check of the leader session began.
        self.checked_at: float | None = None

    @property
    def is_leader(self) -> bool:
        return self.leading_since is not None

    def ensure(self) -> bool:
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
                self.leading_since_wall = dt.datetime.now(dt.UTC)
                logger.warning("beat %s is now the leader", self.node)
                return True
            return False
        except ResilienceError as exc:
            if self.is_leader:
                logger.error("beat %s lost leadership: %s", self.node, exc)
            self.step_down()
            return False

    def checked(self) -> bool:
        """True while the last successful check of the leader session is recent enough
        (`CHECK_VALID_SECONDS`) for a fire to rely on it; else check again (`ensure`)."""
        if (self.is_leader and self.checked_at is not None
                and time.monotonic() - self.checked_at <= CHECK_VALID_SECONDS):
            return True
        return self.ensure()

    def step_down(self) -> None:
        """Give leadership up at once (closing the session frees the lock)."""
        self.leading_since = self.checked_at = self.leading_since_wall = None
        if self.session is not None:
            self.session.close()
            self.session = None
