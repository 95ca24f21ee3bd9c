"""The leader-elected scheduler checks its session again before a send whose last check is
stale (`CHECK_VALID_SECONDS`), so a leader whose session died does not send."""

from __future__ import annotations

import math
import time
import uuid
from pathlib import Path
from typing import Any

from celery.beat import ScheduleEntry
from sqlalchemy import text

from resilience.locks.beat import CHECK_VALID_SECONDS, DEDUPE_PREFIX, LeaderElectedScheduler


def _slot_keys(entry: ScheduleEntry) -> list[str]:
    """The dedupe keys of `entry`'s current and next slot (1 s periods)."""
    now = math.floor(time.time())
    return [f"{DEDUPE_PREFIX}{entry.name}:{slot}" for slot in (now, now + 1, now + 2)]


class TestSendAfterAStaleCheck:
    def test_a_stale_check_is_repeated_and_a_dead_session_sends_nothing(
        self, app: Any, stores: Any, engine: Any, tmp_path: Path
    ) -> None:
        """A leader whose last check is older than CHECK_VALID_SECONDS checks again before
        sending (alive: it stays the leader); when its session was terminated meanwhile,
        the send is dropped before the slot is claimed and the scheduler steps down."""
        name = f"beat-check-{uuid.uuid4().hex[:8]}"
        entry = ScheduleEntry(name=name, task=f"tests.{name}", schedule=1.0, app=app,
                              options={"queue": name})
        scheduler = LeaderElectedScheduler(app, schedule_filename=str(tmp_path / "schedule"))
        redis = stores.redis()
        try:
            assert scheduler.ensure_leadership(), "the scheduler leads on an empty database"

            # Alive, stale: checked again (and the slot is already claimed: nothing sent).
            stale = time.monotonic() - CHECK_VALID_SECONDS - 1
            scheduler.checked_at = stale
            for key in _slot_keys(entry):
                redis.set(key, "test", px=10_000)
            assert scheduler.apply_async(entry) is None
            assert scheduler.is_leader and scheduler.checked_at > stale

            # Dead, stale: the re-check fails, nothing is claimed or sent.
            redis.delete(*_slot_keys(entry))
            assert scheduler.session is not None
            with engine.begin() as connection:
                connection.execute(text("SELECT pg_terminate_backend(:pid)"),
                                   {"pid": scheduler.session.backend_pid})
            scheduler.checked_at = time.monotonic() - CHECK_VALID_SECONDS - 1
            assert scheduler.apply_async(entry) is None
            assert not scheduler.is_leader and scheduler.session is None
            assert not any(redis.exists(key) for key in _slot_keys(entry)), (
                "a leader with a dead session claimed a slot")
        finally:
            redis.delete(*_slot_keys(entry))
            scheduler.close()
