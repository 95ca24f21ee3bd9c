"""Distributed rate limit: decision throughput, and configured vs observed rate on 3 workers,
grant times on Redis server time; Celery's own `rate_limit` is per worker. See
docs/overload.md."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from bench.harness import Stopwatch, parse, platform, purge, redis, table, wait_until, workers
from resilience.ratelimit.algorithms import GCRA, SLIDING_WINDOW, Params


def max_in_window(times: list[float], window: float) -> int:
    ordered, best, right = sorted(times), 0, 0
    for left, start in enumerate(ordered):
        while right < len(ordered) and ordered[right] < start + window:
            right += 1
        best = max(best, right - left)
    return best


def decision_throughput(backend: Any, algorithm: str, seconds: float, threads: int) -> float:
    """Decisions per second from `threads` callers hammering one key (mostly denials)."""
    key, done, stop = uuid.uuid4().hex, [0] * threads, threading.Event()
    step, params = {
        "gcra": (GCRA, Params(limit=1, period_us=100_000, interval_us=100_000, burst=1)),
        "sliding_window": (SLIDING_WINDOW, Params(limit=10, period_us=1_000_000)),
    }[algorithm]

    def hammer(index: int) -> None:
        while not stop.is_set():
            backend.run(step, key, params)
            done[index] += 1

    pool = [threading.Thread(target=hammer, args=(i,)) for i in range(threads)]
    watch = Stopwatch()
    for thread in pool:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in pool:
        thread.join()
    return sum(done) / watch.elapsed


def observed(task: Any, jobs: int, timeout_seconds: float) -> tuple[float, int, float, int]:
    """Enqueue `jobs`, wait for every grant.

    Returns:
        (grants per second, most grants in any 1 s window, seconds, denials).
    """
    run, client = uuid.uuid4().hex, redis()
    for n in range(jobs):
        task.delay(run, n)
    key = f"bench:ratelimit:{run}"
    wait_until(lambda: client.llen(key) >= jobs, timeout_seconds=timeout_seconds,
               what=f"{jobs} grants", poll_seconds=0.05)
    grants = sorted(float(value) for value in client.lrange(key, 0, -1))
    denied = client.llen(f"{key}:denied")
    span = grants[-1] - grants[0]
    rate = (len(grants) - 1) / span if span > 0 else float("inf")
    return rate, max_in_window(grants, 1.0), span, denied


def run(argv: list[str]) -> dict[str, Any]:
    options = parse(argv, "ratelimit", jobs=(150, "guarded jobs (10/s: ~15 s)"), plain_jobs=90,
                    decision_seconds=3.0, threads=4)
    with platform():
        from bench.tasks_overload import BENCH_RATE_PER_SECOND, plain_rated, rated, rated_burst
        from resilience.ratelimit import RedisBackend
        from resilience.stores import stores_for

        backend = RedisBackend(stores_for(rated.app).redis, prefix="bench:limits")
        gcra_per_s, window_per_s = (
            decision_throughput(backend, algorithm, options.decision_seconds, options.threads)
            for algorithm in ("gcra", "sliding_window"))
        purge(["standard"])
        with workers("standard", count=3, concurrency=2):
            plain = observed(plain_rated, options.plain_jobs, 300)
            guarded = observed(rated, options.jobs, 600)
            burst = observed(rated_burst, options.jobs, 600)

    table(
        f"ratelimit: {BENCH_RATE_PER_SECOND}/s configured, 3 workers x2 processes",
        ["variant", "observed per s", "max in any 1 s window", "seconds", "deferrals"],
        [("celery rate_limit (per worker)", *plain),
         ("guarded gcra burst=1 (fleet-wide)", *guarded),
         ("guarded gcra burst=2 (fleet-wide)", *burst)],
    )
    table("decision throughput (one Lua script per decision)",
          ["algorithm", "decisions per s"],
          [("gcra", gcra_per_s), ("sliding_window", window_per_s)])
    return {
        "decisions_per_s": round(gcra_per_s, 1),
        "sliding_window_decisions_per_s": round(window_per_s, 1),
        "configured_per_s": BENCH_RATE_PER_SECOND,
        "observed_per_s": round(guarded[0], 2),
        "max_in_any_1s_window": guarded[1],
        "plain_celery_observed_per_s": round(plain[0], 2),
        "deferrals": guarded[3],
        "burst2_observed_per_s": round(burst[0], 2),
        "burst2_max_in_any_1s_window": burst[1],
    }
