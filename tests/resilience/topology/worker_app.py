"""The Celery app of the Sentinel test's workers: `celery -A tests.resilience.topology.worker_app`.

It declares the `topology` queue before the worker resolves `-Q topology` (an undeclared
queue is an error at start with task_create_missing_queues off).
"""

from __future__ import annotations

from jobs import app
from tests.resilience.topology.tasks import register_queue

register_queue(app)

__all__ = ["app"]
