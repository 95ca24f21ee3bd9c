"""Cost of one guarded call, in-process: Redis round trips and CPU time per call.

The guard stacks of `bench guards` (platform defaults; breaker + retry budget + idempotency
+ singleton), each run inline with `apply()` `--calls` times after a warm-up, every redis-py
send counted (a command or a pipeline is one). Rates through real workers swing from run to
run on a noisy machine; these figures do not, so they are the ones to compare between two
trees (run each tree with `PYTHONPATH` pointing at it). The body's own INCR is one of the
round trips.
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

from bench.harness import RoundTrips, platform, table


def run(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench calls")
    parser.add_argument("--calls", type=int, default=400)
    options = parser.parse_args(argv)
    n = options.calls
    with platform():
        from bench.tasks_guards import guards_bench_guarded, guards_bench_platform

        figures: dict[str, dict[str, float]] = {}
        for name, task in (("platform", guards_bench_platform),
                           ("guarded", guards_bench_guarded)):
            counter = f"bench:calls:{uuid.uuid4().hex}"
            for index in range(30):
                task.apply((counter, -index - 1))
            with RoundTrips() as sent:
                cpu, wall = time.process_time(), time.perf_counter()
                for index in range(n):
                    task.apply((counter, index))
                figures[name] = {
                    "redis_round_trips": round(sent.count / n, 3),
                    "cpu_us": round((time.process_time() - cpu) / n * 1e6),
                    "wall_us": round((time.perf_counter() - wall) / n * 1e6),
                }
    table(f"one call, inline, {n} calls", ("stack", "Redis round trips", "CPU µs", "wall µs"),
          [(name, f"{f['redis_round_trips']:.2f}", f"{f['cpu_us']:,.0f}", f"{f['wall_us']:,.0f}")
           for name, f in figures.items()])
    return {"calls": n, **figures}
