"""Cost of one guarded call, in-process: round trips, WAL flushes and CPU time per call.

The guard stacks of `bench guards` (platform defaults; breaker + retry budget + idempotency
+ singleton), each run inline with `apply()` `--calls` times after a warm-up, every redis-py
send counted (a command or a pipeline is one) and every PostgreSQL query string sent (one
round trip each, whatever statements it holds). Rates through real workers swing from run
to run on a noisy machine; these figures do not, so they are the ones to compare between
two trees (run each tree from its own directory, with `PYTHONPATH` pointing at it: `-m`
puts the working directory first). The body's own INCR is one of the Redis round trips.

`wal_flushes` is PostgreSQL's count of WAL flushes (`pg_stat_wal.wal_sync`) during the
calls, per call: a commit that waits for its flush (`synchronous_commit = on`) costs one
(a disk flush: ~1 ms on this machine's disk, more than the rest of the round trip). It is
the whole server's count, so other clients' writes add to it.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from bench.harness import PostgresRoundTrips, RoundTrips, parse, platform, psql, table


def _wal_flushes(url: str) -> int:
    return int(psql(url, "SELECT wal_sync FROM pg_stat_wal")[0][0])


def run(argv: list[str]) -> dict[str, Any]:
    n = parse(argv, "calls", calls=400).calls
    with platform(), PostgresRoundTrips().installed() as statements:
        from bench.tasks_guards import guards_bench_guarded, guards_bench_platform
        from jobs import app
        from resilience.locks.backends.postgres import discard_thread_session
        from resilience.stores import stores_for

        url = stores_for(app).database_url.replace("postgresql+psycopg2://", "postgresql://")
        figures: dict[str, dict[str, float]] = {}

        def settle() -> None:
            """End this thread's connections: a backend reports its WAL counts when it has
            been idle a while or when it ends (the next calls open their own)."""
            stores_for(app).statements().close()
            discard_thread_session()
            time.sleep(0.5)

        for name, task in (("platform", guards_bench_platform),
                           ("guarded", guards_bench_guarded)):
            counter = f"bench:calls:{uuid.uuid4().hex}"
            for index in range(30):
                task.apply((counter, -index - 1))
            settle()
            flushed = _wal_flushes(url)
            task.apply((counter, -100))  # connect and prepare again, uncounted
            statements.count = 0
            with RoundTrips() as sent:
                cpu, wall = time.process_time(), time.perf_counter()
                for index in range(n):
                    task.apply((counter, index))
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            round_trips = statements.count
            settle()
            figures[name] = {
                "redis_round_trips": round(sent.count / n, 3),
                "pg_round_trips": round(round_trips / n, 3),
                "wal_flushes": round((_wal_flushes(url) - flushed) / n, 2),
                "cpu_us": round(cpu / n * 1e6),
                "wall_us": round(wall / n * 1e6),
            }
    table(f"one call, inline, {n} calls",
          ("stack", "Redis round trips", "PostgreSQL round trips", "WAL flushes (server-wide)",
           "CPU µs", "wall µs"),
          [(name, f"{f['redis_round_trips']:.2f}", f"{f['pg_round_trips']:.2f}",
            f"{f['wal_flushes']:.2f}", f"{f['cpu_us']:,.0f}", f"{f['wall_us']:,.0f}")
           for name, f in figures.items()])
    return {"calls": n, **figures}
