"""A short schedule for the leader-elected beat test (RESILIENCE_BEAT_SCHEDULE points here)."""

from __future__ import annotations

import os

SCHEDULE = {
    "locks-test-tick": {
        "task": "tests.locks.beat_tick",
        "schedule": float(os.environ.get("LOCKS_TEST_PERIOD_SECONDS", "1.0")),
        "args": [os.environ.get("LOCKS_TEST_RUN_ID", "unset")],
        "options": {"queue": "critical"},
    },
}
