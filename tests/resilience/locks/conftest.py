"""Fixtures of the locks tests: the test tables and independent Redlock nodes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text


class Nodes:
    """N independent embedded Redis servers that a test may kill and restart."""

    def __init__(self, count: int, folder: Path) -> None:
        from jobs.embedded import embedded_redis, free_port

        self.folder = folder
        self.servers = [
            embedded_redis(free_port(), folder / f"node{index}") for index in range(count)
        ]
        for server in self.servers:
            server.start()

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self.servers]

    def env(self) -> dict[str, str]:
        return {"REDLOCK_URLS": ",".join(self.urls)}

    def kill(self, *indexes: int) -> None:
        for index in indexes:
            self.servers[index].kill()

    def restart_empty(self, index: int) -> None:
        """Start a fresh, empty server on the same port (a node that lost its data)."""
        from jobs.embedded import embedded_redis

        port = int(self.servers[index].url.rsplit(":", 1)[1].split("/")[0])
        self.servers[index].kill()
        fresh = embedded_redis(port, self.folder / f"node{index}-{uuid.uuid4().hex[:6]}")
        self.servers[index] = fresh.start()

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


@pytest.fixture()
def nodes(tmp_path: Path) -> Iterator[Nodes]:
    """Five fresh Redlock nodes for one test."""
    started = Nodes(5, tmp_path / "redlock")
    yield started
    started.stop()


@pytest.fixture(scope="session")
def locks_tables(stores: Any) -> None:
    # Imported here: this conftest loads before the session's services exist.
    from tests.resilience.locks.tasks import CREATE_TABLES

    with stores.engine().begin() as connection:
        connection.execute(text(CREATE_TABLES))


@pytest.fixture()
def run_id(redis_client: Any) -> Iterator[str]:
    """A fresh id per test; at the end the test's long-running tasks are told to stop."""
    value = uuid.uuid4().hex[:12]
    yield value
    redis_client.set(f"locks-test:stop:{value}", 1, ex=600)


@pytest.fixture()
def own_critical_queue(app: Any) -> Iterator[None]:
    """Workers already running (shared tier workers of other tests) stop consuming the
    critical queue during the test, so its messages reach only the test's own workers,
    which the test kills and stops; they consume it again afterwards."""
    names = [name for reply in app.control.ping(timeout=1.0) for name in reply]
    if names:
        app.control.cancel_consumer("critical", destination=names, reply=True, timeout=2)
    yield
    if names:
        app.control.add_consumer("critical", destination=names, reply=True, timeout=2)


@pytest.fixture(params=["singleton", "exclusive"])
def lock_backend(request: pytest.FixtureRequest, stores: Any) -> Iterator[Any]:
    """Each `LockBackend` on its real store: the advisory backend on PostgreSQL, and the
    Redlock backend on five fresh nodes (fencing tokens and registry in PostgreSQL)."""
    from resilience.locks import AdvisoryLockBackend, FencingTokens, Redlock, RedlockBackend
    from resilience.locks.backends.postgres import HeldLockRegistry, discard_thread_session

    if request.param == "singleton":
        yield AdvisoryLockBackend(stores.database_url, engine=stores.engine)
        discard_thread_session()  # frees whatever the test left held
        return
    nodes: Nodes = request.getfixturevalue("nodes")
    yield RedlockBackend(Redlock.from_urls(nodes.urls), registry=HeldLockRegistry(stores.engine),
                         tokens=FencingTokens(stores.engine()), ttl_seconds=5)
