"""The same tiers work with RabbitMQ as the broker (`BROKER_URL=amqp://...`).

RabbitMQ cannot be embedded from PyPI, so this test needs a reachable server
(`RABBITMQ_URL`, default the local one on 5672) and says so when there is none.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from tests.harness import Worker
from tests.support import ROOT

RABBITMQ_URL = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")


def _rabbitmq_reachable() -> bool:
    from kombu import Connection

    try:
        with Connection(RABBITMQ_URL, connect_timeout=2) as connection:
            connection.ensure_connection(max_retries=1)
        return True
    except Exception:  # noqa: BLE001 - any failure means unreachable
        return False


@pytest.mark.skipif(not _rabbitmq_reachable(), reason=f"no RabbitMQ at {RABBITMQ_URL}")
@pytest.mark.timeout(120)
def test_task_runs_on_its_tier_worker_over_rabbitmq(services: Any) -> None:
    """A worker on BROKER_URL=amqp:// runs a critical task sent by a producer on the same broker."""
    env = {"BROKER_URL": RABBITMQ_URL}
    worker = Worker("critical", name="critical-amqp", concurrency=1, env=env).start(wait=False)
    try:
        producer = subprocess.run(
            [sys.executable, "-c",
             "from jobs import app\n"
             "app.loader.import_default_modules()\n"
             "r = app.tasks['tests.tasks.whoami_critical'].delay()\n"
             "print(r.get(timeout=60)['hostname'])"],
            cwd=ROOT, env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
            capture_output=True, text=True, timeout=90,
        )
        assert producer.returncode == 0, producer.stderr[-2000:] + worker.log_tail()
        assert producer.stdout.strip() == worker.nodename
    finally:
        worker.stop()
