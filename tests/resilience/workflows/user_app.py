"""A user's own Celery app running durable workflows, guarded by `resilience.init_app` alone.

No platform, no tiers, no guard decorators: `@shared_task` and `@app.task` tasks become
workflow steps because `init_app` makes every task of the app a `GuardedTask` with the
library's default guards. Configured through the environment (the test sets it):

    WF_USER_BROKER_URL     broker and result backend
    WF_USER_REDIS_URL      app.conf.resilience_redis_url
    WF_USER_DATABASE_URL   app.conf.resilience_database_url
    WF_USER_QUEUE          the app's default queue

Not named tasks*.py: the platform's test workers must not load it.
"""

from __future__ import annotations

import os

from celery import Celery, shared_task

import resilience
from resilience.idempotency import idempotent

app = Celery("workflow-user", broker=os.environ.get("WF_USER_BROKER_URL"),
             backend=os.environ.get("WF_USER_BROKER_URL"), set_as_current=False)
app.conf.update(
    task_default_queue=os.environ.get("WF_USER_QUEUE", "workflow-user"),
    task_serializer="json",
    accept_content=["json"],
    resilience_redis_url=os.environ.get("WF_USER_REDIS_URL", "redis://127.0.0.1:6379/1"),
    resilience_database_url=os.environ.get("WF_USER_DATABASE_URL"),
)
resilience.init_app(app)


@shared_task(name="workflow_user.double")
def double(value: int) -> int:
    """A plain `@shared_task`: a step with no extra code."""
    return value * 2


@app.task(name="workflow_user.plus")
def plus(value: int, amount: int) -> int:
    return value + amount


@app.task(name="workflow_user.gather")
@idempotent()
def gather(values: list[int]) -> list[int]:
    """Guarded by a decorator too: its default key is the step's."""
    return sorted(values)
