"""Test-suite helpers: the shared harness in `tests.harness`, plus the suite's task modules."""

from __future__ import annotations

import os

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
           "running", "suite_task_modules", "wait_for"]

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
