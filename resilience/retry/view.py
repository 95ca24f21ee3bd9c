"""The retry budgets' view: requests and retries in each budget's window, the share used."""

from __future__ import annotations

from typing import Any

from resilience.retry.budget import RedisBudgetBackend
from resilience.views import Column, Family, Row, Source, View, marked, per_row


def read(source: Source) -> list[Row]:
    """The budgets the registered tasks configure: one pipeline, no SCAN."""
    configs: dict[str, Any] = {}
    for task, guard in source.guards_named("retry"):
        budget = getattr(getattr(guard, "policy", None), "budget", None)
        if budget is not None:
            configs[guard.policy.dependency or task.name] = budget
    return [
        {"dependency": state.dependency, "requests": state.requests, "retries": state.retries,
         "retries_allowed": round(state.retries_allowed, 2), "used": round(state.used, 4),
         "ratio": state.ratio, "window_seconds": state.window_seconds,
         "configured": state.dependency in configs}
        for state in RedisBudgetBackend(source.redis).describe(configs)
    ]


VIEW = View(
    name="budgets", title="retry budgets", store="redis", read=read,
    columns=(
        Column(header="dependency", key="dependency"),
        Column(header="requests", key="requests"),
        Column(header="retries", key="retries"),
        Column(header="allowed", key="retries_allowed"),
        Column(header="used", text=lambda r: marked(f"{r['used']:.0%}", "bold red",
                                                    r["used"] >= 1)),
        Column(header="window", text=lambda r: f"{r['window_seconds']:g}s"),
    ),
    metrics=(
        Family(name="jobs_retry_budget_used_ratio", samples=per_row("used", "dependency"),
               labels=("dependency",), help="Retries in the window / retries the budget allows"),
        Family(name="jobs_retry_budget_requests", samples=per_row("requests", "dependency"),
               labels=("dependency",), help="Executions counted in the budget window"),
        Family(name="jobs_retry_budget_retries", samples=per_row("retries", "dependency"),
               labels=("dependency",), help="Retries spent in the budget window"),
    ),
)
