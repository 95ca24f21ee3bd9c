"""The batches' view: the newest batches, members per final state, complete or not."""

from __future__ import annotations

from resilience.batches import recent
from resilience.views import Column, Row, Source, View

#: Newest batches the view lists (`jobs batches list` shows more).
SHOWN = 10


def read(source: Source) -> list[Row]:
    """The newest batches, newest first (`resilience.batches.recent`: one statement)."""
    return [
        {"id": summary.id, "description": summary.description, "total": summary.total,
         "pending": summary.pending,
         "tallies": {state: count for state, count in summary.tallies.items() if count},
         "created_at": summary.created_at.isoformat(timespec="seconds"),
         "completed_at": (summary.completed_at.isoformat(timespec="seconds")
                          if summary.completed_at else None)}
        for summary in recent(source.stores, limit=SHOWN)
    ]


VIEW = View(
    name="batches", title="batches", store="database", read=read,
    row_id=lambda r: f"batch-{r['id']}",
    columns=(
        Column(header="batch", key="id"),
        Column(header="description", text=lambda r: r["description"] or ""),
        Column(header="total", key="total", justify="right"),
        Column(header="pending", key="pending", justify="right"),
        Column(header="final states", text=lambda r: " ".join(
            f"{state}={count}" for state, count in r["tallies"].items() if state != "pending")),
        Column(header="completed", text=lambda r: r["completed_at"] or "-"),
    ),
)
