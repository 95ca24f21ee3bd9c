"""Tasks of the overload benchmarks (isolation, ratelimit); loaded by the bench workers."""

from __future__ import annotations

import time

from jobs import app
from resilience.pipeline import Call
from resilience.ratelimit import Decision, rate_limit
from resilience.stores import stores_for

#: The guarded benchmark rate (permits per second across every worker).
BENCH_RATE_PER_SECOND = 10


@app.task(tier="critical", ignore_result=True, name="bench.overload.critical_probe")
def critical_probe(run: str, enqueued_at: float, seconds: float = 0.02) -> None:
    """Record how long this job waited in the queue (ms), then do a little I/O-bound work."""
    waited_ms = (time.time() - enqueued_at) * 1000
    stores_for(app).redis().rpush(f"bench:isolation:{run}", f"{waited_ms:.3f}")
    time.sleep(seconds)


@app.task(tier="optional", ignore_result=True, name="bench.overload.optional_sleep")
def optional_sleep(run: str, seconds: float = 0.5) -> None:
    """An I/O-bound optional job (a slow vendor call)."""
    time.sleep(seconds)
    stores_for(app).redis().incr(f"bench:isolation:{run}:optional")


def record_grant(call: Call, key: str, decision: Decision) -> None:
    """Write the Redis server time of every permit granted (the audit of the limit)."""
    client = stores_for(app).redis()
    if decision.allowed:
        client.rpush(f"bench:ratelimit:{call.args[0]}", f"{decision.now_seconds:.6f}")
    else:
        client.rpush(f"bench:ratelimit:{call.args[0]}:denied",
                     f"{decision.now_seconds:.6f} {decision.retry_after_seconds:.4f}")


@app.task(tier="standard", ignore_result=True, name="bench.overload.rated")
@rate_limit("bench-rate:{run}", f"{BENCH_RATE_PER_SECOND}/second", on_decision=record_grant)
def rated(run: str, n: int) -> None:
    """One call to a vendor allowed BENCH_RATE_PER_SECOND calls per second fleet-wide."""


@app.task(tier="standard", ignore_result=True, name="bench.overload.plain_rated",
          rate_limit=f"{BENCH_RATE_PER_SECOND}/s")
def plain_rated(run: str, n: int) -> None:
    """The same call limited by Celery's own rate_limit, which is per worker."""
    client = stores_for(app).redis()
    seconds, micros = client.time()
    client.rpush(f"bench:ratelimit:{run}", f"{seconds + micros / 1e6:.6f}")


@app.task(tier="standard", ignore_result=True, name="bench.overload.rated_burst")
@rate_limit("bench-burst:{run}", f"{BENCH_RATE_PER_SECOND}/second", burst=2,
            on_decision=record_grant)
def rated_burst(run: str, n: int) -> None:
    """As `rated`, with burst=2: one permit of slack absorbs deferral latency."""
