"""The idempotency records' views: records by state and the oldest open claims; recent
records and one record (`jobs idempotency status/list/show`)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from resilience.idempotency.records import describe, records_for
from resilience.views import Column, Family, Row, Source, View, counted


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


def summary(state: dict[str, Any], *, cache_counted: bool) -> str:
    """`records: N (succeeded n, ...); cached results: ...` of a `describe` dict."""
    counts = ", ".join(f"{name} {n}" for name, n in state["by_state"].items())
    cached = ("not counted (--count-cache)" if not cache_counted
              else "unknown" if state["cached_results"] is None else str(state["cached_results"]))
    return f"records: {state['total']} ({counts}); cached results: {cached}"


CLAIMS = View(
    name="claims", title="open claims (oldest first)", store="database", read=read,
    rows=lambda section: section["holders"],
    columns=(
        Column(header="key", key="key", no_wrap=True),
        Column(header="holder", text=lambda r: r["owner"] or ""),
        Column(header="attempt", key="token"),
        Column(header="held", text=lambda r: f"{r['held_seconds'] or 0:.1f}s"),
        Column(header="alive", text=lambda r: "yes" if r["alive"] else "lapsed"),
    ),
)


def _time(value: datetime | None) -> str:
    return "" if value is None else value.isoformat(timespec="seconds")


def recent(source: Source, *, limit: int = 20, task_name: str | None = None,
           state: str | None = None) -> list[Row]:
    """The most recently updated records, newest first."""
    return [{"task": record.task_name, "key": record.key, "state": record.state,
             "attempt": record.attempt, "task_id": record.task_id or "",
             "updated": _time(record.updated_at), "expires": _time(record.expires_at)}
            for record in records_for(source.stores).recent(limit=limit, task_name=task_name,
                                                           state=state)]


RECENT = View(
    name="records", title="idempotency records (newest first)", store="database", read=recent,
    columns=(Column(header="task", key="task", no_wrap=True),
             Column(header="key", key="key", no_wrap=True),
             *(Column(header=header, key=key) for header, key in (
                 ("state", "state"), ("attempt", "attempt"), ("task id", "task_id"),
                 ("updated", "updated"), ("expires", "expires")))),
)


def record(source: Source, task_name: str, key: str) -> list[Row] | None:
    """One record as (field, value) rows, or None when there is none."""
    found = records_for(source.stores).find(task_name, key)
    if found is None:
        return None
    return [{"field": field, "value": value} for field, value in (
        ("state", found.state),
        ("attempt", str(found.attempt)),
        ("task id", found.task_id or ""),
        ("fingerprint", found.fingerprint),
        ("lease owner", found.lease_owner or ""),
        ("lease expires", _time(found.lease_expires_at)),
        ("created", _time(found.created_at)),
        ("updated", _time(found.updated_at)),
        ("expires", _time(found.expires_at)),
        ("result", "" if found.result is None else json.dumps(found.result)[:2000]),
        ("error", found.error or ""),
    )]


RECORD = View(
    name="record", title="record", store="database", read=lambda _: [], headers=False,
    columns=(Column(header="field", key="field"), Column(header="value", key="value")),
)
