"""In-process aggregates flushed to Redis: per process, fork-safe, flushed at shutdown.

A guard whose happy path only adds to a fleet-wide count (a breaker's successes, a retry
budget's requests) keeps the count in an `Aggregate` here and sends it as one script call
at most every `interval` seconds instead of one per job (issue 14: fewer Redis operations
per job). Decisions (failures, retries, state changes) never wait here.

Who flushes, and why both:

- the call that finds its aggregate due queues the flush into its own write round
  (`resilience.pipeline.Call.writes`), so under traffic a flush shares the round trip the
  call may make anyway and runs on the worker's thread, in order with its other writes;
- a daemon timer thread, running only while something is pending, flushes what no call
  came to take (traffic stopped), so a count never sits longer than `interval` plus one
  tick, whatever the traffic.

Per process: the registry is replaced in a forked child (the connection layer's one fork
hook, `resilience.connections.on_fork`), so a prefork child never sends its parent's counts
again, and starts its own timer.
At a normal end everything pending is flushed (`atexit`, and Celery's
`worker_process_shutdown`, which a prefork child sends before it exits without running
atexit). A SIGKILLed process loses what it held: at most one interval's counts.

Flushes are best effort: an error is logged by the aggregate and its counts are dropped
(a lost count costs less than a job waiting on a dead store).

This module is shared by `resilience.circuit` and `resilience.retry`; it imports neither.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any, Protocol, TypeVar

from celery import signals

from resilience.connections import on_fork

logger = logging.getLogger("resilience.flushing")

#: Shortest sleep of the timer thread (seconds), whatever the intervals.
MIN_TICK_SECONDS = 0.005


class Aggregate(Protocol):
    """Counts held in this process for one fleet-wide object."""

    def flush(self, now: float, *, force: bool = False) -> bool:
        """Send what is due at `now` (monotonic seconds), everything with `force`; True
        while something is still pending. Never raises."""


A = TypeVar("A", bound=Aggregate)


class Pending:
    """Counts per key held in this process, and when the oldest of them was added: the
    bookkeeping every `Aggregate` shares (a breaker's successes per generation, a budget's
    requests). Thread-safe; the first count after a send wakes the timer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[Hashable, int] = {}
        self._since: float | None = None  # when the oldest count was added
        self.interval = 0.1

    def __bool__(self) -> bool:
        return bool(self._counts)

    def add(self, key: Hashable, now: float, interval: float) -> None:
        """Count one under `key` at `now`; the counts are due `interval` s after the oldest."""
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1
            first = self._since is None
            if first:
                self._since = now
            self.interval = interval
        if first:
            wake(interval)

    def due(self, now: float) -> bool:
        """Are the counts old enough to send at `now`?"""
        since = self._since
        return since is not None and now - since >= self.interval

    def take(self) -> dict[Hashable, int]:
        """Every count (and none left)."""
        with self._lock:
            counts, self._counts, self._since = self._counts, {}, None
        return counts


class _Registry:
    """This process's aggregates and its timer thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.members: dict[Hashable, Aggregate] = {}
        self.thread: threading.Thread | None = None
        self.tick = 0.05
        #: Set by `wake`; the timer only stops after a pass that saw nothing new.
        self.dirty = False


_registry = _Registry()


def _after_fork_in_child() -> None:
    global _registry
    _registry = _Registry()  # the parent's counts are the parent's to send; its lock may be held


on_fork(_after_fork_in_child)


def member(key: Hashable, make: Callable[[], A]) -> A:
    """The aggregate of `key` in this process, made on first use."""
    registry = _registry
    found = registry.members.get(key)
    if found is None:
        with registry.lock:
            found = registry.members.get(key)
            if found is None:
                found = registry.members[key] = make()
    return found  # type: ignore[return-value]


def wake(interval: float) -> None:
    """Something became pending: make sure the timer runs (ticking at least every
    `interval` / 2 seconds)."""
    registry = _registry
    with registry.lock:
        registry.dirty = True
        registry.tick = min(registry.tick, max(MIN_TICK_SECONDS, interval / 2))
        if registry.thread is None:
            registry.thread = threading.Thread(target=_run, args=(registry,),
                                               name="resilience-flush", daemon=True)
            registry.thread.start()


def _run(registry: _Registry) -> None:
    """The timer: flush what is due each tick; stop once nothing is pending."""
    while True:
        time.sleep(registry.tick)
        if registry is not _registry:  # replaced (a forked child has its own)
            return
        with registry.lock:
            registry.dirty = False
            members = list(registry.members.values())
        pending = False
        now = time.monotonic()
        for aggregate in members:
            pending |= _flush(aggregate, now, force=False)
        with registry.lock:
            if not pending and not registry.dirty:
                registry.thread = None
                return


def _flush(aggregate: Aggregate, now: float, *, force: bool) -> bool:
    try:
        return aggregate.flush(now, force=force)
    except Exception:  # an aggregate never raises; if one does, the others still flush
        logger.exception("flushing %r failed", aggregate)
        return False


def flush_all(*_args: Any, **_kwargs: Any) -> None:
    """Send everything this process holds now (shutdown, from atexit or a signal; tests)."""
    registry = _registry
    with registry.lock:
        members = list(registry.members.values())
    now = time.monotonic()
    for aggregate in members:
        _flush(aggregate, now, force=True)


atexit.register(flush_all)
# A prefork child exits without atexit: Celery tells it first.
signals.worker_process_shutdown.connect(flush_all, weak=False)
