"""`jobs locks`: the locks held right now, and a force-release for a stuck one."""

from __future__ import annotations

import os
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

cli = typer.Typer(help="Exclusive-run locks: list held locks, force-release one.",
                  no_args_is_help=True)
console = Console()


def _context() -> tuple[object, list[str]]:
    from jobs import app
    from resilience.stores import stores_for

    stores = stores_for(app)
    urls = [u.strip() for u in os.environ.get("REDLOCK_URLS", "").split(",") if u.strip()]
    return stores, urls or list(stores.redlock_urls)


@cli.command("list")
def list_command(
    all_rows: Annotated[bool, typer.Option("--all", help="also show stale registry rows")] = False,
) -> None:
    """Held locks: key, kind, holder task, age, fencing token."""
    from resilience.locks import describe

    stores, urls = _context()
    view = Table(title="held locks")
    for column in ("key", "kind", "holder", "age", "token", "state"):
        view.add_column(column, no_wrap=column in ("key", "kind"))
    for holder in describe(stores, urls):  # type: ignore[arg-type]
        if not holder.alive and not all_rows:
            continue
        view.add_row(holder.key, holder.kind, holder.owner or "-",
                     f"{holder.held_seconds or 0:.1f}s",
                     "" if holder.token is None else str(holder.token),
                     "held" if holder.alive else "stale")
    console.print(view)


@cli.command("release")
def release_command(
    key: Annotated[str, typer.Argument(help="the lock key as `jobs locks list` shows it")],
    yes: Annotated[bool, typer.Option("--yes", help="do not ask for confirmation")] = False,
) -> None:
    """Force-release KEY: delete it on the Redlock nodes or end the session holding it."""
    from resilience.locks import force_release

    if not yes:
        typer.confirm(f"force-release {key!r}? its holder loses the lock", abort=True)
    stores, urls = _context()
    console.print(f"{key}: {force_release(stores, key, urls)}")  # type: ignore[arg-type]
