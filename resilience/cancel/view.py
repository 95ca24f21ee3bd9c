"""The cancellations' view: live cancellations, newest first."""

from __future__ import annotations

from resilience.cancel.backends.redis import RedisCancelBackend
from resilience.cancel.tombstones import Cancellations
from resilience.views import Column, Row, Source, View

#: Newest live cancellations the view lists (`jobs cancellations list` shows them all).
SHOWN = 50


def read(source: Source, *, limit: int = SHOWN) -> list[Row]:
    """Live cancellations, newest first, at most `limit` (one statement)."""
    stores = source.stores
    cancellations = Cancellations(stores.engine(), RedisCancelBackend(stores.redis))
    return [
        {"target": entry.target, "task_name": entry.task_name, "task_id": entry.task_id,
         "key": entry.key, "reason": entry.reason,
         "created_at": entry.created_at.isoformat(timespec="seconds"),
         "expires_at": entry.expires_at.isoformat(timespec="seconds")}
        for entry in cancellations.describe(limit=limit)
    ]


VIEW = View(
    name="cancellations", title="cancellations", store="database", read=read, count=len,
    empty="no live cancellations", row_data=lambda r: {"target": r["target"]},
    columns=(
        Column(header="target", key="target"),
        Column(header="reason", key="reason"),
        Column(header="since", key="created_at"),
        Column(header="until", key="expires_at"),
    ),
)
