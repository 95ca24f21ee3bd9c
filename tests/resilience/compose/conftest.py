"""Fixtures of the composition matrix: its stores behind fault proxies, and its own workers.

Layout (started once for this folder, when a compose test first asks for it, and stopped
after its last test: package scope, so nothing here outlives the folder in a full run):

    producer (pytest) ──── direct ────────────┐
    compose workers ── redis proxy ──► guard Redis (embedded, this folder's own)
                    ── pg proxy ─────► the session's PostgreSQL (same database)
                    ── direct ───────► 3 Redlock nodes (embedded); the session Redis
                                       (broker db 0 and result backend db 1)

Guard state moves off the session Redis onto a Redis of its own, so "Redis down" (SIGKILL
of the proxy) takes the guards' store away without touching the broker or the result
backend. PostgreSQL stays the session's database behind a proxy, so the tables the guards
share (idempotency records, lock registry, dead letters) are the ones the test reads.
The compose workers consume only the `compose` queue; the session's tier workers do not.

Nothing here imports `jobs` at module level: this conftest may load before the session's
services exist (see tests/conftest.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import make_url, text

from tests.harness import Worker, running
from tests.resilience.compose.proxy import Proxy

#: Pool processes per compose worker, and workers: 4 processes for 2 concurrency slots.
CONCURRENCY = 2
WORKERS = 2


class ComposeWorker(Worker):
    """A `Worker` on the compose app module (proxied guard stores, session result backend)."""

    APP = "tests.resilience.compose.worker_app"

    def command(self) -> list[str]:
        command = super().command()
        command[command.index("-A") + 1] = self.APP
        return command


@dataclass
class ComposeStores:
    """The guard Redis, the Redlock nodes and the two proxies, with their URLs."""

    guard_redis: Any
    nodes: list[Any]
    redis_proxy: Proxy
    postgres_proxy: Proxy
    database_url: str

    @property
    def redis_direct_url(self) -> str:
        return str(self.guard_redis.url)

    @property
    def redis_proxied_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_proxy.listen_port}/0"

    @property
    def database_proxied_url(self) -> str:
        url = make_url(self.database_url).set(port=self.postgres_proxy.listen_port)
        return url.render_as_string(hide_password=False)

    @property
    def redlock_urls(self) -> list[str]:
        return [str(node.url) for node in self.nodes]


@pytest.fixture(scope="package")
def compose_stores(services: Any, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[ComposeStores]:
    from jobs.embedded import embedded_redis, free_port

    folder: Path = tmp_path_factory.mktemp("compose")
    started: list[Any] = []
    proxies: list[Proxy] = []
    try:
        guard = embedded_redis(free_port(), folder / "guard-redis").start()
        started.append(guard)
        nodes = []
        for index in range(3):
            nodes.append(embedded_redis(free_port(), folder / f"redlock{index}").start())
            started.append(nodes[-1])
        guard_port = int(str(guard.url).rsplit(":", 1)[1].split("/")[0])
        database = make_url(services.database_url)
        redis_proxy = Proxy(free_port(), "127.0.0.1", guard_port, folder / "redis-proxy.log")
        proxies.append(redis_proxy.up())
        postgres_proxy = Proxy(free_port(), database.host or "127.0.0.1", database.port or 5432,
                               folder / "postgres-proxy.log")
        proxies.append(postgres_proxy.up())
        yield ComposeStores(guard_redis=guard, nodes=nodes, redis_proxy=redis_proxy,
                            postgres_proxy=postgres_proxy, database_url=services.database_url)
    finally:
        for proxy in proxies:
            proxy.down()
        for server in reversed(started):
            server.stop()


@pytest.fixture(scope="session")
def compose_tables(stores: Any) -> None:
    """The matrix's tables and its commit-inside-the-lock trigger, in the session database."""
    from tests.resilience.compose.tasks import CREATE_TABLES, CREATE_TRIGGER

    with stores.engine().begin() as connection:
        connection.execute(text(CREATE_TABLES))
        connection.execute(text(CREATE_TRIGGER))


@pytest.fixture(scope="package")
def compose_workers(app: Any, services: Any, compose_stores: ComposeStores,
                    compose_tables: None) -> Iterator[list[ComposeWorker]]:
    """Two compose workers of two pool processes each, consuming only `compose`."""
    from tests.resilience.compose.tasks import QUEUE, RECORDER_URL_VARIABLE

    env = {
        "REDIS_URL": compose_stores.redis_proxied_url,
        "DATABASE_URL": compose_stores.database_proxied_url,
        "REDLOCK_URLS": ",".join(compose_stores.redlock_urls),
        "COMPOSE_RESULT_BACKEND": services.redis_url,
        RECORDER_URL_VARIABLE: services.database_url,
        # Only this folder's tasks: the compose queue carries nothing else, and the
        # workers do not depend on other folders' task modules (edited by others meanwhile).
        "JOBS_IMPORTS": "tests.resilience.compose.tasks",
    }
    with app.connection_for_write() as connection:
        connection.default_channel.queue_purge(QUEUE)
    with running(ComposeWorker(QUEUE, name=f"compose{index}", concurrency=CONCURRENCY,
                               env=env) for index in range(WORKERS)) as workers:
        yield workers


@pytest.fixture(scope="package")
def compose(app: Any, stores: Any, services: Any, compose_stores: ComposeStores,
            compose_workers: list[ComposeWorker]) -> Iterator[Any]:
    """The matrix context; meanwhile the producer's guards use the compose stores directly.

    Inline runs (`apply()`, caller-runs) execute the guards in this process; they must meet
    the same guard state as the workers (limits, breakers, Redlock nodes), so the producer
    app's stores are swapped for direct connections to the compose stores, and restored
    when this folder's last test ended (package scope: the other folders' tests, which run
    in the same process, must find the session's stores again). The exclusive guard reads
    `REDLOCK_URLS` from the environment first, so that is set for the same time. `stores`
    is requested first, so the session fixture keeps the original object.
    """
    from resilience.stores import Stores, install, stores_for
    from tests.resilience.compose.harness import Context

    original = stores_for(app)
    saved = os.environ.get("REDLOCK_URLS")
    install(app, Stores(redis_url=compose_stores.redis_direct_url,
                        database_url=services.database_url,
                        redlock_urls=compose_stores.redlock_urls))
    os.environ["REDLOCK_URLS"] = ",".join(compose_stores.redlock_urls)
    try:
        yield Context(app=app, engine=stores.engine(), redis_proxy=compose_stores.redis_proxy,
                      postgres_proxy=compose_stores.postgres_proxy, workers=compose_workers)
    finally:
        install(app, original)
        if saved is None:
            os.environ.pop("REDLOCK_URLS", None)
        else:
            os.environ["REDLOCK_URLS"] = saved
