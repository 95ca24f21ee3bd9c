"""`jobs dead-letters`: inspect the dead-letter place and requeue entries."""

from __future__ import annotations

from dataclasses import asdict, replace
from functools import partial
from typing import Annotated

import typer

from jobs.admin.status import console, exit_on, fail, platform_source, show
from resilience.deadletter.bulk import InvalidSelection, Selection, parse_since, requeue_many
from resilience.deadletter.place import get
from resilience.deadletter.view import VIEW, read, requeue_one

cli = typer.Typer(help="Jobs given up on: list, show, requeue.", no_args_is_help=True)


@cli.command("list")
def list_command(
    limit: Annotated[int, typer.Option(help="Newest entries to show.")] = 50,
    task: Annotated[str | None, typer.Option(help="Only this task name.")] = None,
    pending: Annotated[bool, typer.Option(help="Only entries not requeued yet.")] = False,
) -> None:
    """The newest dead letters with their reason."""
    show(replace(VIEW, title="dead letters"), read=partial(
        read, limit=limit, task_name=task, pending_only=pending))


@cli.command("show")
def show_command(entry_id: Annotated[int, typer.Argument(help="Dead-letter id.")]) -> None:
    """Everything recorded about one dead letter (arguments, error, reason)."""
    entry = asdict(get(platform_source().stores.engine(), entry_id))
    console.print_json(data=entry, default=str)


@cli.command("requeue")
def requeue_command(
    entry_id: Annotated[int | None, typer.Argument(
        help="One dead-letter id (or select rows with the options).")] = None,
    task: Annotated[str | None, typer.Option(help="Rows of this task name.")] = None,
    reason: Annotated[str | None, typer.Option(
        help="Rows whose reason contains this text (any case).")] = None,
    since: Annotated[str | None, typer.Option(
        help="Rows dead-lettered since: a duration back (90s, 15m, 2h, 7d) or an ISO 8601 "
             "date or time.")] = None,
    guard: Annotated[str | None, typer.Option(
        help="Rows given up by this guard (retry, breaker, ...).")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="Requeue at most this many.")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Say what would be requeued; change nothing.")] = False,
    batch_size: Annotated[int, typer.Option(min=1, help="Rows per transaction.")] = 200,
) -> None:
    """Publish jobs again with their original arguments, once per entry.

    With an ID: that entry, published at once. With --task/--reason/--since/--guard: every
    pending entry matching them all, each written to the outbox in the transaction that
    marks it (the relay publishes); entries that cannot run are skipped, counted by reason,
    and stay pending.
    """
    source = platform_source()
    selectors = {"--task": task, "--reason": reason, "--since": since, "--guard": guard}
    if entry_id is not None:
        given = [name for name, value in selectors.items() if value is not None]
        if given or limit is not None or dry_run:
            raise fail(f"requeue ID takes no {', '.join(given) or 'other'} options; select "
                       "rows with the options instead of an ID")
        console.print(requeue_one(source, {"id": str(entry_id)}))
        return

    if all(value is None for value in selectors.values()):
        raise fail("name the entries to requeue: an ID, or --task, --reason, --since or --guard")
    with exit_on(InvalidSelection):
        selection = Selection(task_name=task, reason=reason, guard=guard,
                              since=parse_since(since) if since is not None else None)
    report = requeue_many(source.stores.engine(), source.app, selection, limit=limit,
                          batch_size=batch_size, dry_run=dry_run)
    verb = "would requeue" if dry_run else "requeued"
    where = "" if dry_run else " (written to the outbox; the relay publishes them)"
    console.print(f"{verb} {len(report.requeued)} dead letters{where}")
    if report.skipped:
        console.print(f"skipped {report.skipped_count}, left pending:")
        for why, ids in sorted(report.skipped.items()):
            shown = ", ".join(str(i) for i in ids[:5]) + (", ..." if len(ids) > 5 else "")
            console.print(f"  {len(ids):>6}  {why} (id{'s' if len(ids) > 1 else ''} {shown})")
    if report.stopped:
        console.print(f"stopped: {report.stopped}")
