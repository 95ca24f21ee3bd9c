"""The Celery app of the compose workers: `celery -A tests.resilience.compose.worker_app`.

The compose workers get `REDIS_URL`, `DATABASE_URL` and `REDLOCK_URLS` pointing at the
fault-injection proxies and the test's Redlock nodes (see conftest), so every guard, the
dead-letter place and the lock registry go through the proxies. Two things must not:

- the result backend, which `jobs` derives from `REDIS_URL`: it stays on the session's
  Redis (`COMPOSE_RESULT_BACKEND`), so outcomes are still recorded while guard Redis is
  "down" and the producer reads them where it always does;
- the broker (`BROKER_URL`, the session's Redis db 0), which is left as it is.

The compose queues are declared here, before the worker resolves `-Q compose` (with
`task_create_missing_queues` off, an undeclared queue is an error at start).
"""

from __future__ import annotations

import os

from jobs import app
from tests.resilience.compose.tasks import register_queues

register_queues(app)

_backend = os.environ.get("COMPOSE_RESULT_BACKEND")
if _backend:
    app.conf.result_backend = _backend

__all__ = ["app"]
