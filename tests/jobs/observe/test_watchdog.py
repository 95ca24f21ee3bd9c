"""The consumption watchdog: a worker that stops taking work while alive reconnects its
consumer or exits, a broker outage is waited out, and the tiers' oldest message ages."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobs.embedded import embedded_redis, free_port
from jobs.observe.backlog import fresh_backlog, oldest_ages, published_at
from jobs.observe.health import local_liveness, stalled_path
from jobs.observe.watchdog import EXIT, EXIT_STALLED, RECONNECT, ConsumerState, ConsumptionWatchdog
from resilience.counters import COUNTERS_KEY, field_for
from tests.support import RABBITMQ_URL, ROOT, rabbitmq_reachable, wait_for

#: JOBS_WORKER_STALL_SECONDS of the chaos tests' workers.
STALL_SECONDS = 4.0
PROXY = Path(__file__).with_name("freeze_proxy.py")


# -- the decision, on a clock the test moves ----------------------------------------------
class Consumer:
    """What the watchdog observes, set by the test; records what it did."""

    def __init__(self) -> None:
        self.state = ConsumerState(taken=0, free_slots=True, consuming=True,
                                   queues=("standard",))
        self.waiting: int | None = 0
        self.reads: list[float] = []
        self.actions: list[str] = []
        self.now = 0.0

    def take(self) -> None:
        self.state = ConsumerState(taken=self.state.taken + 1, free_slots=True,
                                   consuming=True, queues=self.state.queues)

    def watchdog(self, stall_seconds: float = 60.0) -> ConsumptionWatchdog:
        def backlog(queues: tuple[str, ...]) -> int | None:
            self.reads.append(self.now)
            return self.waiting

        return ConsumptionWatchdog(
            stall_seconds=stall_seconds, observe=lambda: self.state, backlog=backlog,
            reconnect=lambda: self.actions.append("reconnect"),
            give_up=lambda reason: self.actions.append("give up"),
            count=lambda action: self.actions.append(f"count {action}"),
            clock=lambda: self.now)

    def run(self, watchdog: ConsumptionWatchdog, until: float, step: float = 1.0) -> list[Any]:
        decisions = []
        while self.now < until:
            self.now += step
            decision = watchdog.check()
            if decision is not None:
                decisions.append((self.now, decision))
        return decisions


class TestStallDecision:
    def test_an_idle_worker_with_empty_queues_is_left_alone(self) -> None:
        """No backlog: nothing is done, and the broker is read at most every S/4."""
        consumer = Consumer()
        watchdog = consumer.watchdog()
        assert consumer.run(watchdog, until=600) == []
        assert consumer.actions == []
        gaps = [b - a for a, b in zip(consumer.reads, consumer.reads[1:], strict=False)]
        assert gaps and min(gaps) >= 15

    def test_a_backlog_nothing_takes_for_the_stall_time_reconnects_then_recovers(self) -> None:
        """Backlog seen twice, nothing taken for S: reconnect (counted); a message taken
        afterwards is a recovery, and nothing more is done."""
        consumer = Consumer()
        consumer.waiting = 5
        watchdog = consumer.watchdog()
        decisions = consumer.run(watchdog, until=61)
        assert decisions == [(60.0, RECONNECT)]
        assert consumer.actions == ["reconnect", f"count {RECONNECT}"]
        consumer.take()
        assert consumer.run(watchdog, until=62) == [(62.0, "recovered")]
        assert consumer.run(watchdog, until=100) == []

    def test_a_reconnect_that_does_not_help_gives_up_within_twice_the_stall_time(self) -> None:
        consumer = Consumer()
        consumer.waiting = 5
        watchdog = consumer.watchdog()
        decisions = consumer.run(watchdog, until=120)
        assert decisions == [(60.0, RECONNECT), (90.0, EXIT)]
        assert consumer.actions == ["reconnect", f"count {RECONNECT}", f"count {EXIT}",
                                    "give up"]

    def test_an_unreachable_broker_is_an_outage_and_restarts_the_clock(self) -> None:
        """Fresh reads fail: nothing is done however long it lasts; once the broker answers
        again, a consumer still taking nothing is a stall only S later."""
        consumer = Consumer()
        consumer.waiting = None
        watchdog = consumer.watchdog()
        outages = consumer.run(watchdog, until=300)
        assert {decision for _, decision in outages} == {"outage"}
        assert consumer.actions == []
        consumer.waiting = 5
        decisions = consumer.run(watchdog, until=400)
        assert decisions[0][1] == RECONNECT and decisions[0][0] >= outages[-1][0] + 60

    def test_a_blocked_loop_reads_at_once_and_an_outage_lasts_until_a_read_succeeds(
        self
    ) -> None:
        """The loop missed its beats: a fresh read at the next check, not after 3/4 S;
        unreachable, it is an outage (the worker's heartbeat is beaten meanwhile), read
        again every S/4 until the broker answers."""
        consumer = Consumer()
        consumer.waiting = None
        consumer.state = ConsumerState(taken=0, free_slots=True, consuming=True,
                                       queues=("standard",), loop_blocked=True)
        watchdog = consumer.watchdog()
        assert consumer.run(watchdog, until=1) == [(1.0, "outage")]
        assert watchdog.outage
        consumer.run(watchdog, until=46)
        assert consumer.reads == [1.0, 16.0, 31.0, 46.0]
        consumer.waiting = 0
        consumer.run(watchdog, until=61)
        assert not watchdog.outage and consumer.actions == []

    def test_no_free_slots_or_a_consumer_reconnecting_on_its_own_is_no_stall(self) -> None:
        consumer = Consumer()
        consumer.waiting = 5
        consumer.state = ConsumerState(taken=0, free_slots=False, consuming=True,
                                       queues=("standard",))
        watchdog = consumer.watchdog()
        assert consumer.run(watchdog, until=300) == []
        consumer.state = ConsumerState(taken=0, free_slots=True, consuming=False,
                                       queues=("standard",))
        assert consumer.run(watchdog, until=600) == []
        assert consumer.reads == []

    def test_the_stall_time_must_be_positive(self) -> None:
        with pytest.raises(ValueError, match="stall_seconds"):
            Consumer().watchdog(stall_seconds=0)


# -- real workers --------------------------------------------------------------------------
class Proxy:
    """`freeze_proxy.py` in its own process, in front of `upstream_port`."""

    def __init__(self, upstream_port: int) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process = subprocess.Popen(
            [sys.executable, str(PROXY), str(self.port), "127.0.0.1", str(upstream_port)],
            stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "ready"

    def freeze(self) -> int:
        """Freeze every connection open now; returns how many."""
        assert self.process.stdout is not None
        self.process.send_signal(signal.SIGUSR1)
        return int(self.process.stdout.readline().split()[1])

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(10)


@pytest.fixture()
def broker(tmp_path: Path) -> Iterator[Any]:
    """A Redis of the test's own as the worker's broker: its queues are this test's only."""
    server = embedded_redis(free_port(), tmp_path / "broker").start()
    yield server
    server.kill()


@pytest.fixture()
def proxy(broker: Any) -> Iterator[Proxy]:
    running = Proxy(int(broker.url.rsplit(":", 1)[1].split("/")[0]))
    yield running
    running.stop()


def _publish(app: Any, broker_url: str, key: str, indexes: range) -> None:
    """Enqueue `tests.watchdog.mark` jobs on `broker_url` (the platform's publish path)."""
    from tests.jobs.observe.tasks_watchdog import mark

    with app.connection_for_write(broker_url) as connection:
        producer = app.amqp.Producer(connection)
        for index in indexes:
            mark.apply_async((key, index), producer=producer)


def _start(worker_factory: Any, name: str, broker_url: str, **env: str) -> Any:
    worker = worker_factory("standard", name=name, concurrency=2, wait=False,
                            env={"BROKER_URL": broker_url,
                                 "JOBS_WORKER_STALL_SECONDS": f"{STALL_SECONDS:g}", **env})
    # The whole log: jobs waiting for the worker may push the line out of any tail.
    wait_for(lambda: " ready." in worker.log_path.read_text(errors="replace"),
             timeout_seconds=90, interval=0.2,
             message=f"{worker.nodename} ready")
    return worker


def _scrape(app: Any) -> dict[str, list[Any]]:
    """What `jobs metrics` would serve now, by family."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from jobs.observe.metrics import registry_for

    text = generate_latest(registry_for(app)).decode()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def _value(samples: list[Any], name: str, **labels: str) -> float:
    return sum(s.value for s in samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def _stalls(redis_client: Any, action: str) -> int:
    field = field_for(outcome="STALLED", tier="standard", guard="watchdog", name=action)
    return int(redis_client.hget(COUNTERS_KEY, field) or 0)


@pytest.mark.chaos
class TestStalledWorker:
    @pytest.mark.timeout(120)
    def test_silent_broker_connections_are_reconnected_and_the_backlog_drains(
        self, app: Any, broker: Any, proxy: Proxy, worker_factory: Any, redis_client: Any
    ) -> None:
        """The proxy stops forwarding the worker's open broker connections (no reset) while
        new ones still reach the broker, and 20 jobs wait: within 2 x S the worker takes
        work again (it reconnected, counted), stays up, and every job runs."""
        key = "tests:watchdog:silent"
        worker = _start(worker_factory, "watchdog-silent", proxy.url)
        _publish(app, broker.url, key, range(1))
        wait_for(lambda: redis_client.hlen(key) == 1, timeout_seconds=30, message="warm-up")

        assert proxy.freeze() >= 1
        started = time.time()
        _publish(app, broker.url, key, range(1, 21))
        wait_for(lambda: redis_client.hlen(key) == 21, timeout_seconds=2 * STALL_SECONDS + 20,
                 interval=0.1, message=f"the backlog drained\n{worker.log_tail()}")
        ran_at = sorted(float(at) for index, at in redis_client.hgetall(key).items()
                        if index != "0")
        assert ran_at[0] - started <= 2 * STALL_SECONDS, worker.log_tail()
        assert worker.alive()
        assert _stalls(redis_client, RECONNECT) >= 1
        assert _stalls(redis_client, EXIT) == 0
        assert all(check.ok for check in local_liveness(worker.nodename, max_age_seconds=30))
        stalls = _scrape(app)["jobs_worker_stalls"]
        assert _value(stalls, "jobs_worker_stalls_total", tier="standard",
                      action=RECONNECT) >= 1
        assert not [s for s in _scrape(app)["jobs_guard_outcomes"]
                    if s.labels["guard"] == "watchdog"]

    @pytest.mark.timeout(120)
    def test_a_worker_a_reconnect_cannot_cure_fails_liveness_then_exits(
        self, app: Any, broker: Any, worker_factory: Any, redis_client: Any
    ) -> None:
        """The worker's main thread wedges (a signal handler that never returns) while the
        broker is fine and 10 jobs wait: its liveness probe fails, then it exits with 75,
        within 2 x S; a new worker runs every job."""
        key = "tests:watchdog:wedged"
        worker = _start(worker_factory, "watchdog-wedged", broker.url,
                        JOBS_TEST_WEDGE_ON_SIGUSR2="1")
        os.kill(worker.pid, signal.SIGUSR2)
        started = time.monotonic()
        _publish(app, broker.url, key, range(10))
        failed_at = None
        while worker.process.poll() is None and time.monotonic() - started < 4 * STALL_SECONDS:
            if failed_at is None and not all(
                    check.ok for check in local_liveness(worker.nodename, max_age_seconds=30)):
                failed_at = time.monotonic()
            time.sleep(0.05)
        exited_at = time.monotonic()
        assert worker.process.poll() == EXIT_STALLED, worker.log_tail()
        assert failed_at is not None and failed_at < exited_at
        assert exited_at - started <= 2 * STALL_SECONDS, worker.log_tail()
        assert stalled_path(worker.nodename).exists()  # until a worker of that name starts
        probe = subprocess.run(
            [sys.executable, "-m", "jobs", "health", "live", "--local", "--node",
             worker.nodename], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True, text=True, timeout=60)
        assert probe.returncode == 1 and "FAIL consumption" in probe.stdout, probe.stdout
        assert _stalls(redis_client, EXIT) == 1

        _start(worker_factory, "watchdog-after", broker.url)
        wait_for(lambda: redis_client.hlen(key) == 10, timeout_seconds=30,
                 message="every job ran on the new worker")

    @pytest.mark.timeout(120)
    def test_a_broker_outage_is_waited_out_and_the_backlog_drains_afterwards(
        self, app: Any, broker: Any, proxy: Proxy, worker_factory: Any, redis_client: Any
    ) -> None:
        """The proxy process is SIGSTOPped for 2.5 x S (nothing reaches the broker, and the
        worker's main thread blocks on a silent socket) while 10 jobs wait: the worker
        stays up, `live --local` holds at a 5 s max age (the watchdog beats for the
        blocked loop), nothing is reconnected, and the backlog drains once the broker is
        back."""
        key = "tests:watchdog:outage"
        worker = _start(worker_factory, "watchdog-outage", proxy.url)
        _publish(app, broker.url, key, range(1))
        wait_for(lambda: redis_client.hlen(key) == 1, timeout_seconds=30, message="warm-up")

        proxy.process.send_signal(signal.SIGSTOP)
        try:
            _publish(app, broker.url, key, range(1, 11))
            until = time.monotonic() + 2.5 * STALL_SECONDS
            while time.monotonic() < until:
                assert worker.alive(), worker.log_tail()
                checks = local_liveness(worker.nodename, max_age_seconds=5)
                assert all(check.ok for check in checks), checks
                time.sleep(0.2)
        finally:
            proxy.process.send_signal(signal.SIGCONT)
        wait_for(lambda: redis_client.hlen(key) == 11, timeout_seconds=20, interval=0.1,
                 message=f"the backlog drained\n{worker.log_tail()}")
        assert worker.alive()
        assert _stalls(redis_client, RECONNECT) == 0
        assert _stalls(redis_client, EXIT) == 0


# -- the backlog on a fresh connection ------------------------------------------------------


class TestFreshBacklog:
    @pytest.mark.timeout(60)
    def test_an_unreachable_broker_is_none_within_the_timeout(self) -> None:
        """Redis and RabbitMQ URLs nobody listens on: None (an outage), not an error."""
        from celery import Celery

        for url in (f"redis://127.0.0.1:{free_port()}/0",
                    f"amqp://guest:guest@127.0.0.1:{free_port()}//"):
            started = time.monotonic()
            assert fresh_backlog(Celery(broker=url), ["standard"], timeout_seconds=0.5) is None
            assert time.monotonic() - started < 5, url

    @pytest.mark.skipif(not rabbitmq_reachable(), reason=f"no RabbitMQ at {RABBITMQ_URL}")
    @pytest.mark.timeout(60)
    def test_a_rabbitmq_queue_is_counted_on_a_connection_of_its_own(self) -> None:
        from celery import Celery
        from kombu import Connection, Queue

        name = f"watchdog-backlog-{os.getpid()}"
        with Connection(RABBITMQ_URL) as connection:
            queue = Queue(name, channel=connection.default_channel)
            queue.declare()
            try:
                producer = connection.Producer()
                for index in range(3):
                    producer.publish({"index": index}, routing_key=name)
                app = Celery(broker=RABBITMQ_URL)
                assert wait_for(lambda: fresh_backlog(app, [name], timeout_seconds=2) == 3,
                                timeout_seconds=10, message="3 messages counted")
            finally:
                queue.delete()


# -- the oldest message's age ---------------------------------------------------------------
class TestOldestAge:
    @pytest.mark.timeout(60)
    def test_the_age_is_the_oldest_publish_in_the_queue(self, app: Any) -> None:
        """Three jobs published 0.1 s apart on a queue nobody consumes: the age is that of
        the first; an empty queue is 0 s old; a message without a stamp has no age."""
        from kombu import Exchange, Queue

        from tests.jobs.observe.tasks_watchdog import mark

        name = f"watchdog-age-{os.getpid()}"
        queue = Queue(name, Exchange("jobs", type="direct"), routing_key=name)
        assert oldest_ages(app, [name]) == {name: 0.0}
        first = time.time()
        for index in range(3):
            mark.apply_async(("tests:watchdog:age", index), queue=queue, declare=[queue])
            time.sleep(0.1)
        try:
            now = time.time() + 1
            age = oldest_ages(app, [name], now=now)[name]
            assert age is not None and now - first - 0.05 <= age <= now - first + 0.05
            with app.connection_for_write() as connection:
                client = connection.default_channel.client
                oldest = client.lindex(name, -1)
                assert published_at(oldest) is not None
                client.rpush(name, b'{"headers": {}, "body": ""}')  # a foreign producer's
            assert oldest_ages(app, [name], now=now) == {name: None}
            exported = _scrape(app)["jobs_queue_oldest_age_seconds"]
            assert {s.labels["tier"] for s in exported} <= {"critical", "standard", "optional"}
            assert all(s.value >= 0 for s in exported)
        finally:  # the list and its binding
            with app.connection_for_write() as connection:
                connection.default_channel.queue_delete(name)

