"""What the fault tests share: redelivering a killed worker's messages, killing pool processes."""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from typing import Any

import psutil


def restore_unacked(app: Any, visibility_timeout_seconds: float) -> None:
    """Redeliver messages unacknowledged longer than `visibility_timeout_seconds`, as a
    worker's transport does on its own only every ~100 s (restore interval x throttle).

    The tests call it every half second or so with their workers' visibility timeout, which
    is longer than any task's hard limit or countdown there, so it never takes back a
    message a live worker holds.
    """
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        channel.visibility_timeout = int(visibility_timeout_seconds)
        channel.qos.restore_visible(num=10_000, interval=1)


def kill_pool_child(worker: Any, rng: random.Random) -> bool:
    """SIGKILL one of `worker`'s pool processes at random; False when it has none now."""
    try:
        children = worker.children() if worker.alive() else []
    except psutil.Error:
        return False
    if not children:
        return False
    try:
        os.kill(rng.choice(children).pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def supervise(workers: list[Any]) -> int:
    """Start again every worker that exited on its own, as the platform's supervisor does
    (honcho under `jobs up`, Kubernetes, compose's `restart:`); returns how many.

    Celery stops a worker on purpose when a pool process dies before the pool has started
    (`WorkerLostError: Could not start worker processes`), which random pool kills right
    after a restart sometimes hit: without a supervisor that worker's queue would simply
    stop being consumed, which is not a lost job.
    """
    restarted = 0
    for worker in workers:
        if worker.process is not None and not worker.alive():
            worker.start(wait=False)
            restarted += 1
    return restarted


def chaos_loop(workers: list[Any], rng: random.Random, *, seconds: float,
               done: Callable[[], bool], max_worker_kills: int) -> tuple[dict[str, int], float]:
    """SIGKILL a random pool process every 0.2-0.5 s, and a whole worker (started again at
    once) every 6 s up to `max_worker_kills`, for `seconds` or until `done()`; restart
    workers that exited on their own. Returns the kill counts and when the last whole
    worker was killed (its unacked messages come back a visibility timeout later)."""
    kills = {"child": 0, "worker": 0, "exited": 0}
    started = last_worker_kill = time.monotonic()
    while time.monotonic() - started < seconds and not done():
        time.sleep(rng.uniform(0.2, 0.5))
        kills["exited"] += supervise(workers)
        victim = rng.choice(workers)
        elapsed = time.monotonic() - started
        if kills["worker"] < max_worker_kills and elapsed > 3 + 6 * kills["worker"]:
            victim.sigkill()
            last_worker_kill = time.monotonic()
            victim.start(wait=False)
            kills["worker"] += 1
        elif kill_pool_child(victim, rng):
            kills["child"] += 1
    return kills, last_worker_kill
