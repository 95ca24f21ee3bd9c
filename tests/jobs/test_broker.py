"""The Redis broker transport: kombu's, with one client object per channel."""

from __future__ import annotations

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
