"""Prometheus metrics: `SharedStateCollector` reads the shared state (broker, Redis counters,
the views' families) at scrape time, so no prefork child holds a number the others miss;
the histograms are observed in the worker processes in prometheus-client's multiprocess
mode (`PROMETHEUS_MULTIPROC_DIR`). `jobs metrics` serves both. See docs/observe.md.
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

#: How long a singleton / exclusive lock was held, observed in the worker process that held
#: it; in no registry: `MultiProcessCollector` exports the mmap files. +Inf: the client's.
LOCK_HOLD_SECONDS = Histogram(
    "jobs_lock_hold_seconds",
    "Seconds a task held its singleton/exclusive lock (acquire to release)",
    ["kind", "task"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
    registry=None,
)

#: How long a durable workflow step took (its guard's start to its recorded outcome), as
#: LOCK_HOLD_SECONDS (`resilience.workflows.observe_steps`, connected in worker.py).
WORKFLOW_STEP_SECONDS = Histogram(
    "jobs_workflow_step_seconds",
    "Seconds a durable workflow step took (guard start to its recorded outcome)",
    ["task", "state"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
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
        failed = set(snapshot["errors"])
        try:
            ages = oldest_ages(self.app, TIERS)
        except StorageError as exc:
            logger.warning("oldest message ages not read: %s", exc)
            ages = {}
            failed.add("queue_age")
        yield from queue_metrics(snapshot["tiers"], ages)
        yield from counter_metrics(snapshot)
        for view in VIEWS:
            yield from view_metrics(view, snapshot)
        up = GaugeMetricFamily(
            "jobs_observe_section_up",
            "1 when the section of the platform state could be read at this scrape",
            labels=["section"])
        for name in ("counters", "queue_depth", *(v.name for v in VIEWS if v.metrics),
                     "queue_age"):
            up.add_metric([name], 0.0 if name in failed else 1.0)
        yield up


def view_metrics(view: View, snapshot: dict[str, Any]) -> Iterator[Metric]:
    """The families `view` declares, sampled from its section (none when it was not read)."""
    section = snapshot[view.name]
    for family in view.metrics:
        kind = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
        metric = kind(family.name, family.help, labels=list(family.labels))
        if family.needs_section is False or missing(section) is None:
            for labels, value in family.samples(section, snapshot):
                metric.add_metric(list(labels), value)
        yield metric


def queue_metrics(tiers: Any, ages: dict[str, float | None]) -> Iterator[Metric]:
    """Each tier's queue depth (absent when the broker was not read), bulkhead limit, and
    the age of its oldest waiting message (backlog.py)."""
    depth = GaugeMetricFamily("jobs_queue_depth", "Messages waiting in the tier queue",
                              labels=["tier"])
    limit = GaugeMetricFamily("jobs_queue_max_depth", "The tier's bulkhead limit",
                              labels=["tier"])
    age = GaugeMetricFamily(
        "jobs_queue_oldest_age_seconds",
        "Seconds since the oldest message waiting in the tier queue was published (0: empty)",
        labels=["tier"])
    for tier, row in ({} if missing(tiers) else tiers).items():
        limit.add_metric([tier], row["max_queue_depth"])
        if row["depth"] is not None:
            depth.add_metric([tier], row["depth"])
    for tier, seconds in ages.items():
        if seconds is not None:
            age.add_metric([tier], seconds)
    yield from (depth, limit, age)


def counter_metrics(snapshot: dict[str, Any]) -> Iterator[Metric]:
    """Every guard decision by outcome, tier, guard and name; the consumption watchdog's
    (`reconnect`, `exit`) apart, as stalls."""
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

