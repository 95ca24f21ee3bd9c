"""The dead letters' view: the newest jobs given up on, with why, and a requeue per row."""

from __future__ import annotations

from resilience.deadletter.place import list_entries, requeue
from resilience.views import Action, Column, Row, Source, View

#: Pending dead letters the status views list, newest first (`jobs dead-letters list`: more).
SHOWN = 20


def read(source: Source, *, limit: int = SHOWN, task_name: str | None = None,
         pending_only: bool = True) -> list[Row]:
    """The newest dead letters (pending ones by default): one statement."""
    return [
        {"id": entry.id, "task_name": entry.task_name, "guard": entry.guard,
         "reason": entry.reason, "attempts": entry.attempts,
         "created_at": entry.created_at.isoformat(timespec="seconds"),
         "requeued_task_id": entry.requeued_task_id}
        for entry in list_entries(source.stores.engine(), limit=limit, task_name=task_name,
                                  pending_only=pending_only)
    ]


VIEW = View(
    name="dead_letters", title="dead letters pending", store="database", read=read,
    count=len, empty="no dead letters pending", row_id=lambda r: f"dead-letter-{r['id']}",
    columns=(
        Column(header="id", key="id"),
        Column(header="dead-lettered", key="created_at"),
        Column(header="task", key="task_name"),
        Column(header="guard", key="guard"),
        Column(header="attempts", key="attempts"),
        Column(header="reason", key="reason"),
        Column(header="requeued", text=lambda r: r["requeued_task_id"] or ""),
    ),
    actions=(Action(name="Requeue", verb="dead-letters requeue", web="requeue", call=requeue,
                    fields=lambda r: {"id": str(r["id"])}),),
)
