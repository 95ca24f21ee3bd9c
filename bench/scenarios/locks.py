"""Lock latency: acquire + release of each lock kind on real PostgreSQL and Redis nodes, in
alternating rounds (docs/locks.md "Benchmark"). `pg_session` is what one @singleton run pays
(open the dedicated session, lock, unlock, close); redlock3/5 pipeline to 3 / 5 independent
nodes; pottery5 is pottery's Redlock on the same 5 nodes.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.harness import parse, percentile, platform, table


def run(argv: list[str]) -> dict[str, Any]:
    options = parse(argv, "locks", iterations=(2000, "per variant"), rounds=10)

    import redis
    from pottery import Redlock as PotteryRedlock

    from jobs.embedded import embedded_redis, free_port
    from resilience.locks import AdvisorySession, RedisLock, Redlock

    folder = Path(tempfile.mkdtemp(prefix="bench-locks-"))
    nodes = [embedded_redis(free_port(), folder / f"node{i}") for i in range(5)]
    with platform():
        from jobs import app
        from resilience.stores import stores_for

        database_url = stores_for(app).database_url
        for node in nodes:
            node.start()
        try:
            clients = [redis.Redis.from_url(node.url, socket_timeout=0.5,
                                            socket_connect_timeout=0.5) for node in nodes]
            session = AdvisorySession(database_url, label="bench")
            pottery = PotteryRedlock(key=f"bench-pottery-{uuid.uuid4().hex}",
                                     masters=set(clients), auto_release_time=10)

            def lock_cycle(lock: Any, name: str) -> Callable[[], None]:
                def cycle() -> None:
                    lease = lock.acquire(name, ttl_seconds=10)
                    assert lease is not None
                    lock.release(lease)
                return cycle

            def advisory_cycle() -> None:
                assert session.try_acquire("bench:advisory")
                session.release("bench:advisory")

            def session_cycle() -> None:
                with AdvisorySession(database_url, label="bench") as fresh:
                    assert fresh.try_acquire("bench:session")
                    fresh.release("bench:session")

            def pottery_cycle() -> None:
                assert pottery.acquire(blocking=False)
                pottery.release()

            variants: dict[str, Callable[[], None]] = {
                "pg_advisory": advisory_cycle,
                "pg_session": session_cycle,
                "redis_lock": lock_cycle(RedisLock(clients[0]), f"bench-single-{uuid.uuid4().hex}"),
                "redlock3": lock_cycle(Redlock(clients[:3]), f"bench-r3-{uuid.uuid4().hex}"),
                "redlock5": lock_cycle(Redlock(clients), f"bench-r5-{uuid.uuid4().hex}"),
                "pottery5": pottery_cycle,
            }
            samples: dict[str, list[float]] = {name: [] for name in variants}
            per_round = max(1, options.iterations // options.rounds)
            for cycle in variants.values():  # warm-up: connections, script caches
                for _ in range(20):
                    cycle()
            for _ in range(options.rounds):
                for name, cycle in variants.items():
                    count = per_round if name != "pg_session" else max(1, per_round // 10)
                    for _ in range(count):
                        started = time.perf_counter()
                        cycle()
                        samples[name].append((time.perf_counter() - started) * 1000)
            session.close()
        finally:
            for node in nodes:
                node.stop()

    rows = [(name, len(values), percentile(values, 0.5), percentile(values, 0.99))
            for name, values in samples.items()]
    table("locks: acquire + release latency (ms)", ["lock", "samples", "p50 ms", "p99 ms"], rows)
    p50 = {name: percentile(values, 0.5) for name, values in samples.items()}
    return {
        **{f"{name}_p50_ms": round(value, 3) for name, value in p50.items()},
        "redlock5_p99_ms": round(percentile(samples["redlock5"], 0.99), 3),
        "redlock5_vs_single": round(p50["redlock5"] / p50["redis_lock"], 2),
        "redlock5_vs_pottery": round(p50["redlock5"] / p50["pottery5"], 3),
    }
