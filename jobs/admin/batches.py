"""`jobs batches list | show ID`: batches and their members' final states (docs/batches.md)."""

from __future__ import annotations

import json
from functools import partial
from typing import Annotated

import typer

from jobs.admin.status import JsonOption, console, platform_source, print_view, show, table
from resilience.batches.view import CALLBACKS, LIST, MEMBERS, detail, listed, status

cli = typer.Typer(help="Batches: members' final states and callbacks.", no_args_is_help=True)


@cli.command("list")
def list_command(
    limit: Annotated[int, typer.Option(help="Newest batches to show.")] = 50,
    incomplete: Annotated[bool, typer.Option(help="Only batches with pending members.")] = False,
    as_json: JsonOption = False,
) -> None:
    """The newest batches: members, pending, failed, and which callbacks were written."""
    show(LIST, as_json=as_json, read=partial(listed, limit=limit, incomplete_only=incomplete))


@cli.command("show")
def show_command(
    batch_id: Annotated[str, typer.Argument(help="Batch id (from `jobs batches list`).")],
    as_json: JsonOption = False,
) -> None:
    """One batch: members per final state, and each callback (written? its job's state)."""
    batch = detail(platform_source(), batch_id)
    if as_json:
        typer.echo(json.dumps(batch))
        return
    console.print(status(batch))
    for view in (MEMBERS, CALLBACKS):
        print_view(table(view, batch))
