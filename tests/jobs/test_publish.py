"""Guarded publish through the platform's Redis transport: the caller's message is never
changed, so the unique key and the tier's bound hold on every attempt kombu makes."""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from resilience.admission.broker import BOUND_HEADER, HEADERS, UNIQUE_HEADER


@pytest.fixture()
def broker(tmp_path: Path) -> Any:
    """A broker Redis of this test's own, which it may stop and start again."""
    from jobs.embedded import embedded_redis, free_port

    server = embedded_redis(free_port(), tmp_path / "broker").start()
    yield server
    server.stop()


def _stored(client: Any, queue: str) -> list[dict[str, Any]]:
    keys = [key for key in client.keys(f"{queue}*") if key.split(b"\x06\x16")[0] == queue.encode()]
    return [json.loads(item) for key in keys for item in client.lrange(key, 0, -1)]


class TestGuardedPublish:
    def test_the_callers_message_is_left_as_it_was(self, app: Any, broker: Any) -> None:
        """The transport stores a copy without the guards' headers; the message it was given
        keeps them (kombu reuses that headers dict when it retries a publish)."""
        import redis
        from kombu import Exchange, Queue

        name = f"tests-publish-{uuid.uuid4().hex}"
        queue = Queue(name, Exchange(name, type="direct"), routing_key=name)
        unique = {"key": f"tests:unique:{name}", "task_id": "t-1", "ttl_ms": 60_000}
        bound = {"limit": 5, "queue": name, "reservations": f"tests:reservations:{name}"}
        headers = {UNIQUE_HEADER: unique, BOUND_HEADER: bound, "other": 1}
        with app.connection_for_write(broker.url) as connection:
            connection.Producer(serializer="json").publish(
                {"n": 1}, exchange=queue.exchange, routing_key=name, declare=[queue],
                headers=headers)
        assert headers == {UNIQUE_HEADER: unique, BOUND_HEADER: bound, "other": 1}
        client = redis.Redis.from_url(broker.url)
        stored = _stored(client, name)
        assert len(stored) == 1 and stored[0]["headers"]["other"] == 1
        assert not set(HEADERS) & set(stored[0]["headers"])
        assert client.get(unique["key"]) == b"t-1"

    def test_a_publish_retried_across_a_broker_restart_keeps_unique_and_bound(
        self, app: Any, broker: Any
    ) -> None:
        """A `@unique` task published while its broker's Redis is down and retried by kombu
        (Celery's publish retry) once the server is back: one message is queued, the unique
        key names it, and a second `.delay()` of the same key is a duplicate. (The transport
        used to pop the guards' headers on the failed attempt, so the retry was a plain LPUSH:
        no unique key, no depth check.)"""
        import redis

        from tests.resilience.idempotency.tasks_unique import held

        key = uuid.uuid4().hex
        policy = {"max_retries": 60, "interval_start": 0.1, "interval_step": 0.1,
                  "interval_max": 0.2}
        with app.connection_for_write(broker.url) as connection:
            # A long-lived producer: connected, its queue declared (a first publish), before
            # the broker goes away; the server comes back empty (no persistence).
            producer = app.amqp.Producer(connection.default_channel)
            held.apply_async((f"warm-up-{key}",), producer=producer)
            broker.stop()
            restarted = threading.Thread(target=lambda: (time.sleep(1.0), broker.start()))
            restarted.start()
            try:
                started = time.monotonic()
                first = held.apply_async((key,), producer=producer, retry_policy=policy)
                retried_for = time.monotonic() - started
            finally:
                restarted.join()
            second = held.apply_async((key,), producer=producer, retry_policy=policy)
        assert retried_for > 0.5  # the publish did wait for the server to come back
        client = redis.Redis.from_url(broker.url)
        stored = _stored(client, "critical")
        assert [message["headers"]["id"] for message in stored] == [first.id]
        assert not set(HEADERS) & set(stored[0]["headers"])
        held_keys = client.keys("resilience:unique:*")
        assert len(held_keys) == 1 and client.get(held_keys[0]) == first.id.encode()
        assert second.id == first.id  # the duplicate answers the queued job

    def test_a_guarded_message_in_a_publish_batch_is_checked_in_order(
        self, app: Any, broker: Any
    ) -> None:
        """kombu's producer batch: the batch so far goes first, then the guarded message is
        pushed by the checking script (its refusal must answer now), then the rest; the
        unique key holds and the order of publication is kept. (The guards' headers used to
        be dropped in a batch and the message pushed unchecked.)"""
        import redis
        from kombu import Exchange, Queue

        name = f"tests-publish-{uuid.uuid4().hex}"
        queue = Queue(name, Exchange(name, type="direct"), routing_key=name)
        unique = {"key": f"tests:unique:{name}", "task_id": "t-2", "ttl_ms": 60_000}
        with app.connection_for_write(broker.url) as connection:
            producer = connection.Producer(serializer="json")
            queue(producer.channel).declare()
            with producer.batch():
                producer.publish({"n": 1}, exchange=queue.exchange, routing_key=name)
                producer.publish({"n": 2}, exchange=queue.exchange, routing_key=name,
                                 headers={UNIQUE_HEADER: unique})
                producer.publish({"n": 3}, exchange=queue.exchange, routing_key=name)
        client = redis.Redis.from_url(broker.url)
        stored = [json.loads(item) for item in reversed(client.lrange(name, 0, -1))]
        assert [json.loads(base64.b64decode(message["body"]))["n"] for message in stored] == [
            1, 2, 3]
        assert client.get(unique["key"]) == b"t-2"
