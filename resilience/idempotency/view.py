"""The idempotency records' view: records by state and the oldest open claims."""

from __future__ import annotations

from typing import Any

from resilience.idempotency.records import describe
from resilience.views import Column, Family, Source, View, counted


def read(source: Source) -> dict[str, Any]:
    """Records by state and the oldest open claims' holders (two statements; the cache is
    not scanned)."""
    return describe(source.stores, holders_limit=20, cache_size=False).as_dict()


VIEW = View(
    name="idempotency", title="idempotency records", store="database", read=read,
    rows=lambda section: [section["by_state"]],
    columns=lambda section: tuple(Column(header=state, justify="right")
                                  for state in section["by_state"]),
    metrics=(
        Family(name="jobs_idempotency_hits", help="Calls answered from a stored result (REPLAYED)",
               kind="counter", labels=("task", "tier"), needs_section=False,
               samples=lambda _, snapshot: (
                   ([c.get("name", ""), c.get("tier", "")], c["value"])
                   for c in counted(snapshot["counters"], ["idempotency"])
                   if c.get("outcome") == "REPLAYED")),
        Family(name="jobs_idempotency_records", help="Idempotency records by state",
               labels=("state",),
               samples=lambda section, _: (([state], n)
                                           for state, n in section["by_state"].items())),
    ),
)
