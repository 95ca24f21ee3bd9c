"""Cached readiness: the worker records its store checks in a file, the probe reads it.

Real Redis and PostgreSQL: the recorder's checks really PING and SELECT; a Redis URL on a
closed port makes the record say not ready, and the same probe says ready again once the
URL is back. A record nobody refreshes goes stale and is not ready either.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from jobs.embedded import free_port
from jobs.observe.health import (
    Check,
    ReadinessRecorder,
    check_postgres,
    local_readiness,
    ping_redis,
    readiness_path,
    write_readiness,
)
from tests.support import ROOT, wait_for

pytestmark = pytest.mark.timeout(120)


def ready(checks: list[Check]) -> bool:
    return all(check.ok for check in checks)


def test_the_record_follows_the_checked_stores_and_goes_stale(
    app: Any, stores: Any, tmp_path: Path
) -> None:
    """Ready while Redis and PostgreSQL answer; not ready while the checked Redis URL is a
    closed port (the `redis` check says why); ready again when it is back; not ready once
    the record is older than the probe's max age."""
    target = {"url": stores.redis_url}

    def check() -> list[Check]:
        client = redis.Redis.from_url(target["url"], socket_connect_timeout=1,
                                      socket_timeout=1)
        try:
            return [ping_redis(client), *check_postgres(app)]
        finally:
            client.close()

    path = tmp_path / "worker@test.ready"
    recorder = ReadinessRecorder(path, check, interval_seconds=0.2)
    recorder.start()
    try:
        wait_for(lambda: path.exists(), timeout_seconds=10, message="the first record")
        assert ready(local_readiness("worker@test", path=path, max_age_seconds=5))

        target["url"] = f"redis://127.0.0.1:{free_port()}/0"
        wait_for(lambda: not ready(local_readiness("worker@test", path=path,
                                                   max_age_seconds=5)),
                 timeout_seconds=10, interval=0.1, message="not ready with Redis down")
        checks = {c.name: c for c in local_readiness("worker@test", path=path,
                                                     max_age_seconds=5)}
        assert not checks["redis"].ok and checks["postgres"].ok and checks["migrations"].ok
        assert checks["readiness worker@test"].ok  # the record is fresh: it is the store

        target["url"] = stores.redis_url
        wait_for(lambda: ready(local_readiness("worker@test", path=path, max_age_seconds=5)),
                 timeout_seconds=10, interval=0.1, message="ready again")
    finally:
        recorder.stop()
    assert not path.exists()  # a stopped worker leaves no record behind

    write_readiness(path, [Check("redis", True, "PONG")])
    os.utime(path, (time.time() - 60,) * 2)  # checked a minute ago
    stale = local_readiness("worker@test", path=path, max_age_seconds=45)
    assert not stale[0].ok and stale[1].ok  # the recorded check passed, but long ago
    assert local_readiness("nobody@nowhere", path=tmp_path / "missing")[0].ok is False


@pytest.mark.timeout(180)
def test_a_worker_records_its_readiness_and_the_probe_reads_it(worker_factory: Any) -> None:
    """A real worker writes `<node>.ready` beside its heartbeat; `jobs health ready --local`
    exits 0 for it and 1 for a node with no record; the file goes when the worker stops."""
    worker = worker_factory("optional", name="observe-ready", concurrency=1)
    node = worker.nodename
    wait_for(lambda: ready(local_readiness(node, max_age_seconds=30)), timeout_seconds=60,
             interval=0.2, message=f"{node} recorded ready")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "jobs", "health", "ready", "--local",
                           "--node", node], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok broker" in done.stdout and "ok redis" in done.stdout
    missing = subprocess.run([sys.executable, "-m", "jobs", "health", "ready", "--local",
                              "--node", "optional@no-such-host"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "FAIL readiness" in missing.stdout, missing.stdout
    worker.stop()
    wait_for(lambda: not readiness_path(node).exists(), timeout_seconds=30,
             message="the record removed at shutdown")


def test_the_recorder_starts_after_the_pool_has_forked_its_processes() -> None:
    """The heartbeat step (which starts the readiness thread) starts after the pool step in
    every worker: the thread's first check imports modules (psycopg2.extras, alembic), and
    a pool process forked meanwhile inherits their import locks held, so its first
    PostgreSQL statement hangs until the task's time limit. The steps come from a set, so
    the order is checked in fresh processes."""
    script = (
        "from celery.worker.worker import WorkController\n"
        "from jobs import app\n"
        "from jobs.observe import watchdog\n"
        "app.steps['worker'].add(watchdog.WorkerHeartbeat)\n"
        "blueprint = WorkController.Blueprint(steps=app.steps['worker'])\n"
        "names = [s.name for s in blueprint._finalize_steps(blueprint.claim_steps())]\n"
        "print(names.index('celery.worker.components.Pool')"
        " < names.index('jobs.observe.watchdog.WorkerHeartbeat'))\n"
    )
    for _ in range(6):
        done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                              text=True, timeout=120, check=True)
        assert done.stdout.strip().splitlines()[-1] == "True", done.stdout
