"""Guard Redis topologies and split database URLs in settings: accepted, or one clear line."""

from __future__ import annotations

import pytest

from jobs.settings import SettingsError, load_settings
from resilience.connections.redis import redis_from_url
from resilience.errors import ConfigurationError
from resilience.stores import Stores

SECRET = "s3cr3t-topology"


class TestGuardRedisTopologies:
    def test_sentinel_guard_store_needs_a_broker_url(self) -> None:
        """A Sentinel guard store is not a broker: the message says to set BROKER_URL."""
        with pytest.raises(SettingsError, match="set BROKER_URL"):
            load_settings(redis_url="redis+sentinel://127.0.0.1:26379/guards", broker_url=None)

    def test_cluster_guard_store_with_a_redis_broker_keeps_results_on_the_broker(self) -> None:
        settings = load_settings(redis_url="redis+cluster://127.0.0.1:7000,127.0.0.1:7001",
                                 broker_url="redis://127.0.0.1:6379/3")
        assert settings.effective_result_backend_url == "redis://127.0.0.1:6379/3"

    def test_cluster_guard_store_with_rabbitmq_needs_a_result_backend(self) -> None:
        with pytest.raises(SettingsError, match="set RESULT_BACKEND_URL"):
            load_settings(redis_url="redis+cluster://127.0.0.1:7000",
                          broker_url="amqp://guest:guest@127.0.0.1:5672//")
        settings = load_settings(redis_url="redis+cluster://127.0.0.1:7000",
                                 broker_url="amqp://guest:guest@127.0.0.1:5672//",
                                 result_backend_url="redis://127.0.0.1:6379/4")
        assert settings.effective_result_backend_url == "redis://127.0.0.1:6379/4"

    def test_a_single_redis_still_serves_guards_and_results(self) -> None:
        settings = load_settings(redis_url="redis://127.0.0.1:6379/5", broker_url=None)
        assert settings.effective_result_backend_url == "redis://127.0.0.1:6379/5"

    def test_unknown_scheme_is_refused_without_its_password(self) -> None:
        with pytest.raises(SettingsError) as caught:
            load_settings(redis_url=f"memcached://:{SECRET}@cache:11211")
        assert "redis+sentinel://" in str(caught.value) and SECRET not in str(caught.value)
        with pytest.raises(ConfigurationError) as raised:
            Stores(redis_url=f"http://:{SECRET}@cache", database_url="postgresql://db/jobs",
                   redlock_urls=["redis://127.0.0.1:6379/0"])
        assert SECRET not in str(raised.value)

    @pytest.mark.parametrize("url, message", [
        ("redis+sentinel://127.0.0.1:26379", "names no Sentinel service"),
        ("redis+sentinel://127.0.0.1:26379/guards/zero", "no db number"),
        ("redis+cluster://127.0.0.1:notaport", "is not host:port"),
        ("redis+cluster://", "names no host"),
    ])
    def test_malformed_topology_urls_say_what_is_wrong(self, url: str, message: str) -> None:
        with pytest.raises(ConfigurationError, match=message):
            redis_from_url(url)

    def test_sentinel_url_parts_reach_the_client(self) -> None:
        """Hosts, service, db and the data nodes' password come from the URL (no connection
        is made until the first command)."""
        client = redis_from_url(f"redis+sentinel://:{SECRET}@127.0.0.1:26379,[::1]:26380/guards/2",
                                decode_responses=True)
        pool = client.connection_pool
        assert pool.service_name == "guards"
        assert pool.connection_kwargs["db"] == 2
        assert pool.connection_kwargs["password"] == SECRET
        assert [(s.connection_pool.connection_kwargs["host"],
                 s.connection_pool.connection_kwargs["port"])
                for s in pool.sentinel_manager.sentinels] == [("127.0.0.1", 26379), ("::1", 26380)]


class TestLocksDatabaseUrl:
    def test_transaction_pooling_needs_a_direct_locks_url(self) -> None:
        with pytest.raises(SettingsError, match="set LOCKS_DATABASE_URL"):
            load_settings(pg_pool_mode="transaction",
                          database_url="postgresql://postgres@127.0.0.1:6432/test")
        settings = load_settings(pg_pool_mode="transaction",
                                 database_url="postgresql://postgres@127.0.0.1:6432/test",
                                 locks_database_url="postgresql://postgres@127.0.0.1:5432/test")
        assert settings.effective_locks_database_url.endswith(":5432/test")

    def test_lock_sessions_use_the_database_url_when_no_direct_url(self) -> None:
        stores = Stores(redis_url="redis://127.0.0.1:6379/0",
                        database_url="postgresql://postgres@127.0.0.1:5432/test")
        assert stores.locks_database_url == stores.database_url
        direct = Stores(redis_url="redis://127.0.0.1:6379/0",
                        database_url="postgresql://postgres@127.0.0.1:6432/test",
                        locks_database_url="postgresql://postgres@127.0.0.1:5432/test")
        assert direct.locks_database_url != direct.database_url
        assert direct.locks_database_url.endswith(":5432/test")
