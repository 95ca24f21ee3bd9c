"""Plain Celery on this platform: enqueue rate of one producer, drain rate of one worker."""

from __future__ import annotations

import argparse
import uuid
from typing import Any

from bench.harness import Stopwatch, platform, purge, table, wait_until, workers


def run(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench baseline")
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=2)
    options = parser.parse_args(argv)

    with platform():
        from bench.tasks_guards import guards_bench_platform as noop
        from resilience.stores import stores_for

        redis = stores_for(noop.app).redis()
        purge(["standard"])
        counter = f"bench:baseline:{uuid.uuid4().hex}"

        watch = Stopwatch()
        for _ in range(options.messages):
            noop.delay(counter, 0)
        enqueue_seconds = watch.elapsed

        with workers("standard", concurrency=options.concurrency):
            drain_seconds = wait_until(lambda: int(redis.get(counter) or 0) >= options.messages,
                                       poll_seconds=0.01)

    enqueue_per_s = options.messages / enqueue_seconds
    drain_per_s = options.messages / drain_seconds
    table(
        f"baseline: {options.messages} messages, 1 producer, 1 worker x{options.concurrency}",
        ["measure", "seconds", "per second"],
        [("enqueue", enqueue_seconds, enqueue_per_s), ("drain", drain_seconds, drain_per_s)],
    )
    return {"enqueue_per_s": round(enqueue_per_s, 1), "drain_per_s": round(drain_per_s, 1),
            "messages": options.messages}

