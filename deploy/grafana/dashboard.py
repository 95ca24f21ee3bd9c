"""The jobs platform's Grafana dashboard, in grafanalib; writes dashboard.json beside it.

    .venv/bin/python deploy/grafana/dashboard.py          # regenerate dashboard.json
    .venv/bin/python deploy/grafana/dashboard.py --check  # exit 1 when the JSON is stale

Rows: an overview (alerts, beat, outbox, budgets, limits, locks), one row per tier (depth
against its limit, outcomes, shedding) and one row per dependency, repeated over the
`breaker` variable (state, time in state, failure rate, deferrals, its retry budget). The
queries read `jobs metrics` directly or through the recording rules of
deploy/prometheus/rules.yml, so Prometheus must load those rules. Output is deterministic
(sorted keys, fixed uid and panel ids): the test suite compares it with the shipped file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import attr
from grafanalib._gen import DashboardEncoder
from grafanalib.core import (
    Dashboard,
    GridPos,
    Panel,
    Repeat,
    RowPanel,
    Stat,
    Target,
    Template,
    Templating,
    Time,
    TimeSeries,
)

from jobs.tiers import TIERS

OUTPUT = Path(__file__).with_name("dashboard.json")
UID = "jobs-platform"
#: Grafana 10/11 dashboards: panels carry their gridPos, rows are row panels.
SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
#: Grafana's grid is 24 columns wide.
GRID_WIDTH = 24

#: Green below the step, red from it (a ratio of 1 = a limit reached).
RED_FROM_ONE = [{"color": "green", "value": None}, {"color": "red", "value": 1}]
RED_FROM_80_PERCENT = [{"color": "green", "value": None}, {"color": "orange", "value": 0.8},
                       {"color": "red", "value": 1}]


def queries(exprs: tuple[str | tuple[str, str], ...]) -> list[Target]:
    """PromQL queries, each an expr or (expr, legend), with refIds A, B, ..."""
    pairs = [(expr, "") if isinstance(expr, str) else expr for expr in exprs]
    return [Target(expr=expr, legendFormat=legend, refId=chr(ord("A") + index),
                   datasource=DATASOURCE)
            for index, (expr, legend) in enumerate(pairs)]


def graph(title: str, *exprs: str | tuple[str, str], unit: str = "", description: str = "",
          width: int = 8, height: int = 8, stacked: bool = False) -> TimeSeries:
    """A time series panel; `layout` places it."""
    return TimeSeries(
        title=title, description=description, dataSource=DATASOURCE, targets=queries(exprs),
        unit=unit, gridPos=GridPos(h=height, w=width, x=0, y=0), fillOpacity=10,
        stacking={"mode": "normal", "group": "A"} if stacked else {}, tooltipMode="multi",
    )


def stat(title: str, *exprs: str | tuple[str, str], unit: str = "none", description: str = "",
         thresholds: list[dict[str, Any]] | None = None, mappings: list[Any] | None = None,
         text_mode: str = "auto", width: int = 4, height: int = 4) -> Stat:
    """A single-value panel showing the last value; `layout` places it."""
    return Stat(
        title=title, description=description, dataSource=DATASOURCE, targets=queries(exprs),
        format=unit, reduceCalc="lastNotNull", graphMode="none", textMode=text_mode,
        colorMode="background" if thresholds else "value", noValue="no data",
        thresholds=thresholds or [{"color": "blue", "value": None}], mappings=mappings or [],
        gridPos=GridPos(h=height, w=width, x=0, y=0),
    )


def row(title: str, *, repeat: str | None = None) -> RowPanel:
    """An expanded row: the panels after it in the list belong to it."""
    return RowPanel(title=title, gridPos=GridPos(h=1, w=GRID_WIDTH, x=0, y=0),
                    repeat=Repeat(variable=repeat) if repeat else Repeat())


# -- the rows --------------------------------------------------------------------------------
def overview() -> list[Panel]:
    """Fleet-wide state: what fires, what stopped, what piles up."""
    return [
        row("Overview"),
        stat("Alerts firing",
             'count(ALERTS{alertstate="firing", alertname=~"Jobs.*"}) or vector(0)',
             thresholds=RED_FROM_ONE,
             description="Alerts of deploy/prometheus/rules.yml firing now."),
        stat("Beat leader", "jobs_beat_leader",
             thresholds=[{"color": "red", "value": None}, {"color": "green", "value": 1}],
             mappings=[{"type": "value", "options": {
                 "0": {"text": "none", "color": "red", "index": 0},
                 "1": {"text": "leading", "color": "green", "index": 1}}}],
             description="0: no beat process holds the leader lock; periodic jobs stop."),
        stat("Outbox lag", "jobs_outbox_lag_seconds", unit="s",
             thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 60}],
             description="Age of the oldest due outbox row (`jobs outbox status`)."),
        stat("Dead-lettered, last hour",
             'sum(increase(jobs_guard_outcomes_total{outcome="DEAD-LETTERED"}[1h])) or vector(0)',
             thresholds=RED_FROM_ONE, description="`jobs dead-letters list --pending` lists them."),
        stat("Locks held", "jobs_locks_held"),
        stat("State sections unreadable", "count(jobs_observe_section_up == 0) or vector(0)",
             thresholds=RED_FROM_ONE,
             description="Sections `jobs metrics` could not read (a store down)."),
        graph("Tier depth / limit", ("tier:jobs_queue_depth:ratio", "{{tier}}"),
              unit="percentunit",
              description="1 = the tier's bulkhead limit: new jobs meet its policy."),
        graph("Breakers not closed", ("breaker:jobs_breaker_open:max", "{{breaker}}"),
              description="1 while open, half-open or forced open (`jobs breakers list`)."),
        graph("Retry budget used", ("jobs_retry_budget_used_ratio", "{{dependency}}"),
              unit="percentunit",
              description="1 = exhausted: failures are dead-lettered, not retried."),
        graph("Limit decisions / s", ("kind_limit_outcome:jobs_limit_decisions:rate5m",
                                      "{{kind}} {{limit}} {{outcome}}"), unit="ops"),
        graph("Concurrency slots in use", ("jobs_concurrency_in_use", "{{limit}} in use"),
              ("jobs_concurrency_limit", "{{limit}} limit")),
        graph("Outbox rows pending", ("jobs_outbox_pending", "{{when}}"), stacked=True),
        graph("Lock hold time p95", ("kind:jobs_lock_hold_seconds:p95_5m", "{{kind}}"), unit="s",
              description="Needs PROMETHEUS_MULTIPROC_DIR on the workers."),
        graph("Idempotency records", ("jobs_idempotency_records", "{{state}}"), stacked=True),
        graph("Replayed / s", ("sum by (tier) (rate(jobs_idempotency_hits_total[5m]))",
                               "{{tier}}"), unit="ops",
              description="Calls answered from a stored result instead of running again."),
    ]


def tier_row(tier: str) -> list[Panel]:
    """One tier: its queue against the bulkhead limit, what its guards decided, shedding."""
    selector = f'tier="{tier}"'
    return [
        row(f"Tier {tier}"),
        stat("Depth / limit", f"tier:jobs_queue_depth:ratio{{{selector}}}", unit="percentunit",
             thresholds=RED_FROM_80_PERCENT, width=4, height=8),
        graph("Queue depth", (f"jobs_queue_depth{{{selector}}}", "depth"),
              (f"jobs_queue_max_depth{{{selector}}}", "limit"), width=6),
        graph("Guard outcomes / s", (
            f"sum by (outcome) (tier_guard_outcome:jobs_guard_outcomes:rate5m{{{selector}}})",
            "{{outcome}}"), unit="ops", stacked=True, width=7),
        graph("Shed, rejected, discarded / s", (
            "sum by (outcome, guard) (tier_guard_outcome:jobs_guard_outcomes:rate5m"
            f'{{{selector}, outcome=~"SHED|REJECTED|DISCARDED"}})',
            "{{outcome}} by {{guard}}"), unit="ops", width=7,
            description="SHED: past its deadline; REJECTED/DISCARDED: tier full at enqueue."),
    ]


def dependency_row() -> list[Panel]:
    """One dependency (breaker), repeated for every value of the `breaker` variable."""
    breaker = 'breaker="$breaker"'
    return [
        row("Dependency $breaker", repeat="breaker"),
        stat("Breaker state", (f"max by (state) (jobs_breaker_state{{{breaker}}}) == 1",
                               "{{state}}"), text_mode="name", height=8,
             description="`jobs breakers list`; `jobs breakers reset NAME` ends a forced state."),
        graph("Failure rate", (f"jobs_breaker_failure_rate{{{breaker}}}", "failures"),
              unit="percentunit", width=10),
        graph("Breaker decisions / s", (
            f"breaker_outcome:jobs_guard_outcomes:rate5m{{{breaker}}}", "{{outcome}}"),
            unit="ops", width=10, description="Calls deferred or sent to the fallback."),
        stat("In this state for", f"jobs_breaker_state_seconds{{{breaker}}}", unit="s",
             height=8),
        stat("Opened, last 24 h", f"increase(jobs_breaker_opened_total{{{breaker}}}[24h])",
             height=8),
        graph("Retry budget", ('jobs_retry_budget_used_ratio{dependency="$breaker"}', "used"),
              ('jobs_retry_budget_retries{dependency="$breaker"}', "retries in window"),
              ('jobs_retry_budget_requests{dependency="$breaker"}', "requests in window"),
              width=16,
              description="Budgets are per dependency; a breaker named after the dependency "
                          "shows its budget here. 1 = exhausted."),
    ]


def layout(panels: list[Panel]) -> list[Panel]:
    """Place panels left to right, wrapping at the grid width, and number them from 1.

    A row panel starts a new line; each row's panels are sized so a line sums to 24.
    """
    placed: list[Panel] = []
    x = y = line_height = 0
    for panel in panels:
        w, h = panel.gridPos.w, panel.gridPos.h
        if isinstance(panel, RowPanel) or x + w > GRID_WIDTH:
            x, y, line_height = 0, y + line_height, 0
        placed.append(attr.evolve(panel, gridPos=GridPos(h=h, w=w, x=x, y=y),
                                  id=len(placed) + 1))
        if isinstance(panel, RowPanel):
            y += h
        else:
            x, line_height = x + w, max(line_height, h)
    return placed


def build() -> Dashboard:
    """The whole dashboard: overview, a row per tier, a row per dependency."""
    panels = overview()
    for tier in TIERS:
        panels += tier_row(tier)
    panels += dependency_row()
    variables = [
        Template(name="datasource", label="Prometheus", query="prometheus", type="datasource",
                 default="Prometheus"),
        Template(name="breaker", label="Dependency",
                 query="label_values(jobs_breaker_state, breaker)", dataSource=DATASOURCE,
                 includeAll=True, multi=True, default="$__all", refresh=2),
    ]
    return Dashboard(
        title="Jobs platform", uid=UID, schemaVersion=SCHEMA_VERSION,
        description="Tiers, dependencies and guard decisions of the jobs platform "
                    "(deploy/grafana/dashboard.py).",
        tags=["jobs", "celery"], timezone="browser", refresh="30s", editable=True,
        time=Time("now-3h", "now"), panels=layout(panels),
        templating=Templating(list=variables), graphTooltip=1,
    )


def render() -> str:
    """The dashboard JSON exactly as shipped in dashboard.json."""
    return json.dumps(build().to_json_data(), cls=DashboardEncoder, sort_keys=True,
                      indent=2) + "\n"


def main(argv: list[str]) -> int:
    """Write dashboard.json, or with --check say whether it is up to date."""
    text = render()
    if "--check" in argv:
        current = OUTPUT.read_text() if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT} is stale: run python deploy/grafana/dashboard.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
