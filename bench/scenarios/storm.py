"""Retry storm: dependency calls per job (amplification) against the simulated payment vendor
(`jobs.vendor`) in its `fail` mode, answering 503 to every charge, `@retry_policy` with a
budget vs Celery's autoretry, on the same workers. See docs/failure.md "Measured"."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from celery import states

from bench.harness import Stopwatch, parse, platform, purge, table, workers
from jobs.vendor import HOST, VendorControl, start_in_thread


def _finished(results: list[Any]) -> Counter[str]:
    """Final states of `results`, read from the result backend in one round trip."""
    backend = results[0].backend
    raw = backend.client.mget([backend.get_key_for_task(result.id) for result in results])
    found: Counter[str] = Counter()
    for value in raw:
        if value is not None:
            status = backend.decode_result(value)["status"]
            if status in states.READY_STATES:
                found[status] += 1
    return found


def storm(task: Any, *, rate_per_s: float, seconds: float) -> dict[str, float]:
    """Enqueue `task` at a steady rate against a fresh failing vendor; wait for all."""
    server = start_in_thread(0)
    vendor = VendorControl(f"http://{HOST}:{server.server_address[1]}")
    try:
        vendor.set_mode("fail")
        jobs = int(rate_per_s * seconds)
        watch = Stopwatch()
        results = []
        for index in range(jobs):
            watch.pace(index / rate_per_s)
            results.append(task.delay(vendor.base_url))
        # Poll the stored states with one MGET: 300 AsyncResults each subscribing to the
        # result backend's pub/sub is what a benchmark should not measure (nor trip over).
        while True:
            finished = _finished(results)
            if sum(finished.values()) == jobs:
                break
            if watch.elapsed > seconds + 300:
                raise TimeoutError(f"storm jobs did not finish in time: {finished}")
            time.sleep(0.2)
        calls = vendor.status()["calls"]
        return {"jobs": jobs, "calls": calls, "failed": finished[states.FAILURE],
                "amplification": calls / jobs, "seconds": watch.elapsed}
    finally:
        server.shutdown()
        server.server_close()


def run(argv: list[str]) -> dict[str, Any]:
    options = parse(argv, "storm", rate=(20.0, "jobs enqueued per second"),
                    seconds=(15.0, "length of the storm"), workers=(3, "worker processes"))

    with platform():
        from bench.tasks_failure import storm_budgeted, storm_plain

        purge(["standard"])
        with workers("standard", count=options.workers, concurrency=1):
            budgeted = storm(storm_budgeted, rate_per_s=options.rate, seconds=options.seconds)
            plain = storm(storm_plain, rate_per_s=options.rate, seconds=options.seconds)

    table(
        f"storm: 100 % failing dependency, {options.rate:g} jobs/s for {options.seconds:g} s, "
        f"{options.workers} worker processes",
        ["variant", "jobs", "dependency calls", "calls per job", "failed jobs"],
        [(label, r["jobs"], r["calls"], r["amplification"], r["failed"]) for label, r in
         (("retry budget (ratio 0.2)", budgeted), ("plain autoretry max_retries=3", plain))],
    )
    return {
        "amplification_budgeted": round(budgeted["amplification"], 3),
        "amplification_plain_autoretry": round(plain["amplification"], 3),
        "jobs_per_variant": budgeted["jobs"],
    }
