"""`jobs locks`: the locks held right now, and a force-release for a stuck one."""

from __future__ import annotations

from typing import Annotated

import typer

from jobs.admin.status import console, platform_source, print_view, table
from resilience.locks import force_release
from resilience.locks.view import LOCKS, held

cli = typer.Typer(help="Exclusive-run locks: list held locks, force-release one.",
                  no_args_is_help=True)


@cli.command("list")
def list_command(
    all_rows: Annotated[bool, typer.Option("--all", help="also show stale registry rows")] = False,
) -> None:
    """Held locks (and the beat leader): key, kind, holder task, age, fencing token."""
    rows = [row for row in held(platform_source()) if all_rows or not row["stale"]]
    print_view(table(LOCKS, {"count": sum(not row["stale"] for row in rows), "held": rows}))


@cli.command("release")
def release_command(
    key: Annotated[str, typer.Argument(help="the lock key as `jobs locks list` shows it")],
    yes: Annotated[bool, typer.Option("--yes", help="do not ask for confirmation")] = False,
) -> None:
    """Force-release KEY: delete it on the Redlock nodes or end the session holding it."""
    if not yes:
        typer.confirm(f"force-release {key!r}? its holder loses the lock", abort=True)
    stores = platform_source().stores
    console.print(f"{key}: {force_release(stores, key, stores.redlock_urls)}")
