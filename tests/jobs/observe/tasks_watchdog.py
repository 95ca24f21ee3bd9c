"""Test tasks of the consumption watchdog (loaded by every test worker through JOBS_IMPORTS).

With `JOBS_TEST_WEDGE_ON_SIGUSR2` set, the worker's main process blocks its main thread for
an hour on SIGUSR2: a wedged event loop (a deadlock) that no reconnect can cure, while its
other threads and the broker are fine.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from jobs import app
from resilience.stores import stores_for

#: Hash in the guard Redis: task index -> epoch seconds it ran.
DONE_KEY = "tests:watchdog:done"


@app.task(tier="standard", name="tests.watchdog.mark")
def mark(key: str, index: int) -> None:
    """Record that job `index` ran, and when (a set: a redelivery counts once)."""
    stores_for(app).redis().hsetnx(key, str(index), repr(time.time()))


def _wedge(*_: Any) -> None:
    time.sleep(3600)


if os.environ.get("JOBS_TEST_WEDGE_ON_SIGUSR2"):
    signal.signal(signal.SIGUSR2, _wedge)
