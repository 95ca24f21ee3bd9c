"""`jobs batches`: batches and their members' final states (see docs/batches.md).

    jobs batches list [--limit N] [--incomplete] [--json]   newest batches, one line each
    jobs batches show ID [--json]                           tallies per state, callbacks
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from resilience.batches import describe, recent
from resilience.stores import stores_for

cli = typer.Typer(help="Batches: members' final states and callbacks.", no_args_is_help=True)
console = Console()


def _stores() -> Any:
    # lazy: `jobs.app` builds the Celery app on first access; `jobs --help` must not
    from jobs import app

    return stores_for(app)


def _callback_state(task_id: str | None) -> str | None:
    """The callback job's Celery state (SUCCESS, RETRY, ...), or None when unknown."""
    if task_id is None:
        return None
    # lazy: `jobs.app` builds the Celery app on first access; `jobs --help` must not
    from jobs import app

    try:
        return str(app.AsyncResult(task_id).state)
    except Exception:  # noqa: BLE001 - the result backend is a nicety here
        return None


@cli.command("list")
def list_command(
    limit: Annotated[int, typer.Option(help="Newest batches to show.")] = 50,
    incomplete: Annotated[bool, typer.Option(help="Only batches with pending members.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """The newest batches: members, pending, failed, and which callbacks were written."""
    found = recent(_stores(), limit=limit, incomplete_only=incomplete)
    if as_json:
        typer.echo(json.dumps([summary.as_dict() for summary in found]))
        return
    view = Table(title=f"batches ({len(found)})", title_justify="left")
    for column in ("id", "description", "created", "total", "pending", "succeeded",
                   "not succeeded", "completed", "callbacks"):
        view.add_column(column, no_wrap=column in ("id", "created", "completed"),
                        justify="right" if column in ("total", "pending", "succeeded",
                                                      "not succeeded") else "left")
    for summary in found:
        ok = summary.tallies["succeeded"] + summary.tallies["replayed"]
        bad = summary.total - summary.pending - ok
        fired = [kind for kind, task_id in (("success", summary.success_task_id),
                                            ("complete", summary.complete_task_id)) if task_id]
        view.add_row(
            summary.id, summary.description or "", f"{summary.created_at:%Y-%m-%d %H:%M:%S}",
            str(summary.total), str(summary.pending), str(ok),
            f"[red]{bad}[/red]" if bad else "0",
            f"{summary.completed_at:%Y-%m-%d %H:%M:%S}" if summary.completed_at else "",
            ", ".join(fired),
        )
    console.print(view)


@cli.command("show")
def show_command(
    batch_id: Annotated[str, typer.Argument(help="Batch id (from `jobs batches list`).")],
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """One batch: members per final state, and each callback (written? its job's state)."""
    summary = describe(_stores(), batch_id)
    view = summary.as_dict()
    for kind, task_id in (("success", summary.success_task_id),
                          ("complete", summary.complete_task_id)):
        if view["callbacks"][kind] is not None:
            view["callbacks"][kind]["state"] = _callback_state(task_id)
    if as_json:
        typer.echo(json.dumps(view))
        return
    status = ("complete, all succeeded" if summary.succeeded
              else "complete" if summary.complete else f"{summary.pending} pending")
    console.print(f"batch [bold]{summary.id}[/bold] {summary.description or ''}  "
                  f"{summary.total} members, {status}")
    tallies = Table(title="members", title_justify="left")
    tallies.add_column("state")
    tallies.add_column("members", justify="right")
    tallies.add_row("pending", str(summary.pending))
    for state, count in summary.tallies.items():
        tallies.add_row(state, str(count))
    console.print(tallies)
    callbacks = Table(title="callbacks", title_justify="left")
    for column in ("callback", "task", "written", "task id", "state"):
        callbacks.add_column(column)
    for kind, callback in view["callbacks"].items():
        if callback is None:
            continue
        callbacks.add_row(kind, str(callback["task"]), "yes" if callback["fired"] else "no",
                          callback["task_id"] or "", callback.get("state") or "")
    console.print(callbacks)
