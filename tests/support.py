"""Test-suite helpers: the shared harness in `tests.harness`, plus the suite's task modules."""

from __future__ import annotations

from tests.harness import (
    ARTIFACTS,
    ROOT,
    Services,
    Worker,
    running,
    task_modules,
    wait_for,
)

__all__ = ["ARTIFACTS", "ROOT", "Services", "Worker", "running", "suite_task_modules",
           "wait_for"]


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
