"""The Redis broker transport: kombu's, with reliable fetch from every list and one client
object per channel."""

from __future__ import annotations

import contextlib
import queue as queue_module
import time
import uuid
from typing import Any

import pytest


@pytest.fixture()
def redis_broker(app: Any) -> None:
    if not app.conf.broker_url.startswith("redis://"):
        pytest.skip("the broker of this run is not Redis")


class TestRedisTransport:
    def test_the_platform_uses_it_and_the_channel_keeps_one_client(
        self, app: Any, redis_broker: None
    ) -> None:
        from jobs.broker import Channel, Transport

        with app.connection_for_write() as connection:
            assert isinstance(connection.transport, Transport)
            channel = connection.default_channel
            assert isinstance(channel, Channel)
            assert channel._create_client() is channel._create_client()

    def test_messages_flow_through_the_shared_client(self, app: Any, redis_broker: None) -> None:
        """Publish (which uses the shared client) and consume on one channel.

        Fanout events go through the same shared client; the Flower tests see them arrive.
        """
        from kombu import Exchange, Queue

        name = f"tests-broker-{uuid.uuid4().hex}"
        received: list[Any] = []
        with app.connection_for_write() as connection:
            queue = Queue(name, Exchange(name, type="direct"), routing_key=name)
            producer = connection.Producer(serializer="json")
            for index in range(3):
                producer.publish({"n": index}, exchange=queue.exchange, routing_key=name,
                                 declare=[queue])
            assert queue(connection.default_channel).queue_declare(passive=True)[1] == 3
            with connection.Consumer([queue], accept=["json"]) as consumer:
                consumer.register_callback(lambda body, message: (received.append(body),
                                                                  message.ack()))
                for _ in range(10):
                    if len(received) == 3:
                        break
                    connection.drain_events(timeout=2)
            queue(connection.default_channel).delete()
        assert received == [{"n": 0}, {"n": 1}, {"n": 2}]


def _queue(name: str) -> Any:
    from kombu import Exchange, Queue

    return Queue(name, Exchange(name, type="direct"), routing_key=name)


def _publish(connection: Any, queue: Any, bodies: list[Any]) -> None:
    producer = connection.Producer(serializer="json")
    for body in bodies:
        producer.publish(body, exchange=queue.exchange, routing_key=queue.routing_key,
                         declare=[queue])


def _drain(connection: Any, queue: Any, count: int, *, no_ack: bool = False) -> list[Any]:
    """Receive `count` messages without acknowledging them."""
    received: list[Any] = []
    with connection.Consumer([queue], accept=["json"], no_ack=no_ack) as consumer:
        consumer.qos(prefetch_count=count)
        consumer.register_callback(lambda body, message: received.append(message))
        for _ in range(20):
            if len(received) >= count:
                break
            connection.drain_events(timeout=2)
    return received


class TestReliableFetch:
    """Taking a message and recording it as unacknowledged are one step (fetch.lua)."""

    def test_a_message_taken_is_already_recorded_as_unacked(
        self, app: Any, redis_broker: None
    ) -> None:
        """The step that takes a message from the queue writes kombu's unacked record in the
        same script: if the worker died right after it, the visibility restore brings the
        message back (with kombu's BRPOP the message was in neither place)."""
        name = f"tests-fetch-{uuid.uuid4().hex}"
        queue = _queue(name)
        with app.connection_for_write() as connection:
            channel = connection.default_channel
            _publish(connection, queue, [{"n": 1}])
            queue(channel).declare()
            client = channel.client
            taken = channel._fetch([name])  # what _brpop_read does once woken; then "dies"
            assert taken is not None and taken[0] == name and taken[1]["body"]
            tag = taken[1]["properties"]["delivery_tag"]
            assert client.llen(name) == 0
            assert client.hexists(channel.unacked_key, tag)
            assert client.zscore(channel.unacked_index_key, tag) is not None
            # kombu's own recovery, as a survivor runs it after the visibility timeout:
            channel.qos.restore_by_tag(tag, client)
            assert client.llen(name) == 1
            received = _drain(connection, queue, 1)
            assert [m.payload for m in received] == [{"n": 1}]
            received[0].ack()
            assert not client.hexists(channel.unacked_key, tag)
            queue(channel).delete()

    def test_delivered_messages_are_unacked_until_acked_in_order(
        self, app: Any, redis_broker: None
    ) -> None:
        """Delivery keeps FIFO order; each delivered message stays in the unacked hash until
        its ack, and kombu's QoS does not write the record a second time."""
        name = f"tests-fetch-{uuid.uuid4().hex}"
        queue = _queue(name)
        with app.connection_for_write() as connection:
            channel = connection.default_channel
            _publish(connection, queue, [{"n": i} for i in range(3)])
            received = _drain(connection, queue, 3)
            assert [m.payload for m in received] == [{"n": 0}, {"n": 1}, {"n": 2}]
            client = channel.client
            tags = [m.delivery_tag for m in received]
            assert all(client.hexists(channel.unacked_key, t) for t in tags)
            assert not channel.recorded  # every record was handed to the QoS
            for message in received:
                message.ack()
            assert not any(client.hexists(channel.unacked_key, t) for t in tags)
            queue(channel).delete()

    def test_an_item_that_is_not_a_message_is_set_aside(
        self, app: Any, redis_broker: None
    ) -> None:
        """Garbage pushed straight into a queue list goes to `jobs:unreadable`; the consumer
        keeps going and the message behind it is delivered."""
        from jobs.broker import UNREADABLE_KEY

        name = f"tests-fetch-{uuid.uuid4().hex}"
        queue = _queue(name)
        garbage = f"not json {name}"
        with app.connection_for_write() as connection:
            channel = connection.default_channel
            queue(channel).declare()
            channel.client.lpush(name, garbage)
            _publish(connection, queue, [{"n": 7}])
            received = _drain(connection, queue, 1)
            assert [m.payload for m in received] == [{"n": 7}]
            received[0].ack()
            assert garbage.encode() in channel.client.lrange(UNREADABLE_KEY, 0, -1)
            channel.client.lrem(UNREADABLE_KEY, 0, garbage)
            queue(channel).delete()

    def test_a_no_ack_consumer_leaves_no_record(self, app: Any, redis_broker: None) -> None:
        """Consumers that never acknowledge (Celery's control replies) keep kombu's BRPOP: a
        record would be restored later as a duplicate."""
        name = f"tests-fetch-{uuid.uuid4().hex}"
        queue = _queue(name)
        with app.connection_for_write() as connection:
            channel = connection.default_channel
            _publish(connection, queue, [{"n": 1}])
            received = _drain(connection, queue, 1, no_ack=True)
            assert [m.payload for m in received] == [{"n": 1}]
            assert not channel.client.hexists(channel.unacked_key, received[0].delivery_tag)
            queue(channel).delete()


class TestFetchFromEveryList:
    """The consumer takes from whichever list has a message, the moment it has one."""

    def test_round_robin_over_queues_and_priorities_without_waiting(
        self, app: Any, redis_broker: None
    ) -> None:
        """Messages on two queues, in their priority sub-lists: delivered in kombu's
        round-robin order, one right after the other (each used to wait up to 1 s, the wait
        watching one list only)."""
        first, second = (_queue(f"tests-fetch-{uuid.uuid4().hex}") for _ in range(2))
        received: list[Any] = []
        with app.connection_for_write() as connection:
            producer = connection.Producer(serializer="json")
            for n in range(3):
                producer.publish({"q": 1, "n": n}, exchange=first.exchange,
                                 routing_key=first.routing_key, declare=[first], priority=5)
                producer.publish({"q": 2, "n": n}, exchange=second.exchange,
                                 routing_key=second.routing_key, declare=[second], priority=5)
            with connection.Consumer([first, second], accept=["json"]) as consumer:
                consumer.register_callback(lambda body, message: (received.append(body),
                                                                  message.ack()))
                started = time.monotonic()
                for _ in range(6):
                    connection.drain_events(timeout=3)
                elapsed = time.monotonic() - started
            for queue in (first, second):
                queue(connection.default_channel).delete()
        assert [(m["q"], m["n"]) for m in received] == [
            (1, 0), (2, 0), (1, 1), (2, 1), (1, 2), (2, 2)]
        assert elapsed < 0.5, f"6 messages took {elapsed:.2f}s"

    def test_an_idle_consumer_wakes_for_a_message_on_any_list(
        self, app: Any, redis_broker: None
    ) -> None:
        """Waiting with every list empty, in an event loop as Celery's worker waits: a message
        published to the second queue's priority list is delivered at once, not when the
        wait on the first list times out."""
        from kombu.asynchronous import Hub

        first, second = (_queue(f"tests-fetch-{uuid.uuid4().hex}") for _ in range(2))
        received: list[tuple[Any, float]] = []
        hub = Hub()
        try:
            with app.connection_for_write() as connection, \
                    app.connection_for_write() as publisher:
                for queue in (first, second):
                    queue(publisher.default_channel).declare()
                with connection.Consumer([first, second], accept=["json"]) as consumer:
                    consumer.register_callback(
                        lambda body, message: (received.append((body, time.monotonic())),
                                               message.ack()))
                    connection.register_with_event_loop(hub)

                    def run_loop(seconds: float) -> None:
                        deadline = time.monotonic() + seconds
                        while time.monotonic() < deadline and not received:
                            for tick in hub.on_tick:
                                tick()
                            for fd, _ in hub.poller.poll(0.05) or ():
                                callback, args = hub.readers[fd]
                                with contextlib.suppress(queue_module.Empty):
                                    callback(*args)

                    run_loop(0.3)  # settle into the wait: every list is empty
                    assert not received
                    publisher.Producer(serializer="json").publish(
                        {"late": 1}, exchange=second.exchange, routing_key=second.routing_key,
                        priority=7)
                    published = time.monotonic()
                    run_loop(3)
                for queue in (first, second):
                    queue(publisher.default_channel).delete()
        finally:
            hub.close()
        assert [body for body, _ in received] == [{"late": 1}]
        assert received[0][1] - published < 0.5


class TestScriptLoading:
    def test_a_flushed_script_cache_still_delivers_on_the_first_read(
        self, app: Any, redis_broker: None
    ) -> None:
        """A server that never saw the fetch script (new, restarted, SCRIPT FLUSH) answers
        the first fetch NOSCRIPT: the same read fetches again and delivers the waiting
        message, instead of raising Empty and leaving it to a later tick."""
        import redis
        from kombu.asynchronous import Hub

        source = _queue(f"tests-noscript-{uuid.uuid4().hex}")
        received: list[Any] = []
        reads_until_delivered = 0
        hub = Hub()
        try:
            with app.connection_for_write() as connection, \
                    app.connection_for_write() as publisher:
                _publish(publisher, source, [{"n": 1}])
                with connection.Consumer([source], accept=["json"]) as consumer:
                    consumer.register_callback(
                        lambda body, message: (received.append(body), message.ack()))
                    redis.Redis.from_url(app.conf.broker_url).script_flush()
                    connection.register_with_event_loop(hub)
                    deadline = time.monotonic() + 3
                    while not received and time.monotonic() < deadline:
                        for tick in hub.on_tick:
                            tick()
                        for fd, _ in hub.poller.poll(0.05) or ():
                            callback, args = hub.readers[fd]
                            reads_until_delivered += 1
                            with contextlib.suppress(queue_module.Empty):
                                callback(*args)
                source(publisher.default_channel).delete()
        finally:
            hub.close()
        assert received == [{"n": 1}]
        assert reads_until_delivered == 1


class TestSilentBrokerTeardown:
    def test_closing_an_idle_consumer_of_a_stopped_broker_is_bounded(self, tmp_path: Any) -> None:
        """An idle consumer waits on waiter connections only (nothing pending on its consuming
        connection): with the broker SIGSTOPped, closing the channel and the connection reads
        nothing from it and returns at once (Celery's GH-9705 teardown concern)."""
        import os
        import signal

        from kombu import Connection

        from jobs.embedded import embedded_redis, free_port

        server = embedded_redis(free_port(), tmp_path / "broker").start()
        try:
            source = _queue(f"tests-silent-{uuid.uuid4().hex}")
            connection = Connection(server.url, transport="jobs.broker:Transport")
            consumer = connection.Consumer([source], accept=["json"])
            consumer.consume()
            with contextlib.suppress(Exception):
                connection.drain_events(timeout=0.5)  # idle: the waiters are armed
            channel = consumer.channel
            assert channel._waiters, "the idle consumer armed no waiter"
            os.kill(server.pid, signal.SIGSTOP)
            try:
                started = time.monotonic()
                channel.close()
                connection.release()
                elapsed = time.monotonic() - started
            finally:
                os.kill(server.pid, signal.SIGCONT)
        finally:
            server.stop()
        assert elapsed < 1.0, f"teardown against a silent broker took {elapsed:.2f}s"


#: A worker's restore sweep, SIGKILLed while it holds kombu's sweep lock.
_SWEEPER_KILLED = """
import os, signal
from kombu.transport.redis import Mutex
from jobs import app
with app.connection_for_write() as connection:
    channel = connection.default_channel
    with Mutex(channel.client, channel.unacked_mutex_key, channel.unacked_mutex_expire):
        print("held", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
"""


class TestRestoreSweep:
    def test_a_sweeper_killed_holding_the_lock_delays_restores_three_sweeps_at_most(
        self, app: Any, redis_broker: None
    ) -> None:
        """A worker SIGKILLed in the middle of its restore sweep leaves kombu's sweep lock
        behind. With kombu's 300 s lock no worker restored anything for five minutes, so a
        dead worker's messages came back that late; the platform's lock lasts three sweep
        intervals. A message a dead consumer held is restored once the lock expires, and
        not before (the lock really was left behind)."""
        import subprocess
        import sys

        from kombu.transport.redis import Mutex, MutexHeld

        from tests.harness import ROOT

        name = f"tests-sweep-{uuid.uuid4().hex}"
        queue = _queue(name)
        with app.connection_for_write() as connection:
            channel = connection.default_channel
            client = channel.client
            expire = channel.unacked_mutex_expire
            assert expire == 3 * channel.unacked_restore_interval <= 30
            queue(channel).declare()
            _publish(connection, queue, [{"n": 1}])
            assert channel._fetch([name]) is not None  # taken by a consumer that then died
            killed = subprocess.run([sys.executable, "-c", _SWEEPER_KILLED], cwd=ROOT,
                                    capture_output=True, text=True, timeout=60, check=False)
            assert killed.returncode == -9 and "held" in killed.stdout, killed.stderr[-2000:]
            killed_at = time.monotonic()
            channel.visibility_timeout = 0  # every held message is due
            with pytest.raises(MutexHeld), Mutex(client, channel.unacked_mutex_key, expire):
                pass
            while client.llen(name) == 0 and time.monotonic() - killed_at < expire + 10:
                channel.qos.restore_visible(num=100, interval=1)
                time.sleep(0.2)
            waited = time.monotonic() - killed_at
            assert client.llen(name) == 1, f"not restored {waited:.1f}s after the sweeper died"
            assert expire - 2 < waited < expire + 2
            received = _drain(connection, queue, 1)
            assert [m.payload for m in received] == [{"n": 1}]
            received[0].ack()
            queue(channel).delete()


class TestLateAcknowledgement:
    """A restored message is taken again under a fresh delivery tag (fetch.lua), so what the
    delivery that expired does late touches only its own, already restored, hold."""

    @pytest.mark.parametrize("late", ["ack", "reject", "requeue"])
    def test_the_expired_delivery_leaves_the_new_hold(
        self, app: Any, redis_broker: None, late: str
    ) -> None:
        """Consumer 1 takes M (tag T); its hold expires and M is restored; consumer 2 takes
        M under a new tag T2. Consumer 1's late ack, reject or reject-with-requeue of T
        neither removes T2's hold nor puts a second copy of M in the queue; T2's ack ends
        M. (With the tag kept, an ack or reject of T removed the hold of consumer 2, and M
        was lost if consumer 2 then died.)"""
        from kombu.utils.json import loads

        name = f"tests-late-ack-{uuid.uuid4().hex}"
        queue = _queue(name)
        with app.connection_for_write() as first, app.connection_for_write() as second:
            channel = first.default_channel
            client = channel.client
            _publish(first, queue, [{"n": 1}])
            (expired,) = _drain(first, queue, 1)
            channel.qos.restore_by_tag(expired.delivery_tag, client)  # the visibility sweep
            (taken,) = _drain(second, queue, 1)
            assert taken.payload == {"n": 1}
            assert taken.delivery_info["redelivered"] is True
            assert taken.delivery_tag != expired.delivery_tag
            hold = client.hget(channel.unacked_key, taken.delivery_tag)
            assert hold is not None  # kombu's record, under the new tag in and out
            stored, _, routing_key = loads(hold)
            assert stored["properties"]["delivery_tag"] == taken.delivery_tag
            assert routing_key == name

            if late == "ack":
                expired.ack()
            else:
                expired.reject(requeue=late == "requeue")
            assert client.hexists(channel.unacked_key, taken.delivery_tag)
            assert client.zscore(channel.unacked_index_key, taken.delivery_tag) is not None
            assert client.llen(name) == 0
            taken.ack()
            assert not client.hexists(channel.unacked_key, taken.delivery_tag)
            assert client.llen(name) == 0
            queue(channel).delete()
