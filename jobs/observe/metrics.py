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
from jobs.observe.snapshot import VIEWS, collect
from jobs.tiers import TIERS
from resilience.errors import StorageError
from resilience.views import View, missing

if TYPE_CHECKING:
    from celery import Celery

logger = logging.getLogger("jobs.observe.metrics")

#: The `guard` label of the consumption watchdog's counters (not a guard: exported apart).
WATCHDOG = "watchdog"

DEFAULT_ADDRESS = "127.0.0.1"
DEFAULT_PORT = 9808

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

#: How long a durable workflow step took, from its workflow guard's start to its recorded
#: outcome, observed in the worker process that ran it (`resilience.workflows.observe_steps`,
#: connected in jobs/observe/worker.py); same multiprocess mode as LOCK_HOLD_SECONDS.
WORKFLOW_STEP_SECONDS = Histogram(
    "jobs_workflow_step_seconds",
    "Seconds a durable workflow step took (guard start to its recorded outcome)",
    ["task", "state"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300,
             float("inf")),
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
        snapshot = collect(self.app, active=False)
        ages_read = True
        try:
            ages = oldest_ages(self.app, TIERS)
        except StorageError as exc:
            logger.warning("oldest message ages not read: %s", exc)
            ages, ages_read = {}, False
        yield from queue_metrics(snapshot["tiers"])
        yield from queue_age_metrics(ages)
        yield from counter_metrics(snapshot)
        up = GaugeMetricFamily(
            "jobs_observe_section_up",
            "1 when the section of the platform state could be read at this scrape",
            labels=["section"])
        for name in ("counters", "queue_depth"):
            up.add_metric([name], 0.0 if name in snapshot["errors"] else 1.0)
        for view in VIEWS:
            yield from view_metrics(view, snapshot)
            if view.metrics:
                up.add_metric([view.name], 0.0 if view.name in snapshot["errors"] else 1.0)
        up.add_metric(["queue_age"], 1.0 if ages_read else 0.0)
        yield up


def view_metrics(view: View, snapshot: dict[str, Any]) -> Iterator[Metric]:
    """The metric families `view` declares, with samples from its section of `snapshot`
    (none when the section could not be read)."""
    section = snapshot[view.name]
    for family in view.metrics:
        kind = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
        metric = kind(family.name, family.help, labels=list(family.labels))
        if family.needs_section is False or missing(section) is None:
            for labels, value in family.samples(section, snapshot):
                metric.add_metric(list(labels), value)
        yield metric


def queue_metrics(tiers: Any) -> Iterator[Metric]:
    """Each tier's queue depth (absent when the broker was not read) and bulkhead limit."""
    depth = GaugeMetricFamily("jobs_queue_depth", "Messages waiting in the tier queue",
                              labels=["tier"])
    limit = GaugeMetricFamily("jobs_queue_max_depth", "The tier's bulkhead limit",
                              labels=["tier"])
    for tier, row in ({} if missing(tiers) else tiers).items():
        limit.add_metric([tier], row["max_queue_depth"])
        if row["depth"] is not None:
            depth.add_metric([tier], row["depth"])
    yield depth
    yield limit


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


def counter_metrics(snapshot: dict[str, Any]) -> Iterator[Metric]:
    """Every guard decision by outcome, tier, guard and name; the consumption watchdog's
    (jobs.observe.watchdog: `reconnect` for each stall seen, `exit` when reconnecting did
    not help and the worker exited) apart, as stalls."""
    outcomes = CounterMetricFamily(
        "jobs_guard_outcomes", "Guard decisions fleet-wide, by outcome, tier and guard",
        labels=["outcome", "tier", "guard", "name"])
    stalls = CounterMetricFamily(
        "jobs_worker_stalls",
        "Workers that stopped consuming with a backlog and free slots, by what was done",
        labels=["tier", "action"])
    counters = snapshot["counters"]
    for c in counters if isinstance(counters, list) else []:
        if c.get("guard") == WATCHDOG:
            stalls.add_metric([c.get("tier", ""), c.get("name", "")], c["value"])
        else:
            outcomes.add_metric([c.get("outcome", ""), c.get("tier", ""), c.get("guard", ""),
                                 c.get("name", "")], c["value"])
    yield outcomes
    yield stalls


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
