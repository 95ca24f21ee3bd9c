"""What a batch's callbacks receive, and the outbox rows that carry them.

A callback is a signature (`report.s("ops")`); it runs as `report(batch, "ops")`, with
`batch` a JSON dict (as a chord's body gets the results first; an immutable signature,
`report.si("ops")`, gets nothing added):

    {"batch_id": "...", "callback": "success" | "complete", "description": "...",
     "total": 2000, "succeeded": true, "tallies": {"succeeded": 1990, "replayed": 10, ...}}

Each callback row is written once (by the transaction that completed the batch). The relay
publishes it at least once; `@idempotent(key=CALLBACK_KEY)` (or no key: the row's
`outbox_id`) makes its effect exactly once.
"""

from __future__ import annotations

import uuid
from typing import Any

from resilience.batches.backends import BatchSummary
from resilience.outbox.backends import NewRow

SUCCESS = "success"
COMPLETE = "complete"
#: Message header of a callback job: "<batch id>:<success|complete>".
CALLBACK_HEADER = "batch_callback"
#: An idempotency key template for a callback whose first parameter is named `batch`:
#: `@idempotent(key=CALLBACK_KEY, transactional=True)`; one key per batch and callback kind.
CALLBACK_KEY = "batch:{batch[batch_id]}:{batch[callback]}"


def callback_argument(summary: BatchSummary, kind: str) -> dict[str, Any]:
    """The first argument of the `kind` callback of a completed batch."""
    return {
        "batch_id": summary.id,
        "callback": kind,
        "description": summary.description,
        "total": summary.total,
        "succeeded": summary.succeeded,
        "tallies": dict(summary.tallies),
    }


def due_callbacks(summary: BatchSummary) -> list[tuple[str, dict[str, Any]]]:
    """The callbacks a completed batch fires: on_complete always, on_success when every
    member succeeded (or was replayed)."""
    due = []
    if summary.on_success is not None and summary.succeeded:
        due.append((SUCCESS, summary.on_success))
    if summary.on_complete is not None:
        due.append((COMPLETE, summary.on_complete))
    return due


def callback_row(summary: BatchSummary, kind: str, signature: dict[str, Any]) -> NewRow:
    """The outbox row of one callback job (its task id fixed here)."""
    options = dict(signature.get("options") or {})
    for name in ("task_id", "countdown", "eta"):
        options.pop(name, None)
    headers = dict(options.pop("headers", None) or {})
    headers[CALLBACK_HEADER] = f"{summary.id}:{kind}"
    options["headers"] = headers
    first = [] if signature.get("immutable") else [callback_argument(summary, kind)]
    return NewRow(
        task_id=str(uuid.uuid4()),
        task_name=str(signature["task"]),
        args=[*first, *list(signature.get("args") or ())],
        kwargs=dict(signature.get("kwargs") or {}),
        options=options,
    )
