"""Bench tasks of the enqueue scenario: one no-op published six ways, into a queue no worker
consumes. The peers (celery-once, celery-singleton: `make bench` installs them) are plain
Celery tasks with their own base class; None when not installed.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from jobs import app
from resilience.idempotency import unique

QUEUE = "optional"  # a tier queue; no worker runs during the scenario


@Celery.task(app, name="bench.enqueue.celery", queue=QUEUE, ignore_result=True)
def enqueue_celery(n: int) -> None:
    """Plain Celery: no platform guard."""


@app.task(tier="optional", name="bench.enqueue.platform", queue=QUEUE, ignore_result=True)
def enqueue_platform(n: int) -> None:
    """A platform task with the platform's default enqueue guards."""


@app.task(tier="optional", name="bench.enqueue.unique", queue=QUEUE, ignore_result=True)
@unique(key="{n}")
def enqueue_unique(n: int) -> None:
    """The same with `@unique` on the argument."""


def _peer(module: str, attribute: str, name: str) -> Any:
    try:
        base = getattr(__import__(module, fromlist=[attribute]), attribute)
    except ImportError:
        return None

    def body(n: int) -> None:
        """A peer's unique task."""

    body.__name__ = name.rsplit(".", 1)[-1]
    return Celery.task(app, name=name, base=base, queue=QUEUE, ignore_result=True)(body)


enqueue_celery_once = _peer("celery_once", "QueueOnce", "bench.enqueue.celery_once")
enqueue_celery_singleton = _peer("celery_singleton", "Singleton",
                                 "bench.enqueue.celery_singleton")
