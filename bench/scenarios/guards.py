"""Full guard stack overhead: breaker + retry budget + idempotency + singleton vs plain.

Three variants of one no-op drain from a prefilled queue on the same running worker, in
alternating rounds so each sees the same machine load: plain Celery, a platform task with
only the platform defaults, and the fully guarded task. `ratio` is guarded / plain Celery,
the median of the per-round ratios.

Round trips on the guarded happy path (counted from the code): poison check 2 (Redis),
idempotency claim 1 + completion 1 (PostgreSQL) + fast-path cache write 1 (Redis),
singleton acquire 1 + release 1 (PostgreSQL, one dedicated session per worker thread),
breaker permission 1 + outcome 1 (Redis), retry budget request 1 (Redis).
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Any

from bench.harness import drain_paused, platform, purge, table, workers

QUEUE = "standard"
VARIANTS = ("plain", "platform", "guarded")


def run(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench guards")
    parser.add_argument("--messages", type=int, default=1000, help="messages per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each variant")
    parser.add_argument("--concurrency", type=int, default=2)
    options = parser.parse_args(argv)
    n = options.messages

    with platform():
        from bench.tasks_guards import (
            guards_bench_celery,
            guards_bench_guarded,
            guards_bench_platform,
        )
        from jobs import app
        from resilience.stores import stores_for

        tasks = {"plain": guards_bench_celery, "platform": guards_bench_platform,
                 "guarded": guards_bench_guarded}
        redis = stores_for(app).redis()
        purge([QUEUE])
        rates: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
        with workers(QUEUE, concurrency=options.concurrency) as started:
            names = [worker.nodename for worker in started]
            warm = f"bench:guards:warm:{uuid.uuid4().hex}"
            for index in range(50):
                for task in tasks.values():
                    task.delay(warm, index)
            while int(redis.get(warm) or 0) < 150:
                time.sleep(0.01)

            for _ in range(options.rounds):
                for variant in VARIANTS:
                    counter = f"bench:guards:{variant}:{uuid.uuid4().hex}"
                    task = tasks[variant]
                    seconds = drain_paused(
                        QUEUE,
                        lambda c=counter, t=task: [t.delay(c, i) for i in range(n)],
                        lambda c=counter: int(redis.get(c) or 0) >= n,
                        names,
                    )
                    rates[variant].append(n / seconds)

    ratios = [g / p for g, p in zip(rates["guarded"], rates["plain"], strict=True)]
    platform_ratios = [g / p for g, p in zip(rates["platform"], rates["plain"], strict=True)]
    medians = {variant: statistics.median(values) for variant, values in rates.items()}
    table(
        f"guards: {n} messages x {options.rounds} rounds, 1 worker x{options.concurrency}",
        ["variant", "median per second", "min", "max"],
        [(variant, medians[variant], min(rates[variant]), max(rates[variant]))
         for variant in VARIANTS],
    )
    return {
        "plain_per_s": round(medians["plain"], 1),
        "guarded_per_s": round(medians["guarded"], 1),
        "ratio": round(statistics.median(ratios), 3),
        "platform_per_s": round(medians["platform"], 1),
        "platform_ratio": round(statistics.median(platform_ratios), 3),
    }
