"""`jobs idempotency`: live state, a record by key, recent records, purge one key."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Annotated

import typer

from jobs.admin.status import console, platform_source, print_view, show, table
from resilience.idempotency import describe, records_for
from resilience.idempotency.view import CLAIMS, RECENT, RECORD, record, summary

cli = typer.Typer(help="Idempotency records: status, show one, list recent ones, purge a key.",
                  no_args_is_help=True)

TaskOption = Annotated[str, typer.Option("--task", "-t", help="the task name (key namespace)")]


@cli.command("status")
def status_command(
    limit: Annotated[int, typer.Option(
        "--limit", "-n", min=1, max=1000, help="most open claims listed")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    count_cache: Annotated[bool, typer.Option(
        "--count-cache",
        help="also count the cached results (one SCAN of the whole guard Redis keyspace)")] = False,
) -> None:
    """What is on now: records by state (estimated on a large table), open claims and their
    holders; cached results only with --count-cache (a SCAN, too slow to run routinely)."""
    state = describe(platform_source().stores, holders_limit=limit,
                     cache_size=count_cache).as_dict()
    if as_json:
        console.print_json(data=state)
        return
    console.print(summary(state, cache_counted=count_cache))
    print_view(table(CLAIMS, state))


@cli.command("show")
def show_command(
    key: Annotated[str, typer.Argument(help="the idempotency key")],
    task: TaskOption,
) -> None:
    """One record: state, attempt (fencing number), lease, result or error, expiry."""
    rows = record(platform_source(), task, key)
    if rows is None:
        console.print(f"no record for {task}:{key}")
        raise typer.Exit(1)
    print_view(table(replace(RECORD, title=f"{task}:{key}"), rows))


@cli.command("list")
def list_command(
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=1000)] = 20,
    task: Annotated[str | None, typer.Option("--task", "-t", help="only this task")] = None,
    state: Annotated[str | None, typer.Option(
        "--state", help="in_progress, succeeded or failed")] = None,
) -> None:
    """The most recently updated records."""
    show(RECENT, read=partial(RECENT.read, limit=limit, task_name=task, state=state))


@cli.command("purge")
def purge_command(
    key: Annotated[str, typer.Argument(help="the idempotency key")],
    task: TaskOption,
    force: Annotated[bool, typer.Option(
        "--force", help="also delete an open claim (its holder's result is then not recorded)")
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", help="do not ask for confirmation")] = False,
) -> None:
    """Delete one record (and its cached copy), so the next delivery of KEY runs again."""
    if not yes:
        typer.confirm(f"purge {task}:{key}? the next job with this key runs again", abort=True)
    deleted = records_for(platform_source().stores).purge(task, key, force=force)
    if not deleted:
        console.print(f"{task}:{key}: nothing deleted (no record, or an open claim: --force)")
        raise typer.Exit(1)
    console.print(f"{task}:{key}: purged")
