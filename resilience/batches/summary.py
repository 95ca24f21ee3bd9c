"""A batch as operators and callbacks see it, read from the workflow tables: members are
steps of kind "step", callbacks of kind "callback"; tallies count the members' states, and
the batch is complete when no member is live.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import text

from resilience.batches.errors import BatchNotFound
from resilience.connections import wrap_store_errors
from resilience.workflows.canvas import FINAL_STEP_STATES, SUCCESS_STEP_STATES
from resilience.workflows.models import STEPS_TABLE, WORKFLOWS_TABLE

if TYPE_CHECKING:
    from resilience.stores import Stores
    from resilience.workflows.eager import EagerWorkflowBackend

SUCCESS = "success"
COMPLETE = "complete"
#: The callback released when every member succeeded, and the one when every member is final.
RELEASES = {SUCCESS: "succeeded", COMPLETE: "final"}


@dataclass(frozen=True)
class BatchSummary:
    """A batch as operators and callbacks see it.

    Args:
        tallies: members per final state, every state present (zeros included).
        success_task_id / complete_task_id: the callback jobs, once written (None before,
            and for a callback the batch does not have or, for on_success, did not earn).
    """

    id: str
    description: str | None
    total: int
    pending: int
    tallies: dict[str, int]
    created_at: dt.datetime
    completed_at: dt.datetime | None
    on_success: dict[str, Any] | None = None
    on_complete: dict[str, Any] | None = None
    success_task_id: str | None = None
    complete_task_id: str | None = None

    @property
    def complete(self) -> bool:
        """Every member has a final state."""
        return self.completed_at is not None

    @property
    def succeeded(self) -> bool:
        """Complete, and every member succeeded (or was replayed)."""
        ok = sum(self.tallies.get(state, 0) for state in SUCCESS_STEP_STATES)
        return self.complete and ok == self.total

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form (`jobs batches show --json`)."""
        return {
            "id": self.id, "description": self.description, "total": self.total,
            "pending": self.pending, "tallies": dict(self.tallies),
            "created_at": self.created_at.isoformat(),
            "completed_at": self.completed_at.isoformat() if self.completed_at else None,
            "succeeded": self.succeeded,
            "callbacks": {SUCCESS: _callback(self.on_success, self.success_task_id),
                          COMPLETE: _callback(self.on_complete, self.complete_task_id)}}


def _callback(signature: dict[str, Any] | None, task_id: str | None) -> dict[str, Any] | None:
    if signature is None:
        return None
    return {"task": signature.get("task"), "fired": task_id is not None, "task_id": task_id}


# One row per batch: the members' count, live count, latest finish and tallies, and the
# callback steps (a workflow with the `batch` document is a batch).
_COLUMNS = f"""
w.id, w.name, w.created_at, m.total, m.pending, m.last_finished,
COALESCE((SELECT jsonb_object_agg(t.state, t.n) FROM (
    SELECT s.state, count(*) AS n FROM {STEPS_TABLE} s
    WHERE s.workflow_id = w.id AND s.kind = 'step' GROUP BY s.state
) t), CAST('{{}}' AS JSONB)) AS tallies,
(SELECT jsonb_agg(jsonb_build_object('release', c.release, 'task', c.task_name,
                                     'task_id', c.task_id, 'state', c.state,
                                     'signature', c.signature))
 FROM {STEPS_TABLE} c WHERE c.workflow_id = w.id AND c.kind = 'callback') AS callbacks
FROM {WORKFLOWS_TABLE} w
CROSS JOIN LATERAL (
    SELECT count(*) AS total,
           count(*) FILTER (WHERE s.state IN ('pending', 'queued')) AS pending,
           max(s.finished_at) AS last_finished
    FROM {STEPS_TABLE} s WHERE s.workflow_id = w.id AND s.kind = 'step'
) m
WHERE w.canvas -> 'batch' IS NOT NULL
"""

_SUMMARY = text(f"SELECT {_COLUMNS} AND w.id = :id")

_RECENT = text(f"""
SELECT {_COLUMNS} AND (NOT :incomplete_only OR EXISTS (
    SELECT 1 FROM {STEPS_TABLE} s WHERE s.workflow_id = w.id AND s.kind = 'step'
      AND s.state IN ('pending', 'queued')))
ORDER BY w.created_at DESC, w.id LIMIT :limit
""")


def callback_fields(callbacks: list[dict[str, Any]]) -> dict[str, Any]:
    """`BatchSummary`'s callback fields from the callback steps (release, task, task_id,
    state, signature): a callback's task id once it was released (not pending or skipped)."""
    fields: dict[str, Any] = {}
    for kind, release in RELEASES.items():
        found = next((c for c in callbacks if c["release"] == release), None)
        fields[f"on_{kind}"] = None if found is None else {"task": found["task"],
                                                           **found["signature"]}
        fields[f"{kind}_task_id"] = None if found is None or found["state"] in (
            "pending", "skipped") else found["task_id"]
    return fields


def _summary(row: Any) -> BatchSummary:
    counted = dict(row.tallies or {})
    pending = int(row.pending)
    return BatchSummary(
        id=row.id, description=row.name, total=int(row.total), pending=pending,
        tallies={state: int(counted.get(state, 0)) for state in FINAL_STEP_STATES},
        created_at=row.created_at,
        completed_at=(row.last_finished or row.created_at) if pending == 0 else None,
        **callback_fields(row.callbacks or []))


def read_summary(stores: Stores, batch_id: str) -> BatchSummary:
    """One batch. Raises `BatchNotFound`, `StorageError`."""
    with wrap_store_errors("batches: read", batch=batch_id), \
            stores.engine().connect() as connection:
        row = connection.execute(_SUMMARY, {"id": batch_id}).first()
    if row is None:
        raise BatchNotFound(f"no batch {batch_id!r}", batch_id=batch_id)
    return _summary(row)


def read_recent(stores: Stores, *, limit: int = 50,
                incomplete_only: bool = False) -> list[BatchSummary]:
    """The newest batches, newest first. Raises `StorageError`."""
    with wrap_store_errors("batches: read recent"), stores.engine().connect() as connection:
        rows = connection.execute(_RECENT, {"limit": int(limit),
                                            "incomplete_only": bool(incomplete_only)}).all()
    return [_summary(row) for row in rows]


def eager_summary(backend: EagerWorkflowBackend, batch_id: str) -> BatchSummary:
    """A batch run in process (`resilience.workflows.eager`), as `read_summary` gives one
    from the workflow tables.

    Raises:
        BatchNotFound: no such batch ran here (never committed, or rolled back).
    """
    run = backend.find(batch_id)
    if run is None or "batch" not in run.canvas:
        raise BatchNotFound(f"no batch {batch_id!r}", batch_id=batch_id)
    members = [step for step in run.steps if step.spec.kind == "step"]
    callbacks = [{"release": step.spec.release, "task": step.spec.task_name,
                  "task_id": step.spec.task_id, "state": step.state.value,
                  "signature": step.spec.signature()}
                 for step in run.steps if step.spec.kind == "callback"]
    pending = sum(1 for step in members if step.live)
    finished = [step.finished_at for step in members if step.finished_at is not None]
    return BatchSummary(
        id=run.id, description=run.name, total=len(members), pending=pending,
        tallies={state: sum(1 for step in members if step.state.value == state)
                 for state in FINAL_STEP_STATES},
        created_at=run.created_at,
        completed_at=(max(finished, default=run.created_at)) if pending == 0 else None,
        **callback_fields(callbacks))
