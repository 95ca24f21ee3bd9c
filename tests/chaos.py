"""What the fault tests share: redelivering a killed worker's messages, killing pool processes."""

from __future__ import annotations

import os
import random
import signal
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
