"""Bench tasks of the workflows scenario: one no-op step four ways.

- `workflows_bench_plain`: a plain Celery task (`Celery.task`, no guards of its own; on an
  initialised app the library still makes it a `GuardedTask` carrying only the library's
  default guards, the workflow pair: one header lookup per job), its result stored in the
  Redis result backend as stock Celery stores it (SUCCESS only: `track_started` off,
  Celery's default), which a stock chord needs;
- `workflows_bench_durable`: the same task with its result ignored by Celery: a durable
  workflow keeps each step's result in PostgreSQL and needs no result backend;
- `workflows_bench_platform` / `workflows_bench_platform_durable`: the same two as platform
  tasks (`app.task`: the platform's default guards, the tier bulkhead on every publish),
  for what the platform's guards cost apart from the workflow machinery.

A step takes any results passed to it (a chain's previous value, a chord body's list) and
returns 1; the last step of a chain and a chord's body are given `counter` and INCR it in
Redis, which is how the scenario sees a workflow end.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery, signals

from jobs import app
from resilience.stores import stores_for

QUEUE = "standard"


def _step(values: tuple[Any, ...], counter: str | None) -> int:
    if counter is not None:
        stores_for(app).redis().incr(counter)
    return 1


@Celery.task(app, name="bench.workflows.plain", queue=QUEUE, track_started=False)
def workflows_bench_plain(*values: Any, counter: str | None = None) -> int:
    """A no-op step (plain Celery, result backend); INCR `counter` when given."""
    return _step(values, counter)


@Celery.task(app, name="bench.workflows.durable", queue=QUEUE, ignore_result=True)
def workflows_bench_durable(*values: Any, counter: str | None = None) -> int:
    """A no-op step (plain Celery, no result backend); INCR `counter` when given."""
    return _step(values, counter)


@app.task(tier=QUEUE, name="bench.workflows.platform", track_started=False)
def workflows_bench_platform(*values: Any, counter: str | None = None) -> int:
    """A no-op step (platform task, result backend); INCR `counter` when given."""
    return _step(values, counter)


@app.task(tier=QUEUE, name="bench.workflows.platform_durable", ignore_result=True)
def workflows_bench_platform_durable(*values: Any, counter: str | None = None) -> int:
    """A no-op step (platform task, no result backend); INCR `counter` when given."""
    return _step(values, counter)


# -- profiling (only when `BENCH_PROFILE_DIR` is set in a worker's environment) -------------
#: Where pool processes write their cProfile stats (`<dir>/<pid>.prof`); unset: no profiling.
PROFILE_DIR_ENV = "BENCH_PROFILE_DIR"
#: "cpu": the profiles time each function in CPU seconds of its process (what a step costs
#: the machine, waits excluded); anything else: wall-clock seconds (waits included).
PROFILE_CLOCK_ENV = "BENCH_PROFILE_CLOCK"

_profile: Any = None


def _start_profile(**_: Any) -> None:
    """This process profiles everything it runs from now on (cProfile): the worker's main
    process (consumer, event loop, acks, events) from `worker_init`, each pool process
    from its start."""
    global _profile
    import cProfile
    import time

    cpu = os.environ.get(PROFILE_CLOCK_ENV) == "cpu"
    _profile = cProfile.Profile(time.process_time) if cpu else cProfile.Profile()
    _profile.enable()


def _dump_profile(role: str) -> Any:
    def dump(**_: Any) -> None:
        if _profile is not None:
            _profile.disable()
            _profile.dump_stats(
                os.path.join(os.environ[PROFILE_DIR_ENV], f"{role}-{os.getpid()}.prof"))

    return dump


if os.environ.get(PROFILE_DIR_ENV):
    signals.worker_init.connect(_start_profile, weak=False)
    signals.worker_shutdown.connect(_dump_profile("main"), weak=False)
    signals.worker_process_init.connect(_start_profile, weak=False)
    signals.worker_process_shutdown.connect(_dump_profile("pool"), weak=False)
