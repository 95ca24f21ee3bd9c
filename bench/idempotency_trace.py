"""`python -m bench.idempotency_trace [N] [--profile VARIANT]`: the idempotency bench's tasks
traced in-process, as a worker child traces a message (docs/idempotency.md).

Steadier than the drain rates of `python -m bench idempotency` on a shared machine: per job,
wall and CPU time and round trips (Redis commands or pipelines, PostgreSQL query strings),
the fastest of 3 runs; the worker's main process (fetching, acks, events) is left out.
`--profile VARIANT` writes a cProfile of its last run to `artifacts/idempotency-<variant>.prof`
and prints its top entries.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import logging
import pstats
import time
import uuid
from typing import Any

from bench.harness import PostgresRoundTrips, RoundTrips, platform
from tests.harness import ARTIFACTS

VARIANTS = ("plain", "guarded", "handrolled", "replay")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.idempotency_trace")
    parser.add_argument("jobs", type=int, nargs="?", default=2000, help="jobs per run")
    parser.add_argument("--profile", choices=VARIANTS, help="cProfile this variant")
    options = parser.parse_args(argv)
    n = options.jobs
    with platform(), PostgresRoundTrips().installed() as statements:
        # The worker logs at INFO to a file; so does this process.
        ARTIFACTS.mkdir(exist_ok=True)
        logging.basicConfig(filename=ARTIFACTS / "idempotency-trace.log", level=logging.INFO)
        from celery.app.trace import build_tracer

        from bench.tasks_idempotency import (
            HANDROLLED_DDL,
            idem_bench_guarded,
            idem_bench_handrolled,
            idem_bench_plain,
        )
        from jobs import app
        from resilience.stores import stores_for

        with stores_for(app).engine().begin() as connection:
            connection.exec_driver_sql(HANDROLLED_DDL)
        hostname = "trace@bench"
        tasks = {"plain": idem_bench_plain, "guarded": idem_bench_guarded,
                 "handrolled": idem_bench_handrolled, "replay": idem_bench_guarded}
        tracers = {task.name: build_tracer(task.name, task, app.loader, hostname,
                                           eager=False, app=app)
                   for task in tasks.values()}

        def run(task: Any, counter: str, jobs: int) -> None:
            tracer = tracers[task.name]
            for index in range(jobs):
                task_id = uuid.uuid4().hex
                request = {"id": task_id, "task": task.name, "hostname": hostname,
                           "delivery_info": {"exchange": "", "routing_key": "standard",
                                             "priority": 0, "redelivered": False},
                           "is_eager": False, "called_directly": False,
                           "args": (counter, index), "kwargs": {}, "ignore_result": True,
                           "correlation_id": task_id, "retries": 0}
                traced = tracer(task_id, (counter, index), {}, request)
                if traced.info is not None and traced.info.state != "IGNORED":
                    raise RuntimeError(f"{task.name}: {traced.info.state} {traced.retval!r}")

        for name in ("plain", "guarded", "handrolled"):  # connections, scripts, imports
            run(tasks[name], f"bench:trace:warm:{uuid.uuid4().hex}", 100)
        results: dict[str, list[tuple[float, float, float, float]]] = {}
        for attempt in range(3):
            guarded = ""
            for name in VARIANTS:
                counter = guarded if name == "replay" else f"bench:trace:{uuid.uuid4().hex}"
                guarded = counter if name == "guarded" else guarded
                statements.count = 0
                profiled = options.profile == name and attempt == 2
                profile = cProfile.Profile() if profiled else contextlib.nullcontext()
                with RoundTrips() as trips:
                    wall, cpu = time.perf_counter(), time.process_time()
                    with profile:
                        run(tasks[name], counter, n)
                    if profiled:
                        profile.dump_stats(ARTIFACTS / f"idempotency-{name}.prof")
                    results.setdefault(name, []).append((
                        (time.perf_counter() - wall) / n * 1e6,
                        (time.process_time() - cpu) / n * 1e6,
                        trips.count / n, statements.count / n))
        for name, rows in results.items():
            wall, cpu, redis_trips, pg_trips = min(rows)
            print(f"{name:11s} wall {wall:6.0f} µs/job  cpu {cpu:6.0f} µs/job  "
                  f"redis {redis_trips:.2f}/job  pg {pg_trips:.2f}/job  "
                  f"(walls {', '.join(f'{row[0]:.0f}' for row in rows)})")
        if options.profile:
            stats = pstats.Stats(str(ARTIFACTS / f"idempotency-{options.profile}.prof"))
            stats.sort_stats("cumulative").print_stats(40)


if __name__ == "__main__":
    main()
