"""The same tiers work with RabbitMQ as the broker (`BROKER_URL=amqp://...`).

RabbitMQ cannot be embedded from PyPI, so this test needs a reachable server
(`RABBITMQ_URL`, default the local one on 5672) and says so when there is none.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.harness import Worker
from tests.support import RABBITMQ_URL, ROOT, rabbitmq_reachable


@pytest.mark.skipif(not rabbitmq_reachable(), reason=f"no RabbitMQ at {RABBITMQ_URL}")
@pytest.mark.timeout(120)
def test_task_runs_on_its_tier_worker_over_rabbitmq(services: Any) -> None:
    """A worker on BROKER_URL=amqp:// runs a critical task sent by a producer on the same broker."""
    _delete_tier_queues()
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


PRODUCER = r"""
import json, sys, threading
from jobs import app
from resilience.errors import TierFull

app.loader.import_default_modules()
task = app.tasks["tests.tasks.whoami_optional"]
counts = {"sent": 0, "full": 0, "other": []}
lock = threading.Lock()
barrier = threading.Barrier(4)

def produce():
    barrier.wait()
    for _ in range(15):
        try:
            task.delay()
            outcome = "sent"
        except TierFull:
            outcome = "full"
        except Exception as exc:
            with lock:
                counts["other"].append(f"{type(exc).__name__}: {exc}")
            continue
        with lock:
            counts[outcome] += 1

threads = [threading.Thread(target=produce) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(counts))
"""

REPUBLISH = r"""
import json, time
from sqlalchemy import text
from jobs import app
from resilience.outbox.relay import Relay
from resilience.stores import stores_for

app.loader.import_default_modules()
task = app.tasks["tests.tasks.whoami_optional"]
result = task.apply_async(retries=1)   # a republish (Celery's retry) to the full queue
with stores_for(app).engine().connect() as db:
    row = db.execute(text("select state, due_at > now() from resilience_outbox "
                          "where task_id = :id"), {"id": result.id}).one()
with app.connection_for_write() as connection:
    channel = connection.default_channel
    channel.queue_purge("optional")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        Relay(app).relay_once()
        _, depth, _ = channel.queue_declare("optional", passive=True)
        if depth:
            break
        time.sleep(0.5)
print(json.dumps({"row": row[0], "due_later": row[1], "depth": depth}))
"""


def _delete_tier_queues() -> None:
    """Queues left by an older declaration (other arguments) would refuse the new one."""
    from kombu import Connection

    with Connection(RABBITMQ_URL, connect_timeout=5) as connection:
        for queue in ("critical", "standard", "optional"):
            connection.default_channel.queue_delete(queue)


@pytest.mark.skipif(not rabbitmq_reachable(), reason=f"no RabbitMQ at {RABBITMQ_URL}")
@pytest.mark.timeout(180)
def test_tier_bound_is_exact_on_rabbitmq_and_a_refused_republish_is_kept(services: Any) -> None:
    """Four producer threads send 60 jobs at a tier limited to 25 on RabbitMQ: exactly 25
    are queued (x-max-length with reject-publish, publisher confirms), the other 35 get
    TierFull, nothing else. A republish (Celery's retry) to the full queue goes to the
    outbox instead of being lost, and the relay publishes it once there is room."""
    _delete_tier_queues()
    env = {**os.environ, "BROKER_URL": RABBITMQ_URL, "PYTHONPATH": str(ROOT),
           "JOBS_OPTIONAL__MAX_QUEUE_DEPTH": "25", "JOBS_OPTIONAL__REJECTION_POLICY": "abort"}
    try:
        produced = subprocess.run([sys.executable, "-c", PRODUCER], cwd=ROOT, env=env,
                                  capture_output=True, text=True, timeout=150)
        assert produced.returncode == 0, produced.stderr[-3000:]
        counts = json.loads(produced.stdout.strip().splitlines()[-1])
        assert counts == {"sent": 25, "full": 35, "other": []}
        from kombu import Connection

        with Connection(RABBITMQ_URL, connect_timeout=5) as connection:
            _, depth, _ = connection.default_channel.queue_declare("optional", passive=True)
        assert depth == 25

        republished = subprocess.run([sys.executable, "-c", REPUBLISH], cwd=ROOT, env=env,
                                     capture_output=True, text=True, timeout=150)
        assert republished.returncode == 0, republished.stderr[-3000:]
        report = json.loads(republished.stdout.strip().splitlines()[-1])
        assert report == {"row": "pending", "due_later": True, "depth": 1}
    finally:
        _delete_tier_queues()
