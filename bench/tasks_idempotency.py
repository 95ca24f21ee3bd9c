"""Bench tasks of the idempotency scenario: the same no-op, plain and idempotent."""

from __future__ import annotations

from jobs import app
from resilience.idempotency import idempotent
from resilience.stores import stores_for


@app.task(tier="standard", ignore_result=True)
def idem_bench_plain(counter: str, n: int) -> None:
    """Count one execution in Redis."""
    stores_for(app).redis().incr(counter)


@app.task(tier="standard", ignore_result=True)
@idempotent(key="{counter}:{n}")
def idem_bench_guarded(counter: str, n: int) -> None:
    """The same no-op, idempotent per (counter, n)."""
    stores_for(app).redis().incr(counter)


#: The steps of the guard's happy path, cumulatively, for `--breakdown`.
STEPS = ("cache", "ping", "claim")


@app.task(tier="standard", ignore_result=True)
def idem_bench_steps(counter: str, n: int, steps: str) -> None:
    """The same no-op after part of the guard's work, done by hand with the guard's own store
    and cache: `cache` (the Redis fast-path read), `ping` (that, plus one PostgreSQL round
    trip: `SELECT 1`), `claim` (the read, plus the real claim; no completion)."""
    from resilience.idempotency.backends.postgres import backend_for as store_for
    from resilience.idempotency.cache import ResultCache

    stores = stores_for(app)
    key = f"{counter}:{n}"
    ResultCache(stores.redis()).get(idem_bench_steps.name, key)
    store = store_for(stores, synchronous_commit=False)
    if steps == "ping":
        store.ping()
    elif steps == "claim":
        store.claim(task_name=idem_bench_steps.name, key=key, fingerprint="0" * 64,
                    owner=f"bench:{key}", task_id=None, lease_seconds=60.0,
                    ttl_seconds=3600.0)
    stores.redis().incr(counter)
