"""The library reads its settings from `app.conf`, not from the environment (issue 23):
a user's app names its Redlock nodes in `resilience_redlock_urls` only."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

import resilience
from jobs.embedded import free_port
from resilience.locks import exclusive
from resilience.stores import stores_for
from tests.resilience.locks.conftest import Nodes


def test_exclusive_takes_its_nodes_from_the_app_conf(
    stores: Any, nodes: Nodes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock is taken on the nodes of `resilience_redlock_urls` (the key is on every
    one while the body runs), whatever REDLOCK_URLS says: here nodes where nothing
    listens, which the library used to prefer (the run was then DEFERRED, store down)."""
    monkeypatch.setenv("REDLOCK_URLS", ",".join(
        f"redis://127.0.0.1:{free_port()}/0" for _ in range(3)))
    app = Celery(f"shop-{free_port()}", broker=f"redis://127.0.0.1:{free_port()}/0")
    app.conf.task_always_eager = True
    app.conf.resilience_redis_url = stores.redis_url
    app.conf.resilience_database_url = str(stores.database_url).replace(
        "postgresql+psycopg2://", "postgresql://")
    app.conf.resilience_redlock_urls = ",".join(nodes.urls)
    resilience.init_app(app)
    seen: list[int] = []

    @app.task(shared=False)
    @exclusive(key="conf-{n}", ttl_seconds=10)
    def publish(n: int, fencing_token: int | None = None) -> int:
        import redis

        seen.append(sum(
            1 for url in nodes.urls
            if any(redis.Redis.from_url(url).scan_iter(match="*conf-*"))))
        return fencing_token or 0

    assert stores_for(app).redlock_urls == tuple(nodes.urls)
    assert publish.delay(1).get() > 0
    assert seen == [len(nodes.urls)]
