"""Test-suite helpers: the shared harness in `tests.harness`, plus the suite's task modules."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from tests.harness import (
    ARTIFACTS,
    ROOT,
    Services,
    Worker,
    running,
    task_modules,
    wait_for,
)

__all__ = ["ARTIFACTS", "RABBITMQ_URL", "ROOT", "Services", "Worker", "rabbitmq_reachable",
           "running", "scratch_database", "suite_task_modules", "wait_for"]

#: The RabbitMQ the RabbitMQ tests use (it cannot be embedded from PyPI).
RABBITMQ_URL = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")


def suite_task_modules() -> list[str]:
    """Every tasks module of the test suite; the test workers load them all."""
    return task_modules("tests")


def dead_redis(**options: object) -> object:
    """A Redis client for a port nobody listens on, failing at once: redis-py 8 retries a
    refused connection with backoff by default (seconds per command), which a test of the
    store-down path only waits through."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from jobs.embedded import free_port

    settings: dict[str, object] = {"socket_connect_timeout": 0.2, "retry": Retry(NoBackoff(), 0)}
    settings.update(options)
    return redis.Redis(port=free_port(), **settings)  # type: ignore[arg-type]


def rabbitmq_reachable() -> bool:
    """Whether `RABBITMQ_URL` answers (the RabbitMQ tests say so when it does not)."""
    from kombu import Connection

    try:
        with Connection(RABBITMQ_URL, connect_timeout=2) as connection:
            connection.ensure_connection(max_retries=1)
        return True
    except Exception:  # noqa: BLE001 - any failure means unreachable
        return False


@contextmanager
def scratch_database(database_url: str, prefix: str) -> Iterator[str]:
    """A new, empty database named `<prefix>_<random>` on the PostgreSQL of `database_url`;
    yields its URL (the given one's driver and password) and drops it, connections and all."""
    import uuid

    from sqlalchemy import create_engine, make_url, text

    url = make_url(database_url)
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(url.set(drivername="postgresql+psycopg2", database="postgres"),
                          isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
