"""The cancellations' view: live cancellations, newest first, and the cancel action."""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import TYPE_CHECKING

from resilience.cancel.backends.redis import RedisCancelBackend
from resilience.cancel.results import store_cancelled
from resilience.cancel.tombstones import DEFAULT_TTL_SECONDS, Cancellations
from resilience.errors import StorageError
from resilience.stores import stores_for
from resilience.views import PAGE_REASON, Action, ActionRefused, Column, Form, Input, View

if TYPE_CHECKING:
    from celery import Celery

    from resilience.views import Row, Source, Submitted

logger = logging.getLogger("resilience.cancel")

#: Newest live cancellations the view lists (`jobs cancellations list` shows them all).
SHOWN = 50


def cancellations(app: Celery) -> Cancellations:
    """The operator's side of cancellation for `app`: the PostgreSQL record and the marks,
    lasting longer than any delivery of the job (docs/operations.md)."""
    stores = stores_for(app)
    options = app.conf.get("broker_transport_options") or {}
    longest = (float(options.get("visibility_timeout") or 0)
               + float(app.conf.get("resilience_max_countdown_seconds") or 0))
    return Cancellations(stores.engine(), RedisCancelBackend(stores.redis),
                         ttl_seconds=max(DEFAULT_TTL_SECONDS, longest))


def cancel_job(app: Celery, task_id: str, *, reason: str) -> bool:
    """Cancel job `task_id`: the record and mark, its CANCELLED result if no worker started
    it, then Celery's `revoke` (running workers drop it now; the record outlives them).

    Returns:
        True when its result was stored as CANCELLED now (it had not started).

    Raises:
        StorageError: the cancellation could not be recorded.
    """
    cancellations(app).cancel_job(task_id, reason=reason)
    try:
        stored = store_cancelled(app, task_id, reason=reason)
    except StorageError as error:
        # The mark still stops the job; only its result may read REVOKED before CANCELLED.
        logger.warning("%s", error)
        stored = False
    app.control.revoke(task_id)
    return stored


def cancel(source: Source, form: Submitted) -> str:
    """`jobs cancel ID` / `jobs cancel --task NAME --key KEY` (record, mark, and `revoke`)."""
    task_id, task, key = form.get("task_id", ""), form.get("task", ""), form.get("key", "")
    reason = form.get("reason") or f"cancelled {PAGE_REASON}"
    if task_id and not (task or key):
        cancel_job(source.app, task_id, reason=reason)
        return f"cancelled job {task_id}: it will not start on any worker"
    if not task_id and task and key:
        known = source.app.tasks.get(task)
        if known is not None and not getattr(known, "cancel_key", None):
            raise ActionRefused(f"task {task!r} declares no cancel_key, so no job of it has a "
                                "key; cancel by task id")
        cancellations(source.app).cancel_key(task, key, reason=reason)
        return f"cancelled the jobs of {task} with key {key!r}"
    raise ActionRefused("give a task id, or both a task name and a key")


def read(source: Source, *, limit: int = SHOWN) -> list[Row]:
    """Live cancellations, newest first, at most `limit` (one statement)."""
    return [{**asdict(entry), "created_at": entry.created_at.isoformat(timespec="seconds"),
             "expires_at": entry.expires_at.isoformat(timespec="seconds")}
            for entry in cancellations(source.app).describe(limit=limit)]


VIEW = View(
    name="cancellations", title="cancellations", store="database", read=read, count=len,
    empty="no live cancellations", row_data=lambda r: {"target": r["target"]},
    columns=(
        Column(header="target", key="target"),
        Column(header="reason", key="reason"),
        Column(header="since", key="created_at"),
        Column(header="until", key="expires_at"),
    ),
    actions=(Action(name="Cancel", web="cancel", run=cancel, style="danger", forms=(
        Form(id="cancel-form", title="Cancel", button="Cancel job", inputs=(
            Input(name="task_id", hint="task id", width=8), Input(name="reason", hint="reason"))),
        Form(id="cancel-key-form", button="Cancel by key", inputs=(
            Input(name="task", hint="task name", suggest="tasks", required=True, width=6),
            Input(name="key", hint="cancel key", required=True, width=6))),
    )),),
)
