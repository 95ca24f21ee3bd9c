"""Prometheus metrics of the platform (prometheus-client).

Two sources, both correct under prefork workers:

- `SharedStateCollector` reads the shared state when Prometheus scrapes: queue depth and
  the oldest message's age from the broker, decision counters from Redis
  (`resilience.counters`, the consumption watchdog's stalls among them), breaker states,
  retry budget use, limit usage, idempotency records and the outbox backlog. Nothing is counted
  in process memory, so no prefork child can hold a number the others do not see.
- `LOCK_HOLD_SECONDS`, a Histogram observed in the worker processes themselves, in
  prometheus-client's multiprocess mode: every process writes its own mmap file under
  `PROMETHEUS_MULTIPROC_DIR`, `MultiProcessCollector` sums them at scrape time, and a pool
  child that exits is marked dead (`worker_process_shutdown`) so its live gauges go away.

`jobs metrics` serves both on http://127.0.0.1:9808/metrics with prometheus-client's own
HTTP server.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from jobs.observe.backlog import oldest_ages
from jobs.tiers import TIERS
from resilience.errors import StorageError

if TYPE_CHECKING:
    from celery import Celery

logger = logging.getLogger("jobs.observe.metrics")

#: The `guard` label of the consumption watchdog's counters (not a guard: exported apart).
WATCHDOG = "watchdog"

DEFAULT_ADDRESS = "127.0.0.1"
DEFAULT_PORT = 9808
BREAKER_STATES = ("closed", "open", "half_open", "forced_open", "forced_closed")

#: How long a singleton / exclusive lock was held, observed in the worker process that held
#: it. Not registered in any registry: in multiprocess mode the value lives in the mmap
#: files and `MultiProcessCollector` exports it.
LOCK_HOLD_SECONDS = Histogram(
    "jobs_lock_hold_seconds",
    "Seconds a task held its singleton/exclusive lock (acquire to release)",
    ["kind", "task"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, float("inf")),
    registry=None,
)


def multiprocess_dir() -> str | None:
    """The multiprocess directory, when multiprocess mode is on."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class SharedStateCollector(Collector):
    """Reads the platform's shared state at scrape time and exports it as metric families."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    def collect(self) -> Iterator[Metric]:
        from jobs.observe.snapshot import collect

        snapshot = collect(self.app, active=False)
        yield from tier_metrics(snapshot)
        ages_read = True
        try:
            ages = oldest_ages(self.app, TIERS)
        except StorageError as exc:
            logger.warning("oldest message ages not read: %s", exc)
            ages, ages_read = {}, False
        yield from queue_age_metrics(ages)
        yield from outcome_metrics(snapshot)
        yield from stall_metrics(snapshot)
        yield from breaker_metrics(snapshot)
        yield from budget_metrics(snapshot)
        yield from limit_metrics(snapshot)
        yield from idempotency_metrics(snapshot)
        yield from outbox_metrics(snapshot)
        yield from beat_metrics(snapshot)
        errors = GaugeMetricFamily(
            "jobs_observe_section_up",
            "1 when the section of the platform state could be read at this scrape",
            labels=["section"])
        for section in ("counters", "queue_depth", "breakers", "budgets", "limits", "locks",
                        "idempotency", "outbox"):
            errors.add_metric([section], 0.0 if section in snapshot["errors"] else 1.0)
        errors.add_metric(["queue_age"], 1.0 if ages_read else 0.0)
        yield errors


def _ok(section: Any) -> bool:
    return not (isinstance(section, dict) and "unavailable" in section)


def tier_metrics(snapshot: dict[str, Any]) -> Iterator[Metric]:
    depth = GaugeMetricFamily("jobs_queue_depth", "Messages waiting in the tier queue",
                              labels=["tier"])
    limit = GaugeMetricFamily("jobs_queue_max_depth", "The tier's bulkhead limit",
                              labels=["tier"])
    locks = GaugeMetricFamily("jobs_locks_held", "Singleton/exclusive locks held now")
    tiers = snapshot["tiers"]
    if _ok(tiers):
        for tier, row in tiers.items():
            limit.add_metric([tier], row["max_queue_depth"])
            if row["depth"] is not None:
                depth.add_metric([tier], row["depth"])
    if _ok(snapshot["locks"]):
        locks.add_metric([], snapshot["locks"]["count"])
    yield depth
    yield limit
    yield locks


def queue_age_metrics(ages: dict[str, float | None]) -> Iterator[Metric]:
    """Seconds the oldest waiting message of each tier was published ago (Redis brokers;
    absent on RabbitMQ and for a tier whose oldest message carries no `published_at`):
    the autoscaling signal beside depth (jobs.observe.backlog)."""
    age = GaugeMetricFamily(
        "jobs_queue_oldest_age_seconds",
        "Seconds since the oldest message waiting in the tier queue was published (0: empty)",
        labels=["tier"])
    for tier, seconds in ages.items():
        if seconds is not None:
            age.add_metric([tier], seconds)
    yield age


def stall_metrics(snapshot: dict[str, Any]) -> Iterator[Metric]:
    """The consumption watchdog's decisions (jobs.observe.watchdog): `reconnect` for each
    stall seen, `exit` when reconnecting did not help and the worker exited."""
    stalls = CounterMetricFamily(
        "jobs_worker_stalls",
        "Workers that stopped consuming with a backlog and free slots, by what was done",
        labels=["tier", "action"])
    counters = snapshot["counters"]
    if isinstance(counters, list):
        for c in counters:
            if c.get("guard") == WATCHDOG:
                stalls.add_metric([c.get("tier", ""), c.get("name", "")], c["value"])
    yield stalls


def outcome_metrics(snapshot: dict[str, Any]) -> Iterator[Metric]:
    outcomes = CounterMetricFamily(
        "jobs_guard_outcomes", "Guard decisions fleet-wide, by outcome, tier and guard",
        labels=["outcome", "tier", "guard", "name"])
    counters = snapshot["counters"]
    if isinstance(counters, list):
        for c in (c for c in counters if c.get("guard") != WATCHDOG):
            outcomes.add_metric([c.get("outcome", ""), c.get("tier", ""), c.get("guard", ""),
                                 c.get("name", "")], c["value"])
    yield outcomes


def breaker_metrics(snapshot: dict[str, Any]) -> Iterator[Metric]:
    state = GaugeMetricFamily("jobs_breaker_state",
                              "1 for the breaker's current state, 0 for the others",
                              labels=["breaker", "state"])
    rate = GaugeMetricFamily("jobs_breaker_failure_rate",
                             "Failures / calls in the breaker's window", labels=["breaker"])
    opened = CounterMetricFamily("jobs_breaker_opened", "Times the breaker opened",
                                 labels=["breaker"])
    # How long the current state has lasted, so a dashboard can say "open for 12 min"
    # without a range query; absent for a breaker that never changed state.
    since = GaugeMetricFamily("jobs_breaker_state_seconds",
                              "Seconds since the breaker entered its current state",
                              labels=["breaker"])
    breakers = snapshot["breakers"]
    if isinstance(breakers, list):
        for row in breakers:
            for name in BREAKER_STATES:
                state.add_metric([row["name"], name], 1.0 if row["state"] == name else 0.0)
            rate.add_metric([row["name"]], row["failure_rate"])
            opened.add_metric([row["name"]], row["times_opened"])
            if row.get("seconds_in_state") is not None:
                since.add_metric([row["name"]], row["seconds_in_state"])
    yield state
    yield rate
    yield opened
    yield since


def budget_metrics(snapshot: dict[str, Any]) -> Iterator[Metric]:
    used = GaugeMetricFamily("jobs_retry_budget_used_ratio",
                             "Retries in the window / retries the budget allows",
                             labels=["dependency"])
    requests = GaugeMetricFamily("jobs_retry_budget_requests",
                                 "Executions counted in the budget window", labels=["dependency"])
    retries = GaugeMetricFamily("jobs_retry_budget_retries",
                                "Retries spent in the budget window", labels=["dependency"])
    budgets = snapshot["budgets"]
    if isinstance(budgets, list):
        for row in budgets:
            used.add_metric([row["dependency"]], row["used"])
            requests.add_metric([row["dependency"]], row["requests"])
            retries.add_metric([row["dependency"]], row["retries"])
    yield used
    yield requests
    yield retries


def limit_metrics(snapshot: dict[str, Any]) -> Iterator[Metric]:
    decisions = CounterMetricFamily(
        "jobs_limit_decisions", "Rate/concurrency limit decisions that stopped or passed a call",
        labels=["kind", "limit", "outcome"])
    in_use = GaugeMetricFamily("jobs_concurrency_in_use", "Concurrency slots held now",
                               labels=["limit"])
    capacity = GaugeMetricFamily("jobs_concurrency_limit", "Concurrency slots configured",
                                 labels=["limit"])
    counters = snapshot["counters"]
    if isinstance(counters, list):
        for c in counters:
            if c.get("guard") in ("concurrency", "rate-limit"):
                decisions.add_metric([c["guard"], c.get("name", ""), c["outcome"]], c["value"])
    limits = snapshot["limits"]
    if _ok(limits):
        for row in limits["concurrency"]:
            if row["in_use"] is not None:  # None: keyed per argument, not enumerated
                in_use.add_metric([row["name"]], row["in_use"])
            if row["limit"] is not None:
                capacity.add_metric([row["name"]], row["limit"])
    yield decisions
    yield in_use
    yield capacity


def idempotency_metrics(snapshot: dict[str, Any]) -> Iterator[Metric]:
    hits = CounterMetricFamily("jobs_idempotency_hits",
                               "Calls answered from a stored result (REPLAYED)",
                               labels=["task", "tier"])
    records = GaugeMetricFamily("jobs_idempotency_records", "Idempotency records by state",
                                labels=["state"])
    counters = snapshot["counters"]
    if isinstance(counters, list):
        for c in counters:
            if c.get("guard") == "idempotency" and c.get("outcome") == "REPLAYED":
                hits.add_metric([c.get("name", ""), c.get("tier", "")], c["value"])
    idempotency = snapshot["idempotency"]
    if _ok(idempotency):
        for state, n in idempotency["by_state"].items():
            records.add_metric([state], n)
    yield hits
    yield records


def outbox_metrics(snapshot: dict[str, Any]) -> Iterator[Metric]:
    pending = GaugeMetricFamily("jobs_outbox_pending",
                                "Outbox rows not yet published, by due now / scheduled later",
                                labels=["when"])
    lag = GaugeMetricFamily("jobs_outbox_lag_seconds",
                            "Age of the oldest due outbox row past its due time")
    outbox = snapshot.get("outbox")
    if outbox is not None and _ok(outbox):
        pending.add_metric(["due"], outbox["due"])
        pending.add_metric(["scheduled"], outbox["scheduled"])
        lag.add_metric([], outbox["lag_seconds"])
    yield pending
    yield lag


def beat_metrics(snapshot: dict[str, Any]) -> Iterator[Metric]:
    """Whether a beat process holds the leader lock: 0 means periodic work has stopped."""
    leader = GaugeMetricFamily("jobs_beat_leader",
                               "1 when a beat process holds the leader lock, 0 when none does")
    section = snapshot.get("beat_leader")
    if section is not None and _ok(section):
        leader.add_metric([], 0.0 if section.get("leader") is None else 1.0)
    yield leader


def registry_for(app: Celery) -> CollectorRegistry:
    """A registry with the shared-state collector and, in multiprocess mode, the workers' files."""
    registry = CollectorRegistry()
    registry.register(SharedStateCollector(app))
    path = multiprocess_dir()
    if path:
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry, path=path)
    return registry


def serve(app: Celery, *, address: str = DEFAULT_ADDRESS, port: int = DEFAULT_PORT) -> Any:
    """Start prometheus-client's HTTP server for `app` in a thread; returns (server, thread)."""
    from prometheus_client import start_http_server

    return start_http_server(port, addr=address, registry=registry_for(app))
