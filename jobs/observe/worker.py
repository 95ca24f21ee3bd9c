"""Worker-side observation, connected on import (one of the app's `imports`): the structured
log formatter, `jobs_lock_hold_seconds` (task_prerun to task_postrun of a task holding a
singleton or exclusive lock; a call its own lock guard stopped never held it),
`jobs_workflow_step_seconds`, dead pool processes marked for multiprocess metrics, and the
heartbeat and watchdog bootsteps (`jobs.observe.watchdog` adds them at `celeryd_init` and
stops them at `worker_shutdown`).
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any

from celery import signals

from jobs.observe import watchdog  # noqa: F401 - connects the heartbeat's receivers
from jobs.observe.logging import install_worker_logging
from jobs.observe.metrics import LOCK_HOLD_SECONDS, WORKFLOW_STEP_SECONDS, multiprocess_dir
from resilience.outcomes import OutcomeStored
from resilience.workflows import observe_steps

LOCK_GUARDS = ("singleton", "exclusive")

_started: dict[str, tuple[float, str]] = {}


@functools.cache
def lock_kind(task: Any) -> str | None:
    """The lock guard kind of `task` ('singleton' / 'exclusive'), or None."""
    try:
        guards = [getattr(guard, "name", None) for guard in task.pipelines()[0].guards]
    except Exception:  # noqa: BLE001 - a task without guards holds no lock
        guards = []
    return next((g for g in guards if g in LOCK_GUARDS), None)


@signals.task_prerun.connect(weak=False)
def _task_started(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    if task_id and task is not None:
        kind = lock_kind(task)
        if kind is not None:
            _started[task_id] = (time.perf_counter(), kind)


@signals.task_postrun.connect(weak=False)
def _task_finished(task_id: str | None = None, task: Any = None, retval: Any = None,
                   **_: Any) -> None:
    started = _started.pop(task_id or "", None)
    if started is None:
        return
    began, kind = started
    stopped_by = (retval.get("guard") if isinstance(retval, dict)
                  else getattr(retval, "guard", None) if isinstance(retval, OutcomeStored)
                  else None)
    if stopped_by in LOCK_GUARDS:
        return  # SKIPPED by its own lock guard: it never held the lock
    if isinstance(retval, BaseException) and f"DEFERRED by {kind}" in str(retval):
        return  # DEFERRED by its own lock guard
    LOCK_HOLD_SECONDS.labels(kind=kind, task=task.name).observe(time.perf_counter() - began)


@signals.worker_process_shutdown.connect(weak=False)
def _process_gone(pid: int | None = None, **_: Any) -> None:
    if multiprocess_dir():
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid or os.getpid())


observe_steps(lambda task_name, state, seconds: WORKFLOW_STEP_SECONDS.labels(
    task=task_name, state=state).observe(seconds))
install_worker_logging()
