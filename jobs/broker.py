"""kombu's Redis transport, with one client object per channel instead of one per command.

kombu's Redis channel builds a new `redis.Redis` object for every publish, fanout event and
queue-size query (`Channel.conn_or_acquire`). The client shares the channel's connection
pool, so that was cheap; since redis-py 8 each construction also copies every response
callback into a new case-insensitive dict, about 60 µs. With task events on (Flower needs
them) a worker's main process publishes three events per job, and that construction alone
took a quarter of its CPU under load (py-spy, `python -m bench idempotency`).

A `redis.Redis` object holds no connection of its own here (it takes one from the pool per
command) and is thread-safe, so the channel keeps one. The asynchronous client (the BRPOP
poller's) is left as kombu builds it. Selected by `jobs.platform.celery_config` for
redis:// brokers only (rediss:// and RabbitMQ keep kombu's own transport).
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    """A Redis channel that reuses its synchronous client."""

    _shared_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)
        client = self._shared_client
        if client is None or client.connection_pool is not self.pool:
            client = self._shared_client = super()._create_client()
        return client


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with `Channel` above; everything else unchanged."""

    Channel = Channel
