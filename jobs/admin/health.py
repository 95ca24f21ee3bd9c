"""`jobs health`: liveness of one worker apart from readiness of the stores (exit 0 / 1).

    jobs health live --node critical@HOST   the worker answers a ping (docker healthcheck)
    jobs health ready                       Redis, broker, PostgreSQL up; migrations applied
"""

from __future__ import annotations

import socket
from typing import Annotated

import typer
from rich.console import Console

from jobs.observe.health import Check

cli = typer.Typer(help="Health checks: live (worker answers), ready (stores reachable).",
                  no_args_is_help=True)
console = Console()


def _report(checks: list[Check]) -> None:
    for check in checks:
        mark = "[green]ok[/green]" if check.ok else "[red]FAIL[/red]"
        console.print(f"{mark} {check.name}: {check.detail}")
    raise typer.Exit(0 if all(check.ok for check in checks) else 1)


@cli.command("live")
def live(
    node: Annotated[str | None, typer.Option(
        help="Worker node name, e.g. critical@host; default <tier>@<this host>.")] = None,
    tier: Annotated[str | None, typer.Option(help="Tier, to build the node name.")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the reply.")] = 5.0,
) -> None:
    """Exit 0 when the worker process answers `inspect ping`, 1 when it does not."""
    from jobs import app
    from jobs.observe.health import liveness

    if node is None:
        if tier is None:
            console.print("[red]give --node critical@host or --tier critical[/red]")
            raise typer.Exit(2)
        node = f"{tier}@{socket.gethostname()}"
    _report(liveness(app, node, timeout_seconds=timeout))


@cli.command("ready")
def ready() -> None:
    """Exit 0 when Redis, the broker and PostgreSQL answer and migrations are applied."""
    from jobs import app
    from jobs.observe.health import readiness

    _report(readiness(app))
