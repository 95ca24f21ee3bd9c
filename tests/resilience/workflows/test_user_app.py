"""Durable workflows in a user's own Celery app, on its own worker process."""

from __future__ import annotations

import importlib
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import chain, group

from tests.support import Services, Worker, wait_for

pytestmark = pytest.mark.timeout(120)

MODULE = "tests.resilience.workflows.user_app"


class UserWorker(Worker):
    """`celery -A tests.resilience.workflows.user_app worker` on the app's queue."""

    def command(self) -> list[str]:
        return [sys.executable, "-m", "celery", "-A", MODULE, "worker", "-Q", self.queues,
                "-n", self.nodename, "-c", "2", "-P", "prefork", "--without-gossip",
                "--without-mingle", "--without-heartbeat", "--loglevel", "INFO"]

    def wait_ready(self, timeout_seconds: float = 60) -> None:
        wait_for(self._ready, timeout_seconds=timeout_seconds,
                 message=f"user worker {self.nodename}")

    def _ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"worker {self.nodename} exited:\n{self.log_tail()}")
        return " ready." in self.log_tail(20000)


@pytest.fixture()
def user_app(services: Services, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The user's app in this process and one worker of it, on a queue of its own."""
    env = {
        "WF_USER_BROKER_URL": f"{services.redis_base}/2",
        "WF_USER_REDIS_URL": f"{services.redis_base}/3",
        "WF_USER_DATABASE_URL": services.database_url,
        "WF_USER_QUEUE": f"workflow-user-{uuid.uuid4().hex[:8]}",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    sys.modules.pop(MODULE, None)
    module = importlib.import_module(MODULE)
    worker = UserWorker(env["WF_USER_QUEUE"], name="workflow-user", env={
        **env, "BROKER_URL": env["WF_USER_BROKER_URL"],
        "RESULT_BACKEND": env["WF_USER_BROKER_URL"]})
    worker.start()
    try:
        yield module
    finally:
        # Its warm shutdown outlasts the test budget (~20 s); the test is over, nothing of
        # it is in flight: killed at once.
        worker.sigkill()
        worker.stop()
        sys.modules.pop(MODULE, None)


def test_a_user_app_runs_durable_steps_with_no_extra_code(user_app: Any) -> None:
    """`@shared_task` and `@app.task` tasks of an app given only `init_app` are steps: the
    chain with a group runs to plain Celery's result, read from PostgreSQL."""
    from resilience.task import GuardedTask
    from resilience.workflows import WorkflowState, durable

    app = user_app.app
    double = app.tasks["workflow_user.double"]
    plus = app.tasks["workflow_user.plus"]
    gather = app.tasks["workflow_user.gather"]
    assert isinstance(double, GuardedTask) and isinstance(plus, GuardedTask)
    run = durable(chain(plus.s(1, 2), group(double.s(), plus.s(10)), gather.s()),
                  name="user-app", app=app).apply_async()
    assert run.get(timeout=60) == [6, 13]
    assert run.state is WorkflowState.SUCCEEDED
