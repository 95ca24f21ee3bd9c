"""`jobs dead-letters`: inspect the dead-letter place and requeue entries."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

cli = typer.Typer(help="Jobs given up on: list, show, requeue.", no_args_is_help=True)
console = Console()


def _engine() -> Engine:
    from jobs import app
    from resilience.stores import stores_for

    return stores_for(app).engine()


@cli.command("list")
def list_command(
    limit: Annotated[int, typer.Option(help="Newest entries to show.")] = 50,
    task: Annotated[str | None, typer.Option(help="Only this task name.")] = None,
    pending: Annotated[bool, typer.Option(help="Only entries not requeued yet.")] = False,
) -> None:
    """The newest dead letters with their reason."""
    from resilience.deadletter.place import list_entries

    entries = list_entries(_engine(), limit=limit, task_name=task, pending_only=pending)
    view = Table(title=f"dead letters ({len(entries)})")
    for column in ("id", "created", "task", "guard", "attempts", "reason", "requeued"):
        view.add_column(column, no_wrap=column in ("name", "state", "id", "task"))
    for entry in entries:
        view.add_row(
            str(entry.id),
            entry.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            entry.task_name,
            entry.guard,
            str(entry.attempts),
            entry.reason,
            entry.requeued_task_id or "",
        )
    console.print(view)


@cli.command("show")
def show_command(entry_id: Annotated[int, typer.Argument(help="Dead-letter id.")]) -> None:
    """Everything recorded about one dead letter (arguments, error, reason)."""
    from dataclasses import asdict

    from resilience.deadletter.place import get

    entry = asdict(get(_engine(), entry_id))
    console.print_json(json.dumps(entry, default=str))


@cli.command("requeue")
def requeue_command(entry_id: Annotated[int, typer.Argument(help="Dead-letter id.")]) -> None:
    """Publish the task again with its original arguments (once per entry)."""
    from jobs import app
    from resilience.deadletter.place import requeue

    app.loader.import_default_modules()
    task_id = requeue(_engine(), app, entry_id)
    console.print(f"dead letter {entry_id} requeued as task {task_id}")
