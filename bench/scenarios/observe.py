"""Cost of seeing the platform: one status snapshot (without the `inspect active` broadcast,
whose cost is its timeout) and one `/metrics` render with breakers and budgets holding state,
and the Redis commands one snapshot sends. See docs/observe.md."""

from __future__ import annotations

from typing import Any

from bench.harness import Stopwatch, parse, platform, summary, table


def _commands(client: Any) -> int:
    return int(client.info("stats")["total_commands_processed"])


def run(argv: list[str]) -> dict[str, Any]:
    options = parse(argv, "observe", rounds=100, breakers=20)
    with platform():
        from prometheus_client import generate_latest

        from jobs import app
        from jobs.observe.metrics import registry_for
        from jobs.observe.snapshot import collect
        from resilience.circuit.backends.redis import RedisBreakerBackend
        from resilience.circuit.breaker import CircuitBreaker
        from resilience.circuit.config import BreakerConfig
        from resilience.counters import count
        from resilience.retry.budget import RedisBudgetBackend, RetryBudget
        from resilience.stores import stores_for

        stores = stores_for(app)
        redis = stores.redis()
        for n in range(options.breakers):
            CircuitBreaker(BreakerConfig(name=f"bench-dep-{n}"),
                           RedisBreakerBackend(stores.redis)).force("closed")
            RedisBudgetBackend(stores.redis).decide(f"bench-dep-{n}", "request", RetryBudget())
            count(redis, outcome="DEFERRED", tier="critical", guard="breaker",
                  name=f"bench-dep-{n}")
        collect(app, active=False)  # warm: connections, script registration

        before = _commands(redis)
        collect(app, active=False)
        commands = _commands(redis) - before - 1  # minus this INFO's own count

        snapshot_ms, scrape_ms = [], []
        registry = registry_for(app)
        for _ in range(options.rounds):
            watch = Stopwatch()
            collect(app, active=False)
            snapshot_ms.append(watch.elapsed * 1000)
            watch = Stopwatch()
            generate_latest(registry)
            scrape_ms.append(watch.elapsed * 1000)

    snap, scrape = summary(snapshot_ms), summary(scrape_ms)
    table(
        f"observe: {options.rounds} rounds, {options.breakers} breakers/budgets with state",
        ["measure", "p50 ms", "p99 ms", "mean ms"],
        [("snapshot (no inspect)", snap["p50"], snap["p99"], snap["mean"]),
         ("/metrics render", scrape["p50"], scrape["p99"], scrape["mean"])],
    )
    return {"snapshot_p50_ms": round(snap["p50"], 2), "snapshot_p99_ms": round(snap["p99"], 2),
            "scrape_p50_ms": round(scrape["p50"], 2), "scrape_p99_ms": round(scrape["p99"], 2),
            "redis_commands_per_snapshot": commands, "breakers": options.breakers}
