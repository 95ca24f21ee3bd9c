"""Worker-side observation: structured log formatter, lock hold times, dead pool processes.

Import this module in the worker (it is one of the app's `imports`); it connects:

- `after_setup_logger` / `after_setup_task_logger`: the structured formatter (logging.py);
- `task_prerun` / `task_postrun`: a task whose execution guards hold a singleton or
  exclusive lock gets its hold time observed in `jobs_lock_hold_seconds` (the lock is held
  from the exclusivity stage to the end of the body; the few milliseconds of the outer
  deadline and idempotency guards are included). A call stopped by its own lock guard
  (SKIPPED/DEFERRED: the lock was never held) is not observed;
- `resilience.workflows.observe_steps`: each durable workflow step's latency (its guard's
  start to its recorded outcome) in `jobs_workflow_step_seconds`;
- `worker_process_shutdown`: `multiprocess.mark_process_dead(pid)`, so Prometheus stops
  summing the live gauges of a pool process that is gone;
- `celeryd_init` / `worker_shutdown`: the heartbeat file `jobs health live --local` reads
  (heartbeat.py): its bootsteps are added before the worker is built, and the file is
  removed once the worker has stopped.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import signals

from jobs.observe import heartbeat, watchdog
from jobs.observe.logging import install_worker_logging
from jobs.observe.metrics import LOCK_HOLD_SECONDS, WORKFLOW_STEP_SECONDS, multiprocess_dir
from resilience.outcomes import OutcomeStored
from resilience.workflows import observe_steps

LOCK_GUARDS = ("singleton", "exclusive")

_started: dict[str, tuple[float, str]] = {}
_lock_kinds: dict[str, str | None] = {}


def lock_kind(task: Any) -> str | None:
    """The lock guard kind of `task` ('singleton' / 'exclusive'), or None."""
    if task.name in _lock_kinds:
        return _lock_kinds[task.name]
    kind = None
    try:
        execution, _ = task.pipelines()
        for guard in execution.guards:
            if getattr(guard, "name", None) in LOCK_GUARDS:
                kind = guard.name
                break
    except Exception:  # noqa: BLE001 - a task without guards holds no lock
        kind = None
    _lock_kinds[task.name] = kind
    return kind


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


@signals.celeryd_init.connect(weak=False)
def _install_heartbeat(instance: Any = None, **_: Any) -> None:
    if instance is not None:
        heartbeat.install(instance.app)
        watchdog.install(instance.app)  # restarts a worker that stopped consuming


@signals.worker_shutdown.connect(weak=False)
def _stop_heartbeat(sender: Any = None, **_: Any) -> None:
    heartbeat.stop_heartbeat(sender)


def _observe_step(task_name: str, state: str, seconds: float) -> None:
    WORKFLOW_STEP_SECONDS.labels(task=task_name, state=state).observe(seconds)


observe_steps(_observe_step)
install_worker_logging()
