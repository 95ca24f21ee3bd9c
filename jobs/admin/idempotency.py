"""`jobs idempotency`: live state, a record by key, recent records, purge one key."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from resilience.idempotency import describe, records_for
from resilience.stores import stores_for

cli = typer.Typer(
    help="Idempotency records: status, show one, list recent ones, purge a key.",
    no_args_is_help=True,
)
console = Console()

TaskOption = Annotated[str, typer.Option("--task", "-t", help="the task name (key namespace)")]


def _stores() -> Any:
    # lazy: `jobs.app` builds the Celery app on first access; `jobs --help` must not
    from jobs import app

    return stores_for(app)


def _records() -> Any:

    return records_for(_stores())


def _when(value: Any) -> str:
    return "" if value is None else value.isoformat(timespec="seconds")


@cli.command("status")
def status_command(
    limit: Annotated[
        int, typer.Option("--limit", "-n", min=1, max=1000, help="most open claims listed")
    ] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    count_cache: Annotated[
        bool,
        typer.Option(
            "--count-cache",
            help="also count the cached results (one SCAN of the whole guard Redis keyspace)",
        ),
    ] = False,
) -> None:
    """What is on now: records by state (estimated on a large table), open claims and their
    holders; cached results only with --count-cache (a SCAN, too slow to run routinely)."""
    state = describe(_stores(), holders_limit=limit, cache_size=count_cache)
    if as_json:
        console.print_json(json.dumps(state.as_dict()))
        return
    counts = ", ".join(f"{name} {n}" for name, n in state.by_state.items())
    if not count_cache:
        cached = "not counted (--count-cache)"
    else:
        cached = "unknown" if state.cached_results is None else str(state.cached_results)
    console.print(f"records: {state.total} ({counts}); cached results: {cached}")
    view = Table(title="open claims (oldest first)")
    for column in ("key", "holder", "attempt", "held", "alive"):
        view.add_column(column, no_wrap=column == "key")
    for holder in state.holders:
        view.add_row(
            holder.key,
            holder.owner or "",
            str(holder.token),
            f"{holder.held_seconds or 0:.1f}s",
            "yes" if holder.alive else "lapsed",
        )
    console.print(view)


@cli.command("show")
def show_command(
    key: Annotated[str, typer.Argument(help="the idempotency key")],
    task: TaskOption,
) -> None:
    """One record: state, attempt (fencing number), lease, result or error, expiry."""
    record = _records().find(task, key)
    if record is None:
        console.print(f"no record for {task}:{key}")
        raise typer.Exit(1)
    view = Table(title=f"{task}:{key}", show_header=False)
    view.add_column("field")
    view.add_column("value")
    for field, value in (
        ("state", record.state),
        ("attempt", str(record.attempt)),
        ("task id", record.task_id or ""),
        ("fingerprint", record.fingerprint),
        ("lease owner", record.lease_owner or ""),
        ("lease expires", _when(record.lease_expires_at)),
        ("created", _when(record.created_at)),
        ("updated", _when(record.updated_at)),
        ("expires", _when(record.expires_at)),
        ("result", "" if record.result is None else json.dumps(record.result)[:2000]),
        ("error", record.error or ""),
    ):
        view.add_row(field, value)
    console.print(view)


@cli.command("list")
def list_command(
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=1000)] = 20,
    task: Annotated[str | None, typer.Option("--task", "-t", help="only this task")] = None,
    state: Annotated[
        str | None, typer.Option("--state", help="in_progress, succeeded or failed")
    ] = None,
) -> None:
    """The most recently updated records."""
    view = Table(title="idempotency records (newest first)")
    for column in ("task", "key", "state", "attempt", "task id", "updated", "expires"):
        view.add_column(column, no_wrap=column in ("task", "key"))
    for record in _records().recent(limit=limit, task_name=task, state=state):
        view.add_row(
            record.task_name,
            record.key,
            record.state,
            str(record.attempt),
            record.task_id or "",
            _when(record.updated_at),
            _when(record.expires_at),
        )
    console.print(view)


@cli.command("purge")
def purge_command(
    key: Annotated[str, typer.Argument(help="the idempotency key")],
    task: TaskOption,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="also delete an open claim (its holder's result is then not recorded)"
        ),
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", help="do not ask for confirmation")] = False,
) -> None:
    """Delete one record (and its cached copy), so the next delivery of KEY runs again."""
    if not yes:
        typer.confirm(f"purge {task}:{key}? the next job with this key runs again", abort=True)
    deleted = _records().purge(task, key, force=force)
    if not deleted:
        console.print(f"{task}:{key}: nothing deleted (no record, or an open claim: --force)")
        raise typer.Exit(1)
    console.print(f"{task}:{key}: purged")
