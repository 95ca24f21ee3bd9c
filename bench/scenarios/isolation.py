"""Tier isolation: the critical queue wait (p99) with the optional tier flooded at 10x its
workers' capacity, over the same quiet, in alternating phases. See docs/overload.md."""

from __future__ import annotations

import multiprocessing
import time
import uuid
from typing import Any

import psutil

from bench import harness


def lower_priority(workers: list[Any], niceness: int) -> None:
    """Execution bulkhead on shared CPUs: the optional pool yields the CPU to critical work."""
    for worker in workers:
        for process in [psutil.Process(worker.pid), *worker.children()]:
            process.nice(niceness)


def flood(per_second: float, sleep_seconds: float, niceness: int, flooding: Any,
          finished: Any, results: Any) -> None:
    """Producer process: publish optional jobs at `per_second` while `flooding` is set.

    It stands in for other services' producers; on the benchmark's shared CPUs it runs at
    `niceness` so it models another machine rather than stealing the critical worker's CPU.
    """
    import os

    from bench.tasks_overload import optional_sleep
    from resilience.admission import DiscardedResult

    os.nice(niceness)
    sent = discarded = 0
    while not finished.is_set():
        if not flooding.wait(0.1):
            continue
        watch, n = harness.Stopwatch(), 0
        while flooding.is_set():
            watch.pace(n / per_second)
            result = optional_sleep.apply_async(("flood", sleep_seconds))
            n += 1
            if isinstance(result, DiscardedResult):
                discarded += 1
            else:
                sent += 1
    results.put((sent, discarded))


def critical_phase(run: str, per_second: float, seconds: float,
                   work_seconds: float) -> list[float]:
    """Publish critical probes on a fixed schedule; return their queue waits (ms)."""
    from bench.tasks_overload import critical_probe

    total = int(per_second * seconds)
    watch = harness.Stopwatch()
    for n in range(total):
        watch.pace(n / per_second)
        critical_probe.apply_async((run, time.time(), work_seconds))
    key, client = f"bench:isolation:{run}", harness.redis()
    harness.wait_until(lambda: client.llen(key) >= total, timeout_seconds=120,
                       what=f"{total} critical probes", poll_seconds=0.05)
    return [float(value) for value in client.lrange(key, 0, -1)]


def run(argv: list[str]) -> dict[str, Any]:
    options = harness.parse(
        argv, "isolation", seconds=(5.0, "length of each phase"),
        rounds=(5, "quiet/flooded pairs, alternating so both see the same machine"),
        critical_per_second=20.0, critical_work_seconds=0.02, optional_concurrency=4,
        optional_sleep_seconds=0.5, flood_factor=10.0,
        optional_nice=(10, "CPU niceness of the optional worker and the flood producer"))

    capacity = options.optional_concurrency / options.optional_sleep_seconds
    flood_rate = capacity * options.flood_factor
    waits: dict[str, list[float]] = {"quiet": [], "flooded": []}
    max_depth = 0

    with harness.platform():
        harness.purge(["critical", "optional"])
        context = multiprocessing.get_context("spawn")
        flooding, finished, results = context.Event(), context.Event(), context.Queue()
        producer = context.Process(
            target=flood,
            args=(flood_rate, options.optional_sleep_seconds, options.optional_nice, flooding,
                  finished, results),
        )
        producer.start()
        with harness.workers("critical", count=1, concurrency=2), \
                harness.workers("optional", count=1, concurrency=options.optional_concurrency,
                                pool="threads") as optional_workers:
            lower_priority(optional_workers, options.optional_nice)
            for _ in range(options.rounds):
                for phase in ("quiet", "flooded"):
                    if phase == "flooded":
                        flooding.set()
                        time.sleep(1.0)  # let the flood build a backlog first
                    waits[phase] += critical_phase(
                        uuid.uuid4().hex, options.critical_per_second, options.seconds,
                        options.critical_work_seconds,
                    )
                    if phase == "flooded":
                        flooding.clear()
                        max_depth = max(max_depth, harness.queue_depth("optional"))
                    harness.purge(["optional"])
            finished.set()
            sent, discarded = results.get(timeout=60)
            producer.join(30)

    quiet, flooded = harness.summary(waits["quiet"]), harness.summary(waits["flooded"])
    ratio = flooded["p99"] / quiet["p99"] if quiet["p99"] > 0 else float("inf")
    harness.table(
        f"isolation: critical {options.critical_per_second:g}/s; optional flooded at "
        f"{flood_rate:g}/s = {options.flood_factor:g}x its capacity ({capacity:g}/s)",
        ["phase", "jobs", "wait p50 ms", "wait p99 ms", "wait mean ms"],
        [(phase, len(waits[phase]), s["p50"], s["p99"], s["mean"])
         for phase, s in (("quiet", quiet), ("flooded", flooded))],
    )
    harness.table("optional flood", ["published", "discarded by bulkhead", "max queue depth"],
                  [(sent, discarded, max_depth)])
    return {
        "critical_wait_p99_ms_quiet": round(quiet["p99"], 2),
        "critical_wait_p99_ms_flooded": round(flooded["p99"], 2),
        "ratio": round(ratio, 3),
        "critical_wait_p50_ms_quiet": round(quiet["p50"], 2),
        "critical_wait_p50_ms_flooded": round(flooded["p50"], 2),
        "optional_flood_per_s": flood_rate,
        "optional_worker_nice": options.optional_nice,
        "optional_capacity_per_s": capacity,
        "optional_published": sent,
        "optional_discarded": discarded,
        "p999_ms_flooded": round(harness.percentile(waits["flooded"], 0.999), 2),
    }
