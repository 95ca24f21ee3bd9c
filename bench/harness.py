"""What every scenario shares: real services, real workers, timing and the report table."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.table import Table

from tests.harness import Services, Worker, running, task_modules

console = Console(stderr=False)


@contextmanager
def platform(extra_env: dict[str, str] | None = None) -> Iterator[Services]:
    """Services for one benchmark run (environment first, embedded otherwise).

    Sets the environment before the app is first imported, so `from jobs import app` inside
    a scenario talks to these services; bench task modules are loaded by the workers.
    """
    services = Services(imports=task_modules("bench")).start()
    os.environ.update(services.environment())
    os.environ.update(extra_env or {})
    try:
        from jobs import app

        app.loader.import_default_modules()
        yield services
    finally:
        services.stop()


@contextmanager
def workers(queues: str, *, count: int = 1, concurrency: int = 2,
            env: dict[str, str] | None = None, pool: str = "prefork") -> Iterator[list[Worker]]:
    """`count` real worker processes on `queues`, stopped afterwards."""
    with running(Worker(queues, name=f"bench-{queues}-{index}", concurrency=concurrency,
                        env=env, pool=pool) for index in range(count)) as started:
        yield started


def purge(queues: Iterable[str]) -> None:
    """Empty broker queues."""
    from jobs import app

    with app.connection_for_write() as connection:
        for queue in queues:
            connection.default_channel.queue_purge(queue)


def queue_depth(queue: str) -> int:
    """Messages waiting in `queue` (passive declare works on Redis and RabbitMQ)."""
    from jobs import app

    with app.connection_for_write() as connection:
        _, count, _ = connection.default_channel.queue_declare(queue, passive=True)
        return int(count)


def drain_paused(queue: str, enqueue: Any, done: Any, worker_names: list[str],
                 *, timeout_seconds: float = 600) -> float:
    """Seconds the workers take to drain what `enqueue()` published while they were paused.

    Consumers are cancelled, the messages enqueued, consumers added back, then `done()`
    is polled: the time measures draining a prefilled queue, not the producer.
    """
    from jobs import app

    app.control.cancel_consumer(queue, destination=worker_names, reply=True)
    enqueue()
    app.control.add_consumer(queue, destination=worker_names, reply=True)
    watch = Stopwatch()
    while not done():
        if watch.elapsed > timeout_seconds:
            raise TimeoutError(f"drain did not finish in {timeout_seconds} s")
        time.sleep(0.005)
    return watch.elapsed


def percentile(values: Sequence[float], fraction: float) -> float:
    """The `fraction` percentile (0-1) of `values`, nearest-rank."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))
    return ordered[index]


def summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "p50": percentile(values, 0.50),
        "p99": percentile(values, 0.99),
        "mean": statistics.fmean(values) if values else float("nan"),
    }


class Stopwatch:
    """Monotonic elapsed seconds."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Print a readable table of results before the final JSON line."""
    view = Table(title=title)
    for column in columns:
        view.add_column(column, justify="right" if column != columns[0] else "left")
    for row in rows:
        view.add_row(*[f"{cell:,.2f}" if isinstance(cell, float) else str(cell) for cell in row])
    console.print(view)
