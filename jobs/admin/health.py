"""`jobs health live` (the worker's loop runs) apart from `jobs health ready` (its stores
answer), exit 0 / 1; `--local` reads the worker's own files. See docs/observe.md (Health)."""

from __future__ import annotations

import socket
from typing import Annotated

import typer

from jobs.admin.status import console, fail, platform_app
from jobs.observe import health

cli = typer.Typer(help="Health checks: live (worker's loop runs), ready (stores reachable).",
                  no_args_is_help=True)


def _report(checks: list[health.Check]) -> None:
    for check in checks:
        mark = "[green]ok[/green]" if check.ok else "[red]FAIL[/red]"
        console.print(f"{mark} {check.name}: {check.detail}", soft_wrap=True)
    raise typer.Exit(0 if all(check.ok for check in checks) else 1)


def _node(node: str | None, tier: str | None) -> str:
    """The worker node a local probe reads: `--node`, else `<tier>@<this host>`."""
    if node is not None:
        return node
    if tier is None:
        raise fail("give --node critical@host or --tier critical")
    return f"{tier}@{socket.gethostname()}"


@cli.command("live")
def live(
    node: Annotated[str | None, typer.Option(
        help="Worker node name, e.g. critical@host; default <tier>@<this host>.")] = None,
    tier: Annotated[str | None, typer.Option(help="Tier, to build the node name.")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the reply.")] = 5.0,
    local: Annotated[bool, typer.Option(
        "--local", help="Read the worker's heartbeat file on this host: no broker round "
                        "trip (the liveness probe).")] = False,
    max_age: Annotated[float, typer.Option(
        min=0.1, help="With --local: seconds since the last beat before the worker counts "
                      "as dead.")] = health.DEFAULT_MAX_AGE_SECONDS,
) -> None:
    """Exit 0 when the worker is alive (its heartbeat is fresh with --local, else it answers
    `inspect ping`), 1 when it is not."""
    node = _node(node, tier)
    if local:  # no app, no broker: one stat of the heartbeat file
        _report(health.local_liveness(node, max_age_seconds=max_age))
    _report(health.liveness(platform_app(), node, timeout_seconds=timeout))


@cli.command("ready")
def ready(
    node: Annotated[str | None, typer.Option(
        help="With --local: worker node name, e.g. critical@host; default <tier>@<this "
             "host>.")] = None,
    tier: Annotated[str | None, typer.Option(help="With --local: tier, to build the node "
                                                  "name.")] = None,
    local: Annotated[bool, typer.Option(
        "--local", help="Read the worker's recorded readiness (it checks its stores every "
                        "10 s): no connection from the probe (the readiness probe).")] = False,
    max_age: Annotated[float, typer.Option(
        min=0.1, help="With --local: seconds since the worker's last check before the "
                      "record counts as stale (not ready).")
    ] = health.DEFAULT_READY_MAX_AGE_SECONDS,
) -> None:
    """Exit 0 when Redis, the broker and PostgreSQL answer and migrations are applied
    (checked now, or with --local as the worker last recorded it), 1 when not."""
    if local:  # no app, no store: one read of the worker's readiness file
        _report(health.local_readiness(_node(node, tier), max_age_seconds=max_age))
    _report(health.readiness(platform_app()))
