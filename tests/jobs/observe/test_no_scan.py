"""Periodic paths never SCAN the guard Redis: `jobs status` and a Prometheus scrape read the
names the app's tasks declare (MGET / pipelines), while explicit admin listings still SCAN.

Run against a Redis of the test's own (an embedded redis-server), so `INFO commandstats`
counts only what the processes under test sent, whatever else runs on the shared Redis.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from jobs.embedded import embedded_redis, free_port
from tests.support import ROOT

pytestmark = pytest.mark.timeout(120)

UNRELATED_KEYS = 5000


@pytest.fixture()
def private_redis(tmp_path: Path) -> Iterator[tuple[str, redis.Redis]]:
    server = embedded_redis(free_port(), tmp_path / "redis").start()
    client = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        yield server.url, client
    finally:
        client.close()
        server.stop()


def scans(client: redis.Redis) -> int:
    """SCAN calls the server has answered since it started."""
    return int(client.info("commandstats").get("cmdstat_scan", {}).get("calls", 0))


def jobs(args: list[str], redis_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REDIS_URL": redis_url}
    env.pop("JOBS_REDIS_URL", None)
    return subprocess.run([sys.executable, "-m", "jobs", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=100)


def fill(client: redis.Redis) -> None:
    """5,000 unrelated keys, plus state of declared and undeclared guards."""
    from resilience.circuit.backends.redis import RedisBreakerBackend
    from resilience.circuit.breaker import CircuitBreaker
    from resilience.circuit.config import BreakerConfig
    from resilience.pause.backends.redis import RedisPauseBackend
    from resilience.ratelimit import RedisBackend
    from resilience.ratelimit.algorithms import LEASE, Params
    from resilience.retry.budget import RedisBudgetBackend, RetryBudget

    with client.pipeline(transaction=False) as pipe:
        for n in range(UNRELATED_KEYS):
            pipe.set(f"unrelated:{n}", n)
        pipe.execute()
    breakers = RedisBreakerBackend(lambda: client)
    CircuitBreaker(BreakerConfig(name="observe-snapshot-dep"), breakers).force("forced_open")
    CircuitBreaker(BreakerConfig(name="observe-undeclared-dep"), breakers).force("forced_open")
    budgets = RedisBudgetBackend(lambda: client)
    for _ in range(4):
        budgets.decide("observe-budget-dep", "request", RetryBudget())
    assert RedisBackend(client).run(LEASE, "observe-slots", Params.of_slots(3, lease_seconds=60),
                                    "a").allowed
    RedisPauseBackend(client).pause("tier", "optional", reason="no-scan test")


def test_status_and_scrape_issue_no_scan(private_redis: tuple[str, Any],
                                         start_server: Any) -> None:
    """With 5,000 unrelated keys and stored guard state, `jobs status --json` and two
    /metrics scrapes send no SCAN and still show the declared guards' live state; the
    admin listing `jobs breakers list` does SCAN and shows the undeclared breaker too."""
    url, client = private_redis
    fill(client)
    before = scans(client)

    done = jobs(["status", "--json"], url)
    assert done.stdout.strip(), done.stderr[-2000:]
    snapshot = json.loads(done.stdout)
    breakers = {row["name"]: row for row in snapshot["breakers"]}
    assert breakers["observe-snapshot-dep"]["state"] == "forced_open"
    assert "observe-undeclared-dep" not in breakers  # undeclared: admin listing only
    budgets = {row["dependency"]: row for row in snapshot["budgets"]}
    assert budgets["observe-budget-dep"]["requests"] == 4
    slots = {row["name"]: row for row in snapshot["limits"]["concurrency"]}
    assert slots["observe-slots"]["in_use"] == 1
    assert slots["observe-keyed"]["in_use"] is None and slots["observe-keyed"]["keyed"]
    assert [(p["scope"], p["name"]) for p in snapshot["paused"]] == [("tier", "optional")]

    server = start_server("metrics", {"REDIS_URL": url, "JOBS_REDIS_URL": url})
    for _ in range(2):
        status, body = server.get("/metrics")
        assert status == 200
    text = body.decode()
    assert 'jobs_breaker_state{breaker="observe-snapshot-dep",state="forced_open"} 1.0' in text
    assert 'jobs_concurrency_in_use{limit="observe-slots"} 1.0' in text
    assert scans(client) - before == 0

    listed = jobs(["breakers", "list"], url)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "observe-undeclared-dep" in listed.stdout
    assert scans(client) - before > 0  # the measurement sees a SCAN when there is one
