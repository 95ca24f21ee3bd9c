"""The circuit breakers' view: every breaker a registered task configures, state and rate."""

from __future__ import annotations

from resilience.circuit.backends.base import STATES
from resilience.circuit.backends.redis import RedisBreakerBackend
from resilience.views import Column, Family, Row, Source, View, marked, per_row, seconds


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def read(source: Source, *, include_stored: bool = False) -> list[Row]:
    """Declared breakers' states: one pipeline, no SCAN; with `include_stored` every breaker
    with state in Redis too (one SCAN: `jobs breakers list`)."""
    configs = {guard.config.name: guard.config for _, guard in source.guards_named("breaker")}
    states = RedisBreakerBackend(source.redis).describe(configs, include_stored=include_stored)
    return [
        {"name": state.name, "state": state.state, "open": state.open, "calls": state.calls,
         "failures": state.failures, "slow_calls": state.slow_calls,
         "failure_rate": round(state.failure_rate, 4),
         "failure_rate_threshold": getattr(configs.get(state.name), "failure_rate_threshold",
                                           None),
         "times_opened": state.times_opened,
         "seconds_in_state": _rounded(state.seconds_in_state, 1),
         "retry_in_seconds": _rounded(state.retry_in_seconds, 1)}
        for state in states
    ]


def _percent(value: float | None) -> str:
    return "" if value is None else f"{value:.0%}"


VIEW = View(
    name="breakers", title="circuit breakers", store="redis", read=read,
    row_id=lambda r: f"breaker-{r['name']}", row_data=lambda r: {"state": r["state"]},
    alert=lambda r: "OPEN" if r["open"] else None,
    columns=(
        Column(header="breaker", key="name"),
        Column(header="state", text=lambda r: marked(r["state"], "bold red", r["open"])),
        Column(header="failure rate", text=lambda r: _percent(r["failure_rate"])),
        Column(header="threshold", text=lambda r: _percent(r["failure_rate_threshold"])),
        Column(header="calls", key="calls"),
        Column(header="failures", key="failures"),
        Column(header="opened", key="times_opened"),
        Column(header="in state", text=lambda r: seconds(r["seconds_in_state"])),
        Column(header="half-open in", text=lambda r: seconds(r["retry_in_seconds"])),
    ),
    metrics=(
        Family(name="jobs_breaker_state",
               help="1 for the breaker's current state, 0 for the others",
               labels=("breaker", "state"),
               samples=lambda rows, _: (([row["name"], name], float(row["state"] == name))
                                        for row in rows for name in STATES)),
        Family(name="jobs_breaker_failure_rate", help="Failures / calls in the breaker's window",
               labels=("breaker",), samples=per_row("failure_rate")),
        Family(name="jobs_breaker_opened", help="Times the breaker opened", kind="counter",
               labels=("breaker",), samples=per_row("times_opened")),
        # How long the current state has lasted, so a dashboard can say "open for 12 min"
        # without a range query; absent for a breaker that never changed state.
        Family(name="jobs_breaker_state_seconds",
               help="Seconds since the breaker entered its current state",
               labels=("breaker",), samples=per_row("seconds_in_state")),
    ),
)
