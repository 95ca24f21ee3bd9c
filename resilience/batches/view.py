"""The batches' views: the newest batches, members per final state, complete or not; one
batch's members and callbacks (`jobs batches list/show`)."""

from __future__ import annotations

from typing import Any

from resilience.batches import describe, recent
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


def listed(source: Source, *, limit: int = 50, incomplete_only: bool = False) -> list[Row]:
    """The newest batches as `BatchSummary.as_dict` gives them, callbacks included."""
    return [summary.as_dict() for summary in recent(source.stores, limit=limit,
                                                    incomplete_only=incomplete_only)]


def _time(text: str | None) -> str:
    """An ISO time as `2026-01-02 03:04:05` ('' for none)."""
    return text[:19].replace("T", " ") if text else ""


def _succeeded(row: Row) -> int:
    return row["tallies"].get("succeeded", 0) + row["tallies"].get("replayed", 0)


def _not_succeeded(row: Row) -> str:
    bad = row["total"] - row["pending"] - _succeeded(row)
    return f"[red]{bad}[/red]" if bad else "0"


LIST = View(
    name="batches", title="batches", store="database", read=listed, count=len,
    columns=(
        Column(header="id", key="id", no_wrap=True),
        Column(header="description", text=lambda r: r["description"] or ""),
        Column(header="created", text=lambda r: _time(r["created_at"]), no_wrap=True),
        Column(header="total", key="total", justify="right"),
        Column(header="pending", key="pending", justify="right"),
        Column(header="succeeded", text=lambda r: str(_succeeded(r)), justify="right"),
        Column(header="not succeeded", text=_not_succeeded, justify="right"),
        Column(header="completed", text=lambda r: _time(r["completed_at"]), no_wrap=True),
        Column(header="callbacks", text=lambda r: ", ".join(
            kind for kind, callback in r["callbacks"].items() if callback and callback["fired"])),
    ),
)


def detail(source: Source, batch_id: str) -> dict[str, Any]:
    """One batch (`BatchSummary.as_dict`) with each written callback's Celery state.

    Raises:
        BatchNotFound: no batch has this id.
    """
    found = describe(source.stores, batch_id).as_dict()
    for callback in found["callbacks"].values():
        if callback is not None:
            callback["state"] = _job_state(source, callback["task_id"])
    return found


def _job_state(source: Source, task_id: str | None) -> str | None:
    """A callback job's Celery state (SUCCESS, RETRY, ...), or None when unknown."""
    if task_id is None:
        return None
    try:
        return str(source.app.AsyncResult(task_id).state)
    except Exception:  # noqa: BLE001 - the result backend is a nicety here
        return None


def status(batch: dict[str, Any]) -> str:
    """One line: `batch ID description  N members, complete|N pending`."""
    done = ("complete, all succeeded" if batch["succeeded"]
            else "complete" if batch["completed_at"] else f"{batch['pending']} pending")
    return (f"batch [bold]{batch['id']}[/bold] {batch['description'] or ''}  "
            f"{batch['total']} members, {done}")


# MEMBERS and CALLBACKS are tables of `detail`'s document (never collected: no read of their own).
MEMBERS = View(
    name="members", title="members", store="database", read=lambda _: {},
    rows=lambda batch: [{"state": "pending", "members": batch["pending"]},
                        *({"state": state, "members": count}
                          for state, count in batch["tallies"].items())],
    columns=(Column(header="state", key="state"),
             Column(header="members", key="members", justify="right")),
)

CALLBACKS = View(
    name="callbacks", title="callbacks", store="database", read=lambda _: {},
    rows=lambda batch: [{"callback": kind, **callback}
                        for kind, callback in batch["callbacks"].items() if callback],
    columns=(Column(header="callback", key="callback"),
             Column(header="task", text=lambda r: str(r["task"])),
             Column(header="written", text=lambda r: "yes" if r["fired"] else "no"),
             Column(header="task id", text=lambda r: r["task_id"] or ""),
             Column(header="state", text=lambda r: r.get("state") or "")),
)
