"""Session-wide real services and shared tier workers.

Services start in `pytest_configure`, before any test module imports `jobs`, because the
app reads its settings from the environment once at import.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import Services, Worker, running, suite_task_modules

_services: Services | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _services
    if hasattr(config, "workerinput"):
        return
    _services = Services(imports=suite_task_modules()).start()
    os.environ.update(_services.environment())


def pytest_unconfigure(config: pytest.Config) -> None:
    if _services is not None:
        _services.stop()


@pytest.fixture(scope="session")
def services() -> Services:
    """The session's Redis/PostgreSQL/broker (environment or embedded)."""
    assert _services is not None
    return _services


@pytest.fixture(scope="session")
def app() -> Any:
    """The platform's Celery app, configured for the session's services."""
    from jobs import app as celery_app

    celery_app.loader.import_default_modules()
    return celery_app


@pytest.fixture(scope="session")
def stores(app: Any) -> Any:
    from resilience.stores import stores_for

    return stores_for(app)


@pytest.fixture()
def redis_client(stores: Any) -> Iterator[Any]:
    """The shared-state Redis (not the broker's database), emptied before the test."""
    client = stores.redis()
    client.flushdb()
    yield client


@pytest.fixture()
def engine(stores: Any) -> Any:
    return stores.engine()


@pytest.fixture(scope="session")
def tier_workers(app: Any) -> Iterator[dict[str, Worker]]:
    """One real worker process per tier, shared by the tests that only need them running."""
    from jobs.tiers import TIERS

    workers = {tier: Worker(tier, name=f"{tier}-shared") for tier in TIERS}
    with running(workers.values()):
        yield workers


@pytest.fixture()
def worker_factory(app: Any) -> Iterator[Any]:
    """Start dedicated worker processes for one test; all are stopped afterwards."""
    started: list[Worker] = []

    def start(queues: str, **options: Any) -> Worker:
        wait = options.pop("wait", True)
        worker = Worker(queues, **options)
        started.append(worker)
        return worker.start(wait=wait)

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture()
def purge_queues(app: Any) -> None:
    """Empty the tier queues so a test sees only its own messages."""
    from jobs.tiers import TIERS

    with app.connection_for_write() as connection:
        channel = connection.default_channel
        for tier in TIERS:
            channel.queue_purge(tier)
