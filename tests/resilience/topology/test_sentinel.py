"""Guard state on a real Sentinel-managed Redis (`redis+sentinel://`), through a failover.

A real Celery worker runs with `REDIS_URL` on the Sentinel service (its broker and result
backend stay the session's Redis: kombu's and Celery's, not the guards'). A stream of
guarded jobs runs while the master is SIGKILLed; the replica is promoted, the guards fail
open meanwhile and then decide against the new master, no job is lost and none ran twice.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from resilience.circuit import BreakerConfig, CircuitBreaker, RedisBreakerBackend
from resilience.connections.redis import redis_from_url
from resilience.ratelimit import RedisBackend
from resilience.ratelimit.algorithms import ALGORITHMS, Params
from tests.harness import Worker, running
from tests.redis_topologies import SentinelProcesses
from tests.resilience.topology.tasks import CREATE_TABLE, QUEUE

#: Jobs in the stream, each sent twice (the duplicate must be answered, not run again).
JOBS = 40
#: Seconds between two sends: the stream lasts ~4 s, the kill comes ~1 s in.
PACE_SECONDS = 0.1
KILL_AFTER = 10


class TopologyWorker(Worker):
    """A `Worker` on the topology app module (declares the `topology` queue)."""

    def command(self) -> list[str]:
        command = super().command()
        command[command.index("-A") + 1] = "tests.resilience.topology.worker_app"
        return command


@pytest.fixture()
def sentinel() -> Iterator[SentinelProcesses]:
    setup = SentinelProcesses().start()
    try:
        yield setup
    finally:
        setup.stop()


@pytest.fixture()
def sentinel_worker(app: Any, services: Any, stores: Any,
                    sentinel: SentinelProcesses) -> Iterator[Worker]:
    with stores.engine().begin() as connection:
        connection.execute(text(CREATE_TABLE))
    with app.connection_for_write() as connection:
        connection.default_channel.queue_purge(QUEUE)
    env = {
        "REDIS_URL": sentinel.url,
        "BROKER_URL": services.broker_url,
        "RESULT_BACKEND_URL": services.redis_url,
        "JOBS_IMPORTS": "tests.resilience.topology.tasks",
    }
    with running([TopologyWorker(QUEUE, name="sentinel", concurrency=2, env=env)]) as workers:
        yield workers[0]


def gcra_decides(url: str, key: str) -> list[bool]:
    """Three calls of a 2-permit-a-minute GCRA limit on the Sentinel master at `url`."""
    client = redis_from_url(url, decode_responses=True, socket_timeout=1,
                            socket_connect_timeout=1)
    backend = RedisBackend(client)
    params = Params(limit=2, period_us=60_000_000, burst=2)
    try:
        return [backend.run(ALGORITHMS["gcra"], key, params, f"c{n}").allowed for n in range(3)]
    finally:
        client.close()


def breaker_trips(url: str, name: str) -> tuple[bool, bool]:
    """On the Sentinel master at `url`: (a fresh breaker admits, it refuses after two
    failures trip it), with per-call reads (no local copy) so each answer is the store's."""
    client = redis_from_url(url, decode_responses=True, socket_timeout=1,
                            socket_connect_timeout=1)
    breaker = CircuitBreaker(
        BreakerConfig(name=name, minimum_calls=2, failure_rate_threshold=0.5,
                      open_seconds=60, local_state_seconds=0, on_store_down="fail_closed"),
        RedisBreakerBackend(lambda: client))
    try:
        first = breaker.acquire()
        for _ in range(2):
            breaker.record(breaker.acquire(), "failure", duration_seconds=0.01)
        return first.allowed and not first.store_down, breaker.acquire().allowed
    finally:
        client.close()


@pytest.mark.chaos
def test_failover_during_a_stream_of_jobs(app: Any, engine: Any, sentinel: SentinelProcesses,
                                          sentinel_worker: Worker) -> None:
    from tests.resilience.topology.tasks import guarded

    assert gcra_decides(sentinel.url, "before") == [True, True, False]
    old_master, replica = sentinel.master, sentinel.replica
    run = f"failover-{uuid.uuid4().hex[:8]}"
    sent = []
    for n in range(JOBS):
        if n == KILL_AFTER:
            old_master.kill()
            killed_at = time.monotonic()
        sent += [guarded.apply_async(args=(run, n)), guarded.apply_async(args=(run, n))]
        time.sleep(PACE_SECONDS)

    # The replica is promoted, and a limit decides against it (a fresh key refuses the
    # 3rd call: the new master keeps the state), within a bounded time of the kill.
    deadline = killed_at + 20
    while True:
        try:
            if sentinel.master_port() == replica.port and \
                    gcra_decides(sentinel.url, f"after-{uuid.uuid4().hex[:6]}") == \
                    [True, True, False]:
                break
        except Exception:  # noqa: BLE001 - not failed over yet
            pass
        assert time.monotonic() < deadline, "no decision on the promoted replica within 20 s"
        time.sleep(0.2)
    recovered_after = time.monotonic() - killed_at
    assert replica.client().info("replication")["role"] == "master"
    # A breaker decides against the new master too: admits, trips on failures, refuses.
    assert breaker_trips(sentinel.url, f"topology-after-{uuid.uuid4().hex[:6]}") == (True, False)

    # No job lost: every message has a terminal outcome (the body's value, or its replay).
    outcomes = [result.get(timeout=60, propagate=True) for result in sent]
    values = [value if isinstance(value, int) else value["result"] for value in outcomes]
    assert sorted(values) == sorted(n for n in range(JOBS) for _ in range(2))

    # Idempotency held: each key's body ran once.
    with engine.connect() as connection:
        counts = dict(connection.execute(text(
            "SELECT n, count(*) FROM topology_executions WHERE run = :run GROUP BY n"),
            {"run": run}).all())
    assert counts == {n: 1 for n in range(JOBS)}, counts
    assert recovered_after < 20
    # The worker's guards kept their state on the Sentinel master, the new one now.
    assert any(run in key for key in replica.client().scan_iter(match="resilience:*"))
