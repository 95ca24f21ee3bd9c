"""Retry storm: dependency calls per job (amplification) against a local dependency answering
503 to everything, `@retry_policy` with a budget vs Celery's autoretry, on the same workers.
See docs/failure.md "Measured"."""

from __future__ import annotations

import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from celery import states

from bench.harness import Stopwatch, parse, platform, purge, table, workers


class FailingDependency:
    """HTTP server on 127.0.0.1 answering 503 to every GET, counting calls."""

    def __init__(self) -> None:
        self.calls = 0
        lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with lock:
                    owner.calls += 1
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


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
    """Enqueue `task` at a steady rate against a fresh failing dependency; wait for all."""
    dependency = FailingDependency()
    try:
        jobs = int(rate_per_s * seconds)
        watch = Stopwatch()
        results = []
        for index in range(jobs):
            pause = index / rate_per_s - watch.elapsed
            if pause > 0:
                time.sleep(pause)
            results.append(task.delay(dependency.url))
        # Poll the stored states with one MGET: 300 AsyncResults each subscribing to the
        # result backend's pub/sub is what a benchmark should not measure (nor trip over).
        while True:
            finished = _finished(results)
            if sum(finished.values()) == jobs:
                break
            if watch.elapsed > seconds + 300:
                raise TimeoutError(f"storm jobs did not finish in time: {finished}")
            time.sleep(0.2)
        return {"jobs": jobs, "calls": dependency.calls, "failed": finished[states.FAILURE],
                "amplification": dependency.calls / jobs, "seconds": watch.elapsed}
    finally:
        dependency.close()


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
