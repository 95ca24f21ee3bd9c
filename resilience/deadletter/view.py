"""The dead letters' view: the newest jobs given up on, with why, and a requeue per row."""

from __future__ import annotations

from typing import TYPE_CHECKING

from resilience.deadletter import place
from resilience.deadletter.bulk import Selection, parse_since, requeue_many
from resilience.views import Action, ActionRefused, Column, Form, Input, View

if TYPE_CHECKING:
    from resilience.views import Row, Source, Submitted

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
        for entry in place.list_entries(source.stores.engine(), limit=limit,
                                        task_name=task_name, pending_only=pending_only)
    ]


def requeue_one(source: Source, form: Submitted) -> str:
    """`jobs dead-letters requeue ID`."""
    text = form.get("id", "")
    if not text.isdigit():
        raise ActionRefused(f"a dead-letter id is a number, got {text!r}")
    task_id = place.requeue(source.stores.engine(), source.app, int(text))
    return f"dead letter {text} requeued as task {task_id}"


def requeue_matching(source: Source, form: Submitted) -> str:
    """`jobs dead-letters requeue --task NAME --reason TEXT [--since WHEN]`: once per row."""
    since = form.get("since")
    selection = Selection(task_name=form.get("task") or None,
                          reason=form.get("reason") or None,
                          since=parse_since(since) if since else None)
    if selection.empty:
        raise ActionRefused("name the dead letters to requeue: a task, a reason text or a since")
    report = requeue_many(source.stores.engine(), source.app, selection)
    message = (f"requeued {len(report.requeued)} dead letters (written to the outbox; the "
               "relay publishes them)")
    if report.skipped:
        reasons = "; ".join(f"{len(ids)} {why}" for why, ids in sorted(report.skipped.items()))
        message += f"; skipped {report.skipped_count}, left pending: {reasons}"
    return message


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
    actions=(
        Action(name="Requeue", web="requeue", run=requeue_one,
               statuses={place.DeadLetterNotFound: 404, place.DeadLetterNotRunnable: 409},
               fields=lambda r: {"id": str(r["id"])}, forms=(Form(
                   id="requeue-form", title="Requeue dead letters", button="Requeue",
                   inputs=(Input(name="id", hint="dead-letter id", required=True,
                                 numeric=True, width=8),)),)),
        Action(name="Requeue all matching", web="requeue-bulk", run=requeue_matching,
               forms=(Form(id="requeue-bulk-form", button="Requeue all matching", inputs=(
                   Input(name="task", hint="task name", suggest="tasks", width=5),
                   Input(name="reason", hint="reason contains"),
                   Input(name="since", hint="since 2h", width=3))),)),
    ),
)
