"""`jobs cancel ID` / `jobs cancel --task NAME --key KEY` (registered by jobs.cli) and
`jobs cancellations`: cancel jobs so the cancel sticks.

The cancellation is written to PostgreSQL and to the Redis copy every worker checks before a
job starts (`resilience.cancel`), and Celery's own `revoke` is sent too so running workers
drop the message at once. A job cancelled by id that has not started has its result stored
as CANCELLED first, so the revoke never makes it REVOKED (`resilience.cancel.results`).
`jobs cancellations` lists, withdraws and restores them.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from jobs.admin.status import show
from resilience.cancel import store_cancelled
from resilience.cancel.view import VIEW, read
from resilience.errors import StorageError

if TYPE_CHECKING:
    from celery import Celery

    from resilience.cancel import Cancellations

console = Console()
errors = Console(stderr=True)
logger = logging.getLogger("jobs.admin.cancel")


def _cancellations(app: Celery) -> Cancellations:
    # A bad environment must reach main()'s one-line error, not fail every command's import.
    # lazy: jobs.platform reads the settings when imported
    from jobs.platform import cancellations

    return cancellations(app)


def cancel_job(app: Celery, task_id: str, *, reason: str) -> bool:
    """Cancel job `task_id`: the record and mark, its CANCELLED result if no worker started
    it, then Celery's `revoke` (running workers drop it now; the record outlives them).

    Returns:
        True when its result was stored as CANCELLED now (it had not started).

    Raises:
        StorageError: the cancellation could not be recorded.
    """
    _cancellations(app).cancel_job(task_id, reason=reason)
    try:
        stored = store_cancelled(app, task_id, reason=reason)
    except StorageError as error:
        # The mark still stops the job; only its result may read REVOKED before CANCELLED.
        logger.warning("%s", error)
        stored = False
    app.control.revoke(task_id)
    return stored

def cancel(
    task_id: Annotated[str | None, typer.Argument(help="the job's task id")] = None,
    task: Annotated[str | None, typer.Option("--task", help="task name (with --key)")] = None,
    key: Annotated[str | None, typer.Option(
        "--key", help="the task's cancel_key value, e.g. an order id")] = None,
    reason: Annotated[str, typer.Option(help="shown as the job's outcome")] = (
        "cancelled by an operator"),
) -> None:
    """Cancel a job (ID), or every job of --task NAME whose cancel_key is KEY: it will not
    start on any worker, after restarts and redeliveries too."""
    from jobs import app  # lazy: builds the Celery app; `jobs --help` must not

    if (task_id is None) == (task is None and key is None) or (task is None) != (key is None):
        errors.print("[red]give a task id (jobs cancel ID) or both --task NAME and --key KEY"
                     "[/red]")
        raise typer.Exit(2)
    app.loader.import_default_modules()
    store = _cancellations(app)
    if task_id is not None:
        cancel_job(app, task_id, reason=reason)
        console.print(f"cancelled job {task_id}: it will not start on any worker")
        return
    assert task is not None and key is not None
    known = app.tasks.get(task)
    if known is not None and not getattr(known, "cancel_key", None):
        errors.print(f"[red]task {task!r} declares no cancel_key, so no job of it has a key; "
                     "cancel by task id, or add cancel_key=\"{...}\" to its @app.task[/red]")
        raise typer.Exit(2)
    store.cancel_key(task, key, reason=reason)
    console.print(f"cancelled the jobs of {task} with key {key!r}")


listing = typer.Typer(help="Live cancellations: list, withdraw one, restore the Redis copies.",
                      no_args_is_help=True)


@listing.command("list")
def list_command(
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable")] = False,
) -> None:
    """Live cancellations, newest first (the newest 1,000)."""
    show(VIEW, as_json=as_json, read=partial(read, limit=1000))


@listing.command("withdraw")
def withdraw_command(
    target: Annotated[str, typer.Argument(help="id:<task id> or key:<task>:<key>")],
) -> None:
    """Withdraw a cancellation: jobs it has not stopped yet run again."""
    from jobs import app  # lazy: builds the Celery app; `jobs --help` must not

    done = _cancellations(app).uncancel(target)
    console.print(f"withdrawn {target}" if done else f"{target} was not cancelled")


@listing.command("restore")
def restore_command() -> None:
    """Write the Redis copy of every live cancellation again (after a Redis flush)."""
    from jobs import app  # lazy: builds the Celery app; `jobs --help` must not

    console.print(f"restored {_cancellations(app).restore()} cancellation(s)")
