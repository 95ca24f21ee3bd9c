"""Plain Celery on this platform: enqueue rate of one producer, drain rate of one worker."""

from __future__ import annotations

import uuid
from typing import Any

from bench.harness import Stopwatch, parse, platform, purge, redis, table, wait_until, workers


def run(argv: list[str]) -> dict[str, Any]:
    options = parse(argv, "baseline", messages=5000, concurrency=2)
    with platform():
        from bench.tasks_guards import guards_bench_platform as noop

        client = redis()
        purge(["standard"])
        counter = f"bench:baseline:{uuid.uuid4().hex}"

        watch = Stopwatch()
        for _ in range(options.messages):
            noop.delay(counter, 0)
        enqueue_seconds = watch.elapsed

        with workers("standard", concurrency=options.concurrency):
            drain_seconds = wait_until(lambda: int(client.get(counter) or 0) >= options.messages,
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

