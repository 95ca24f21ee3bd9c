"""Fixtures of the topology tests: a real 3-master Redis Cluster and a real Sentinel setup.

`redis_cluster` starts once per session, when a test first asks for it; `cluster_stores`
puts the guard state of the session's app on it for one module (inline runs, `apply()`,
execute the guards in this process) and gives the session's stores back afterwards.
PostgreSQL and the broker stay the session's. Nothing here imports `jobs` at module level
(this conftest may load before the session's services exist, see tests/conftest.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.redis_topologies import RedisClusterProcesses


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterProcesses]:
    cluster = RedisClusterProcesses().start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def cluster_stores(app: Any, stores: Any, services: Any,
                   redis_cluster: RedisClusterProcesses) -> Iterator[Any]:
    """The app's stores with guard state on the cluster, for this module's tests."""
    from resilience.stores import Stores, install, stores_for

    original = stores_for(app)
    on_cluster = install(app, Stores(redis_url=redis_cluster.url,
                                     database_url=services.database_url,
                                     socket_timeout_seconds=2.0))
    try:
        yield on_cluster
    finally:
        install(app, original)


@pytest.fixture()
def cluster_client(cluster_stores: Any) -> Any:
    """The guard Redis on the cluster (a `RedisCluster`), every master emptied first."""
    client = cluster_stores.redis()
    client.flushdb(target_nodes=client.PRIMARIES)
    return client
