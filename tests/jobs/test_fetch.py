"""Reliable fetch on real workers: a message on any list a worker watches is taken at once.

Each worker here has a broker of its own (a database of a private Redis), so the suite's
shared tier workers never take these jobs and the timings are one worker's alone.
"""

from __future__ import annotations

import signal
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import Worker, wait_for

JOBS = 20
ROUNDS = 7
TASK = "tests.tasks.whoami_critical"


class PrivateBroker:
    """A worker's own broker: one database of a private Redis, and a producer on it."""

    def __init__(self, app: Any, url: str) -> None:
        import redis

        self.app = app
        self.url = url
        self.client = redis.Redis.from_url(url)

    def publish(self, queue: str, count: int = 1, priority: int | None = None) -> None:
        with self.app.connection_for_write(self.url) as connection:
            for _ in range(count):
                self.app.send_task(TASK, queue=queue, routing_key=queue, priority=priority,
                                   connection=connection)

    def depth(self) -> int:
        """Messages queued or delivered and not yet acknowledged, over every list."""
        with self.client.pipeline(transaction=False) as pipe:
            for key in self.client.keys("*"):
                if key.split(b"\x06\x16")[0] in (b"critical", b"standard", b"optional"):
                    pipe.llen(key)
            pipe.hlen("unacked")
            return sum(pipe.execute())

    def drain_seconds(self, queue: str, priority: int | None = None) -> float:
        """Publish `JOBS` jobs to `queue` and time until every one ran and was acknowledged
        (acks_late: the ack follows the task's end)."""
        started = time.monotonic()
        self.publish(queue, JOBS, priority)
        wait_for(lambda: self.depth() == 0, timeout_seconds=15, interval=0.005,
                 message=f"{JOBS} jobs drained from {queue} (priority {priority})")
        return time.monotonic() - started


@pytest.fixture(scope="module")
def brokers(app: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Three workers, each on its own broker database: `-Q critical`, `-Q critical,standard`
    and no -Q (every tier)."""
    from jobs.embedded import embedded_redis, free_port

    server = embedded_redis(free_port(), Path(tmp_path_factory.mktemp("fetch")) / "redis")
    server.start()
    base = server.url.rsplit("/", 1)[0]
    layout = {"one": ("critical", 2), "two": ("critical,standard", 3), "all": ("", 4)}
    workers: dict[str, tuple[Worker, PrivateBroker]] = {}
    try:
        for label, (queues, db) in layout.items():
            url = f"{base}/{db}"
            worker = Worker(queues, name=f"fetch-{label}", concurrency=1,
                            env={"BROKER_URL": url})
            workers[label] = (worker.start(wait=False), PrivateBroker(app, url))
        for worker, broker in workers.values():
            # Control pings go through the app's own broker, so a worker is ready here once
            # it consumed a first job (`jobs worker` waits for no ping either).
            broker.publish("critical")
            wait_for(lambda w=worker, b=broker: _drained(w, b), timeout_seconds=60,
                     interval=0.1, message=f"worker {worker.nodename} consuming")
        yield {"server": server, **workers}
    finally:
        for worker, _ in workers.values():  # warm shutdowns side by side
            if worker.alive():
                worker.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        for worker, _ in workers.values():
            worker.stop()
        server.stop()


def _drained(worker: Worker, broker: PrivateBroker) -> bool:
    if not worker.alive():
        raise RuntimeError(f"worker {worker.nodename} exited:\n{worker.log_tail()}")
    return broker.depth() == 0


class TestDrainTime:
    def test_every_list_drains_as_fast_as_the_first_queue(self, brokers: dict[str, Any]) -> None:
        """20 jobs with a priority, on the second queue of a two-queue worker, and on the last
        tier of a worker of all three tiers each drain within 1.5x of 20 plain jobs on a
        one-queue worker. (The wait used to watch only the first list of the cycle, so each
        such job waited up to `brpop_timeout`: 20 s for 20 jobs.)"""
        _, one = brokers["one"]
        _, two = brokers["two"]
        _, every = brokers["all"]
        cases = {
            "plain, first queue": lambda: one.drain_seconds("critical"),
            "priority=5": lambda: one.drain_seconds("critical", priority=5),
            "second queue of -Q critical,standard": lambda: two.drain_seconds("standard"),
            "optional on a worker without -Q": lambda: every.drain_seconds("optional"),
        }
        for case in cases.values():  # warm up: first jobs fork nothing, but imports settle
            case()
        timings: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(ROUNDS):  # interleaved, so machine load hits every case alike
            for name, case in cases.items():
                timings[name].append(case())
        medians = {name: statistics.median(values) for name, values in timings.items()}
        plain = medians["plain, first queue"]
        print(f"\ndrain of {JOBS} jobs, median of {ROUNDS} (seconds):")
        for name, value in medians.items():
            print(f"  {name:40s} {value:6.3f}  ({value / plain:4.2f}x plain)  "
                  f"runs {', '.join(f'{v:.3f}' for v in timings[name])}")
        for name, value in medians.items():
            assert value <= 1.5 * plain, f"{name}: {value:.3f}s against {plain:.3f}s plain"


class TestRecovery:
    def test_a_worker_consumes_again_after_its_broker_restarts(
        self, brokers: dict[str, Any]
    ) -> None:
        """The broker's Redis stopped and started again (empty) on the same port: the
        worker reconnects, waits on every list again and drains new jobs from each tier."""
        server = brokers["server"]
        worker, every = brokers["all"]
        server.stop()
        time.sleep(0.5)
        server.start()
        assert every.depth() == 0  # the server came back empty
        for queue in ("critical", "standard", "optional"):
            every.publish(queue, priority=7)
        wait_for(lambda: _drained(worker, every), timeout_seconds=30, interval=0.05,
                 message="jobs drained after the broker restart")
        assert worker.alive()
