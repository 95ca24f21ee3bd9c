"""What every scenario shares: real services, real workers, timing and the report table."""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from redis.connection import AbstractConnection
from rich.console import Console
from rich.table import Table

from tests.harness import Services, Worker, running, task_modules

console = Console(stderr=False)


def parse(argv: Sequence[str], scenario: str, **defaults: Any) -> argparse.Namespace:
    """A scenario's `--name value` options: each default, or `(default, help)`, gives the
    option's type; a False default makes a flag."""
    parser = argparse.ArgumentParser(prog=f"python -m bench {scenario}")
    for name, given in defaults.items():
        default, text = given if isinstance(given, tuple) else (given, None)
        flag = "--" + name.replace("_", "-")
        if default is False:
            parser.add_argument(flag, action="store_true", help=text)
        else:
            parser.add_argument(flag, type=type(default), default=default, help=text)
    return parser.parse_args(argv)


def redis() -> Any:
    """The platform's shared-state Redis client (inside `platform()`)."""
    from jobs import app
    from resilience.stores import stores_for

    return stores_for(app).redis()


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


def wait_until(done: Callable[[], bool], *, timeout_seconds: float = 600, what: str = "drain",
               poll_seconds: float = 0.005) -> float:
    """Poll `done()` until it holds; the seconds waited.

    Raises:
        TimeoutError: `done()` still false after `timeout_seconds`.
    """
    watch = Stopwatch()
    while not done():
        if watch.elapsed > timeout_seconds:
            raise TimeoutError(f"{what} did not finish in {timeout_seconds} s")
        time.sleep(poll_seconds)
    return watch.elapsed


def drain_paused(queue: str, enqueue: Callable[[], Any], done: Callable[[], bool],
                 worker_names: list[str], *, timeout_seconds: float = 600) -> float:
    """Seconds the workers take to drain what `enqueue()` published while they were paused.

    Consumers are cancelled, the messages enqueued, consumers added back, then `done()`
    is polled: the time measures draining a prefilled queue, not the producer.
    """
    from jobs import app

    app.control.cancel_consumer(queue, destination=worker_names, reply=True)
    enqueue()
    app.control.add_consumer(queue, destination=worker_names, reply=True)
    return wait_until(done, timeout_seconds=timeout_seconds)


def drain_rate(queue: str, redis: Any, send: Callable[[str, int], Any], n: int,
               worker_names: list[str], *, counter: str | None = None) -> float:
    """Jobs per second the paused workers drain: `send(counter, i)` for i < n publishes jobs
    that each INCR `counter` (default: a fresh Redis key) once they ran."""
    counter = counter or f"bench:{queue}:{uuid.uuid4().hex}"
    seconds = drain_paused(queue, lambda: [send(counter, i) for i in range(n)],
                           lambda: int(redis.get(counter) or 0) >= n, worker_names)
    return n / seconds


def warm_up(redis: Any, tasks: Iterable[Any], jobs: int = 50) -> None:
    """Run `jobs` of each task `(counter, i)` first: connections, imports, scripts."""
    counter, tasks = f"bench:warm:{uuid.uuid4().hex}", list(tasks)
    for index in range(jobs):
        for task in tasks:
            task.delay(counter, index)
    wait_until(lambda: int(redis.get(counter) or 0) >= jobs * len(tasks), what="warm-up",
               poll_seconds=0.01)


def paired_ratio(rates: Mapping[str, Sequence[float]], variant: str, base: str = "plain") -> float:
    """The median of each round's `variant / base` rate: the rounds alternate, so a noisy
    moment weighs on both sides of a ratio (steadier than a ratio of medians)."""
    return statistics.median(
        mine / theirs for mine, theirs in zip(rates[variant], rates[base], strict=True))


class RoundTrips:
    """Counts what redis-py sends (one per command or pipeline) while installed."""

    def __init__(self) -> None:
        self.count = 0

    def __enter__(self) -> RoundTrips:
        self._original = original = AbstractConnection.send_packed_command

        def counted(connection: Any, command: Any, check_health: bool = True) -> Any:
            self.count += 1
            return original(connection, command, check_health)

        AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        AbstractConnection.send_packed_command = self._original  # type: ignore[method-assign]


class PostgresRoundTrips:
    """Counts the query strings (one round trip each, whatever statements they hold) sent on
    psycopg2 connections opened while installed."""

    def __init__(self) -> None:
        self.count = 0

    @contextmanager
    def installed(self) -> Iterator[PostgresRoundTrips]:
        import psycopg2
        import psycopg2.extensions

        counter = self

        class CountingCursor(psycopg2.extensions.cursor):
            def execute(self, query: Any, parameters: Any = None) -> Any:
                counter.count += 1
                return super().execute(query, parameters)

        connect = psycopg2.connect

        def counted_connect(*args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("cursor_factory", CountingCursor)
            return connect(*args, **kwargs)

        psycopg2.connect = counted_connect
        try:
            yield self
        finally:
            psycopg2.connect = connect


def psql(url: str, sql: str, parameters: Any = None) -> list[tuple[Any, ...]]:
    """Run one statement on a fresh autocommit psycopg2 connection; its rows, if any."""
    import psycopg2

    connection = psycopg2.connect(url)
    connection.autocommit = True
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql, parameters)
            return cursor.fetchall() if cursor.description else []
    finally:
        connection.close()


def percentile(values: Sequence[float], fraction: float) -> float:
    """The `fraction` percentile (0-1) of `values`, nearest-rank."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))
    return ordered[index]


def summary(values: Sequence[float]) -> dict[str, float]:
    """p50, p99 and mean of `values`."""
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

    def pace(self, seconds: float) -> None:
        """Sleep until `seconds` after the start: a steady-rate producer's next send."""
        time.sleep(max(0.0, seconds - self.elapsed))


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Print a readable table of results before the final JSON line."""
    view = Table(title=title)
    for column in columns:
        view.add_column(column, justify="right" if column != columns[0] else "left")
    for row in rows:
        view.add_row(*[f"{cell:,.2f}" if isinstance(cell, float) else str(cell) for cell in row])
    console.print(view)
