"""Fleet-wide decision counters in Redis: every rejection, deferral, shed and trip is counted.

One Redis hash holds every counter; a field is the counter's labels in a fixed order
(`outcome=SHED|tier=optional|guard=deadline|name=`), so `jobs status`, the web view and the
Prometheus exporter read them all with one HGETALL. Counting never fails a task: a Redis
error is logged and dropped, because a lost increment is cheaper than a lost job.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from resilience import flushing
from resilience.outcomes import counted
from resilience.stores import stores_for

if TYPE_CHECKING:
    import redis

logger = logging.getLogger("resilience.counters")

COUNTERS_KEY = "resilience:counters"
LABELS = ("outcome", "tier", "guard", "name")


def field_for(**labels: Any) -> str:
    """The hash field of a counter; unknown label names are an error (typos split counts)."""
    unknown = set(labels) - set(LABELS)
    if unknown:
        raise ValueError(f"unknown counter labels {sorted(unknown)}; use {LABELS}")
    return "|".join(f"{label}={labels.get(label) or ''}" for label in LABELS)


def parse_field(field: str) -> dict[str, str]:
    """Labels of a counter field (the last, `name`, may hold a `|`: a workflow's name)."""
    return dict(part.split("=", 1) for part in field.split("|", len(LABELS) - 1))


def count(client: redis.Redis | MemoryCounters, amount: int = 1, **labels: Any) -> None:
    """Add `amount` to the counter with `labels` (outcome, tier, guard, name)."""
    try:
        client.hincrby(COUNTERS_KEY, field_for(**labels), amount)
    except Exception as exc:  # noqa: BLE001 - counting must never fail the job
        logger.warning("counter not recorded (%s): %s", labels, exc)


class MemoryCounters:
    """The counters' hash in process memory (`resilience.stores.MemoryStores`): the two
    hash commands `count` and `read_all` send, under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hashes: dict[str, dict[str, int]] = {}

    def hincrby(self, key: str, field: str, amount: int = 1) -> int:
        with self._lock:
            fields = self._hashes.setdefault(key, {})
            fields[field] = fields.get(field, 0) + amount
            return fields[field]

    def hgetall(self, key: str) -> dict[str, str]:
        with self._lock:
            return {field: str(value) for field, value in self._hashes.get(key, {}).items()}


def counters_client(app: Any) -> redis.Redis | MemoryCounters:
    """Where `app`'s counters live: its shared Redis, or memory with `MemoryStores`.

    Raises:
        ConfigurationError: the app has no stores (never initialised).
    """
    return stores_for(app).backend("counters", lambda stores: stores.redis(),
                                   memory=MemoryCounters)


def read_all(client: redis.Redis | MemoryCounters) -> list[tuple[dict[str, str], int]]:
    """Every counter as (labels, value)."""
    values = client.hgetall(COUNTERS_KEY)
    return [(parse_field(field), int(value)) for field, value in values.items()]


def count_outcome(app: Any, outcome: str, *, guard: str, tier: str | None = None,
                  name: str | None = None, amount: int = 1, reason: str | None = None,
                  retry_after_seconds: float | None = None) -> None:
    """Count one guard decision fleet-wide in the app's shared Redis; never raises.

    Execution guards reach it through `call.count`; enqueue guards and services call it.
    A missing store or a Redis error is logged and dropped (a lost count beats a lost job). The
    decision is also a span event when tracing records (`resilience.outcomes.counted`);
    `reason` and `retry_after_seconds` go only there (a guard that raises `Stop` need not
    pass them: the Stop carries them).
    """
    counted(outcome, guard=guard, tier=tier, name=name, reason=reason,
            retry_after_seconds=retry_after_seconds)

    try:
        client = counters_client(app)
    except Exception as exc:  # noqa: BLE001 - no stores configured: nothing to count into
        logger.warning("cannot count %s: %s", outcome, exc)
        return
    count(client, amount, outcome=outcome, tier=tier, guard=guard, name=name)


#: How long `count_later` holds a process's counts before one write sends them.
LATER_INTERVAL_SECONDS = 0.5


class _LaterCounts:
    """Counts a process holds for `count_later` (a `resilience.flushing` aggregate): one
    HINCRBY per counter every `LATER_INTERVAL_SECONDS` instead of one per event; a
    SIGKILLed process loses at most that interval's counts."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.pending = flushing.Pending()

    def flush(self, now: float, *, force: bool = False) -> bool:
        if not self.pending:
            return False
        if not (force or self.pending.due(now)):
            return True
        counts = self.pending.take()
        try:
            client = counters_client(self.app)
        except Exception as exc:  # noqa: BLE001 - no stores any more: nothing to count into
            logger.warning("counters not recorded: %s", exc)
            return False
        for labels, amount in counts.items():
            count(client, amount, **dict(zip(LABELS, labels, strict=True)))  # type: ignore[arg-type]
        return False


def count_later(app: Any, outcome: str, *, guard: str, tier: str | None = None,
                name: str | None = None) -> None:
    """`count_outcome` for events frequent enough that a round trip each shows (a
    workflow's end, counted by the worker): the span event now, the fleet-wide count
    within `LATER_INTERVAL_SECONDS`, with the process's other counts. Never raises."""
    counted(outcome, guard=guard, tier=tier, name=name)
    flushing.member(("counters", id(app)), lambda: _LaterCounts(app)).pending.add(
        (outcome, tier, guard, name), time.monotonic(), LATER_INTERVAL_SECONDS)
