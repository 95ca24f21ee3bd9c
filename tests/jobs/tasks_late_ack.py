"""Tasks of the late-acknowledgement tests (test_late_ack.py): a job that records each run
of its body in the guard Redis, then holds its worker until the test releases that worker.

A run is released by node name (`release_key`), so the test decides which of two workers
holding the same message finishes and acknowledges it, and which is killed still holding it.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from jobs import app
from resilience.stores import stores_for

#: Longest a run waits for its release, below the session's 15 s soft time limit.
HOLD_SECONDS = 12.0


def runs_key(run_id: str) -> str:
    """The guard-Redis list of one test's body runs (JSON, oldest first)."""
    return f"late_ack:{run_id}:runs"


def release_key(run_id: str, hostname: str) -> str:
    """Set by the test to let the run on `hostname` finish."""
    return f"late_ack:{run_id}:release:{hostname}"


@app.task(tier="critical", bind=True)
def held_job(self: Any, run_id: str) -> str:
    """Record this run, wait until the test releases this worker, record its end."""
    client = stores_for(app).redis()
    hostname = self.request.hostname
    record = {"hostname": hostname, "pid": os.getpid(),
              "redelivered": bool((self.request.delivery_info or {}).get("redelivered"))}
    client.rpush(runs_key(run_id), json.dumps({**record, "event": "start"}))
    deadline = time.monotonic() + HOLD_SECONDS
    while not client.exists(release_key(run_id, hostname)):
        if time.monotonic() > deadline:
            client.rpush(runs_key(run_id), json.dumps({**record, "event": "unreleased"}))
            return "unreleased"
        time.sleep(0.05)
    client.rpush(runs_key(run_id), json.dumps({**record, "event": "done"}))
    return hostname
