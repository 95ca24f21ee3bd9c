"""One Redis read and one Redis write per call, whatever the guards: and nothing lost by it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.connection import AbstractConnection

from resilience.batch import RedisBatch
from resilience.circuit.backends.redis import state_key
from resilience.flushing import flush_all
from resilience.idempotency.backends.cached import cache_key
from resilience.retry.budget import budget_key


@pytest.fixture()
def sent(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The packets redis-py writes to Redis (one per round trip); calls go through unchanged."""
    packets: list[Any] = []
    original = AbstractConnection.send_packed_command

    def counting(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
        packets.append(command)
        original(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)
    return packets


class TestRedisBatch:
    def test_replies_in_order_and_scripts_reloaded(self, redis_client: redis.Redis) -> None:
        """Each callback gets its own reply; a script the server lost is loaded and run."""
        script = redis_client.register_script("return ARGV[1] .. KEYS[1]")
        redis_client.script_flush()
        replies: dict[str, Any] = {}
        batch = RedisBatch(redis_client)
        batch.command("SET", "batch:a", "1", then=lambda r: replies.__setitem__("set", r))
        batch.script(script, ["k"], ["v"], then=lambda r: replies.__setitem__("script", r))
        batch.command("INCR", "batch:a", then=lambda r: replies.__setitem__("incr", r))
        batch.command("HGET", "batch:a", "x", then=lambda r: replies.__setitem__("bad", r))
        batch.command("GET", "batch:a", then=lambda r: replies.__setitem__("after", r))
        batch.execute()
        assert replies["set"] is True or replies["set"] == "OK"
        assert replies["script"] == "vk"
        assert replies["incr"] == 2
        assert isinstance(replies["bad"], redis.ResponseError)  # WRONGTYPE, handed over
        assert replies["after"] == "2"  # an error reply does not shift the ones after it
        assert len(batch) == 0

    def test_connection_closed_by_the_server_is_replaced(self, redis_client: redis.Redis,
                                                         stores: Any) -> None:
        """A pooled connection Redis dropped (restart, CLIENT KILL) costs no failed batch."""
        ids: list[Any] = []
        batch = RedisBatch(redis_client)
        batch.command("CLIENT", "ID", then=ids.append)
        batch.execute()
        killer = redis.Redis.from_url(stores.redis_url)
        assert killer.client_kill_filter(_id=ids[0]) == 1
        killer.close()
        batch.command("CLIENT", "ID", then=ids.append)
        batch.command("PING", then=ids.append)
        batch.execute()
        assert isinstance(ids[1], int) and ids[1] != ids[0]
        assert ids[2] is True

    def test_dead_redis_gives_each_owner_the_error(self, tmp_path: Path) -> None:
        from jobs.embedded import embedded_redis, free_port

        server = embedded_redis(free_port(), tmp_path / "redis").start()
        client = redis.Redis.from_url(server.url, socket_timeout=0.5,
                                      socket_connect_timeout=0.5)
        server.kill()
        replies: list[Any] = []
        batch = RedisBatch(client)
        batch.command("GET", "x", then=replies.append)
        batch.command("GET", "y", then=replies.append)
        batch.execute()  # never raises
        assert len(replies) == 2
        assert all(isinstance(reply, redis.ConnectionError) for reply in replies)


@pytest.fixture()
def key() -> Iterator[str]:
    yield f"batch-{uuid.uuid4().hex}"


class TestFullStack:
    def test_two_guard_round_trips_and_every_write_lands(
        self, app: Any, redis_client: redis.Redis, sent: list[int], key: str
    ) -> None:
        """Breaker + budget + idempotency + singleton: 1 read and 1 write batch (+ the body's
        own INCR), and the cache fill, breaker outcome and budget count all reach Redis."""
        from tests.resilience.batch.tasks import batch_full_stack

        counter = f"{key}:runs"
        batch_full_stack.apply(args=(key, counter))  # warm: scripts loaded, sessions open
        sent.clear()
        fresh = f"{key}-2"
        result = batch_full_stack.apply(args=(fresh, counter))
        assert result.get() == f"done {fresh}"
        # read, write (+ the body's INCR); the breaker's and budget's counts ride in the
        # write round when their 0.1 s aggregate is due, else they wait for the next flush
        assert len(sent) <= 3, f"{len(sent)} Redis round trips: {sent}"

        cached = redis_client.get(cache_key(batch_full_stack.name, fresh))
        assert cached is not None and f"done {fresh}" in str(cached)
        flush_all()  # what the timer thread sends within 0.1 s
        # both successes reached the breaker's count window
        assert redis_client.hget(state_key("batch-dependency"), "calls") == "2"
        budget = redis_client.hgetall(budget_key("batch-dependency"))
        requests = sum(int(value) for field, value in budget.items() if field.startswith("q"))
        assert requests == 2

    def test_duplicate_is_answered_from_the_cache(
        self, app: Any, redis_client: redis.Redis, sent: list[int], key: str
    ) -> None:
        """A duplicate of a finished key: the read batch finds the cached result; no body."""
        from tests.resilience.batch.tasks import batch_full_stack

        counter = f"{key}:runs"
        assert batch_full_stack.apply(args=(key, counter)).get() == f"done {key}"
        sent.clear()
        replayed = batch_full_stack.apply(args=(key, counter)).get()
        # the read batch that found it, then the REPLAYED counter; the body never ran
        assert len(sent) == 2, f"{len(sent)} Redis round trips: {sent}"
        assert replayed == f"done {key}"  # the first call's value
        assert int(redis_client.get(counter)) == 1
