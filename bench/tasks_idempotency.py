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
