"""Lock primitives on real Redis nodes and PostgreSQL, in the test process."""

from __future__ import annotations

import threading
import time
import types
from typing import Any

import pytest
from sqlalchemy import text

from resilience.errors import (
    ConfigurationError,
    InvalidKey,
    LockNotOwnedError,
    NonJsonArguments,
    StaleFencingToken,
    StoreUnavailable,
)
from resilience.locks import (
    AdvisorySession,
    FencingTokens,
    Heartbeat,
    HeartbeatConfig,
    RedisLock,
    Redlock,
    RedlockConfig,
    exclusive,
    singleton,
)
from resilience.locks.guards import ExclusiveConfig, ExclusiveGuard, SingletonGuard
from resilience.locks.redis_lock import Lease, lock_key
from tests.resilience.locks.conftest import Nodes


def _redlock(nodes: Nodes, **options: Any) -> Redlock:
    return Redlock.from_urls(nodes.urls, options=RedlockConfig(**options))


class TestBadInput:
    def test_ttl_must_be_positive(self, redis_client: Any) -> None:
        """TTL <= 0 is refused at definition time and at acquisition."""
        for ttl in (0, -1, float("nan")):
            with pytest.raises(ConfigurationError, match="ttl_seconds"):
                exclusive(ttl_seconds=ttl)
        with pytest.raises(ConfigurationError, match="ttl_seconds"):
            RedisLock(redis_client).acquire("x", ttl_seconds=0)

    def test_fewer_than_three_nodes(self, nodes: Nodes) -> None:
        """Redlock refuses fewer than 3 nodes, as a decorator option and as a class."""
        with pytest.raises(ConfigurationError, match="at least 3"):
            exclusive(nodes=nodes.urls[:2])
        with pytest.raises(ConfigurationError, match="at least 3"):
            Redlock.from_urls(nodes.urls[:2])

    def test_unreachable_nodes_at_start(self) -> None:
        """A node that does not answer at start is named in a clear error."""
        from jobs.embedded import free_port

        urls = [f"redis://127.0.0.1:{free_port()}/0" for _ in range(3)]
        with pytest.raises(StoreUnavailable, match="unreachable at start"):
            Redlock.from_urls(urls)

    def test_bad_keys(self) -> None:
        """Non-JSON key parts and bad key options fail with named errors."""

        def body(order: Any, fencing_token: int | None = None) -> None: ...

        with pytest.raises(ConfigurationError, match="not an argument"):
            singleton(key="{missing}")(body)
        with pytest.raises(ConfigurationError, match="template string or a callable"):
            singleton(key=42)(body)  # type: ignore[arg-type]
        guard = SingletonGuard(body, None, _singleton_options())
        with pytest.raises(NonJsonArguments):
            guard.key_for("t", ({1, 2},), {})
        with pytest.raises(NonJsonArguments):
            guard.key_for("t", (object(),), {})
        by_function = SingletonGuard(body, lambda order, **_: {order}, _singleton_options())
        with pytest.raises(InvalidKey, match="not JSON"):
            by_function.key_for("t", (1,), {})
        # f(1) and f(order=1) are one key; the injected token is never part of it.
        assert guard.key_for("t", (1,), {}) == guard.key_for("t", (), {"order": 1})
        assert guard.key_for("t", (1,), {}) == guard.key_for("t", (1,), {"fencing_token": 9})

    def test_non_json_argument_refused_at_enqueue(self, app: Any) -> None:
        """A set as a key part is refused before the message is published."""
        from tests.resilience.locks.tasks import singleton_run

        with pytest.raises(NonJsonArguments):
            singleton_run.delay("run", {1, 2})

    def test_transaction_pooling_refused(self, stores: Any) -> None:
        """A database declared behind PgBouncer transaction pooling is refused."""
        with pytest.raises(ConfigurationError, match="transaction pooling"):
            AdvisorySession(stores.database_url, pool_mode="transaction")

    def test_lease_shorter_than_time_limit(self) -> None:
        """An exclusive lease that cannot outlast the task's time limit is refused."""

        def body() -> None: ...

        guard = ExclusiveGuard(body, None, ExclusiveConfig(ttl_seconds=5, heartbeat=False))
        with pytest.raises(ConfigurationError, match="time limit"):
            guard.bind(types.SimpleNamespace(name="t", time_limit=20, run=body))  # type: ignore[arg-type]

    def test_bad_policies(self) -> None:
        with pytest.raises(ConfigurationError, match="policy"):
            singleton(policy="wait")
        with pytest.raises(ConfigurationError, match="renew_fraction"):
            exclusive(renew_fraction=1.5)


def _singleton_options() -> Any:
    from resilience.locks.guards import SingletonConfig

    return SingletonConfig()


class TestRedisLock:
    def test_owner_checked_release_and_extend(self, redis_client: Any) -> None:
        """Only the owner can release or extend; a second acquire waits for release."""
        lock = RedisLock(redis_client)
        lease = lock.acquire("k", ttl_seconds=5)
        assert lease is not None
        assert lock.acquire("k", ttl_seconds=5) is None
        stranger = Lease(name="k", owner="not-me", ttl_seconds=5, acquired_at=0, valid_until=0)
        assert lock.release(stranger) is False
        assert lock.extend(stranger) is False
        assert lock.extend(lease) is True
        assert lock.release(lease) is True
        assert lock.acquire("k", ttl_seconds=5) is not None


class TestRedlock:
    def test_exclusion_and_release(self, nodes: Nodes) -> None:
        """A majority grant excludes others; release frees all nodes."""
        redlock = _redlock(nodes, retry_count=0)
        lease = redlock.acquire("job", ttl_seconds=5)
        assert lease is not None and lease.remaining_seconds() > 4
        assert redlock.acquire("job", ttl_seconds=5) is None
        assert redlock.extend(lease)
        assert redlock.release(lease)
        assert redlock.holders("job") == []

    def test_partial_grant_is_undone_everywhere(self, nodes: Nodes) -> None:
        """When another owner holds a majority, our minority grants are released."""
        import redis

        for url in nodes.urls[:3]:
            redis.Redis.from_url(url).set(lock_key("job"), "other", px=10_000)
        redlock = _redlock(nodes, retry_count=1, retry_delay_seconds=0.01)
        assert redlock.acquire("job", ttl_seconds=5) is None
        assert redlock.holders("job") == ["other"] * 3

    def test_two_nodes_down_still_grants_and_excludes(self, nodes: Nodes) -> None:
        """With 2 of 5 nodes killed, locks are granted and no two threads hold one at once."""
        nodes.kill(0, 1)
        redlock = _redlock_unchecked(nodes, retry_count=0)
        holding = 0
        overlaps = 0
        granted = 0
        guard = threading.Lock()

        def contend() -> None:
            nonlocal holding, overlaps, granted
            for _ in range(20):
                lease = redlock.acquire("shared", ttl_seconds=5)
                if lease is None:
                    continue
                with guard:
                    holding += 1
                    granted += 1
                    overlaps += holding > 1
                time.sleep(0.002)
                with guard:
                    holding -= 1
                redlock.release(lease)

        threads = [threading.Thread(target=contend) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert granted > 0
        assert overlaps == 0

    def test_three_nodes_down_fails_clearly_and_bounded(self, nodes: Nodes) -> None:
        """With 3 of 5 nodes killed acquisition raises a clear error after bounded attempts."""
        nodes.kill(0, 1, 2)
        sleeps: list[float] = []
        redlock = Redlock(
            _clients(nodes), options=RedlockConfig(retry_count=3, retry_delay_seconds=0.1),
            sleep=sleeps.append,
        )
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="only 2 of 5 nodes answered"):
            redlock.acquire("job", ttl_seconds=5)
        elapsed = time.monotonic() - started
        assert len(sleeps) == 3 and all(0 <= s <= 0.1 for s in sleeps)
        # Bounded: attempts x per-node socket timeout; here nodes refuse connections at once.
        assert elapsed < 4 * 5 * 0.5 + 1

    def test_validity_discounts_elapsed_time_and_drift(self, nodes: Nodes) -> None:
        """validity = ttl - elapsed - drift on the injected monotonic clock."""
        ticks = iter([100.0, 100.4])
        redlock = Redlock(_clients(nodes), options=RedlockConfig(clock_drift_factor=0.01),
                          clock=lambda: next(ticks))
        lease = redlock.acquire("job", ttl_seconds=10)
        assert lease is not None
        assert lease.valid_until == pytest.approx(100.0 + 10 - 0.1 - 0.002)

    def test_too_slow_acquisition_is_not_a_lock(self, nodes: Nodes) -> None:
        """An acquisition that took longer than the TTL is given back everywhere."""
        ticks = iter([0.0, 6.0])
        redlock = Redlock(_clients(nodes), options=RedlockConfig(retry_count=0),
                          clock=lambda: next(ticks))
        assert redlock.acquire("job", ttl_seconds=5) is None
        assert Redlock(_clients(nodes)).holders("job") == []


def _clients(nodes: Nodes) -> list[Any]:
    import redis

    return [redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
            for url in nodes.urls]


def _redlock_unchecked(nodes: Nodes, **options: Any) -> Redlock:
    return Redlock(_clients(nodes), options=RedlockConfig(**options))


class TestFencing:
    def test_tokens_increase_across_node_restarts(self, nodes: Nodes, engine: Any) -> None:
        """Tokens strictly increase per key, also after 2 of 5 nodes restart empty."""
        tokens = FencingTokens(engine)
        seen = []
        for round_ in range(3):
            redlock = _redlock_unchecked(nodes, retry_count=0)
            lease = redlock.acquire("fenced", ttl_seconds=5)
            assert lease is not None
            seen.append(tokens.mint("fenced"))
            redlock.release(lease)
            if round_ == 0:
                nodes.restart_empty(0)
                nodes.restart_empty(1)
        assert seen == sorted(seen) and len(set(seen)) == len(seen)

    def test_stale_token_write_rejected(self, engine: Any) -> None:
        """A write with an older token than the newest seen is refused and rolled back."""
        tokens = FencingTokens(engine)
        old, new = tokens.mint("r"), tokens.mint("r")
        key = f"resource-{new}"
        with engine.begin() as connection:
            FencingTokens.guard_write(connection, key, new)
        with engine.begin() as connection:
            FencingTokens.guard_write(connection, key, new)  # same holder writes again
        with pytest.raises(StaleFencingToken, match="older than"), engine.begin() as connection:
            FencingTokens.guard_write(connection, key, old)
        assert tokens.newest(key) == new


class TestAdvisorySession:
    def test_exclusive_and_freed_on_close(self, stores: Any) -> None:
        """A second session cannot take a held key; closing the holder frees it at once."""
        with AdvisorySession(stores.database_url, label="a") as first, AdvisorySession(
            stores.database_url, label="b"
        ) as second:
            assert first.try_acquire("job:1")
            assert not second.try_acquire("job:1")
            assert [h.task_id for h in second.holders("job:1")] == ["a"]
            first.close()
            assert second.try_acquire("job:1")

    def test_killed_session_is_detected(self, stores: Any, engine: Any) -> None:
        """pg_terminate_backend of the holder's session makes verify() raise."""
        session = AdvisorySession(stores.database_url, label="victim")
        assert session.try_acquire("job:2")
        session.verify("job:2")
        with engine.begin() as connection:
            connection.execute(text("SELECT pg_terminate_backend(:pid)"),
                               {"pid": session.backend_pid})
        with pytest.raises(LockNotOwnedError, match="session is gone"):
            session.verify("job:2")
        session.close()


class TestHeartbeat:
    def test_renews_until_stopped(self, redis_client: Any) -> None:
        """The lease is extended in the background, so it outlives its TTL."""
        lock = RedisLock(redis_client)
        lease = lock.acquire("hb", ttl_seconds=0.3)
        assert lease is not None
        heartbeat = Heartbeat(lease, lock.extend, HeartbeatConfig(renew_fraction=0.3)).start()
        time.sleep(0.8)
        heartbeat.check()
        assert lease.extensions >= 2 and lock.locked("hb")
        heartbeat.stop()

    def test_failed_extension_is_reported(self, redis_client: Any) -> None:
        """When the lock is taken away, check() raises LockNotOwnedError."""
        lock = RedisLock(redis_client)
        lease = lock.acquire("hb2", ttl_seconds=0.3)
        assert lease is not None
        heartbeat = Heartbeat(lease, lock.extend, HeartbeatConfig(renew_fraction=0.3)).start()
        redis_client.delete(lock_key("hb2"))
        time.sleep(0.4)
        with pytest.raises(LockNotOwnedError, match="lost"):
            heartbeat.check()
        heartbeat.stop()

    def test_cap_on_extensions(self, redis_client: Any) -> None:
        lock = RedisLock(redis_client)
        lease = lock.acquire("hb3", ttl_seconds=0.2)
        assert lease is not None
        heartbeat = Heartbeat(
            lease, lock.extend, HeartbeatConfig(renew_fraction=0.25, max_extensions=1)
        ).start()
        time.sleep(0.4)
        with pytest.raises(LockNotOwnedError, match="cap"):
            heartbeat.check()
        heartbeat.stop()

    def test_paused_holder_expired_deadline(self) -> None:
        """A holder whose monotonic deadline passed learns it without any Redis call."""
        now = [0.0]
        lease = Lease(name="p", owner="o", ttl_seconds=1, acquired_at=0, valid_until=1,
                      clock=lambda: now[0])
        heartbeat = Heartbeat(lease, lambda _: True)
        heartbeat.check()
        now[0] = 5.0
        with pytest.raises(LockNotOwnedError, match="expired"):
            heartbeat.check()
