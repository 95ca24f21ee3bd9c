"""`jobs status`: the platform's resilience state, live in the terminal (rich).

    jobs status            refreshes every second until Ctrl-C
    jobs status --once     one snapshot, then exit 0
    jobs status --json     the snapshot as JSON (what /api/resilience serves)
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

cli = typer.Typer(help="Live resilience view: tiers, breakers, budgets, limits, locks.",
                  invoke_without_command=True)
console = Console()

#: Section titles, in display order (tests look for each).
TITLES = {
    "tiers": "tiers",
    "breakers": "circuit breakers",
    "budgets": "retry budgets",
    "limits": "limits",
    "locks": "locks held",
    "idempotency": "idempotency records",
    "outbox": "outbox",
    "beat_leader": "beat leader",
}


def _unavailable(title: str, section: Any) -> Table | None:
    if isinstance(section, dict) and "unavailable" in section:
        view = Table(title=title, title_justify="left")
        view.add_column("unavailable", style="red")
        view.add_row(str(section["unavailable"]))
        return view
    return None


def _number(value: Any) -> str:
    return "?" if value is None else str(value)


def tiers_table(section: Any) -> Table:
    title = TITLES["tiers"]
    missing = _unavailable(title, section)
    if missing:
        return missing
    view = Table(title=title, title_justify="left")
    for column in ("tier", "depth", "max", "active", "rejected", "discarded", "shed",
                   "deferred", "replayed", "skipped", "retried", "dead-lettered"):
        view.add_column(column, justify="left" if column == "tier" else "right")
    for tier, row in section.items():
        depth = _number(row["depth"])
        if row["full"]:
            depth = f"[bold red]{depth} FULL[/bold red]"
        view.add_row(tier, depth, str(row["max_queue_depth"]), _number(row["active"]),
                     *(_number(row[c]) for c in ("rejected", "discarded", "shed", "deferred",
                                                 "replayed", "skipped", "retried",
                                                 "dead_lettered")))
    return view


def breakers_table(section: Any) -> Table:
    title = TITLES["breakers"]
    missing = _unavailable(title, section)
    if missing:
        return missing
    view = Table(title=title, title_justify="left")
    for column in ("breaker", "state", "failure rate", "threshold", "calls", "failures",
                   "opened", "in state", "half-open in"):
        view.add_column(column)
    for row in section:
        state = f"[bold red]{row['state']}[/bold red]" if row["open"] else row["state"]
        threshold = row["failure_rate_threshold"]
        view.add_row(
            row["name"], state, f"{row['failure_rate']:.0%}",
            "" if threshold is None else f"{threshold:.0%}", str(row["calls"]),
            str(row["failures"]), str(row["times_opened"]),
            "" if row["seconds_in_state"] is None else f"{row['seconds_in_state']}s",
            "" if row["retry_in_seconds"] is None else f"{row['retry_in_seconds']}s",
        )
    return view


def budgets_table(section: Any) -> Table:
    title = TITLES["budgets"]
    missing = _unavailable(title, section)
    if missing:
        return missing
    view = Table(title=title, title_justify="left")
    for column in ("dependency", "requests", "retries", "allowed", "used", "window"):
        view.add_column(column)
    for row in section:
        used = f"{row['used']:.0%}"
        if row["used"] >= 1:
            used = f"[bold red]{used}[/bold red]"
        view.add_row(row["dependency"], str(row["requests"]), str(row["retries"]),
                     str(row["retries_allowed"]), used, f"{row['window_seconds']:g}s")
    return view


def limits_table(section: Any) -> Table:
    title = TITLES["limits"]
    missing = _unavailable(title, section)
    if missing:
        return missing
    view = Table(title=title, title_justify="left")
    for column in ("kind", "limit", "configured", "in use", "deferred"):
        view.add_column(column)
    for row in section["concurrency"]:
        view.add_row("concurrency", row["name"], _number(row["limit"]), str(row["in_use"]),
                     str(row["deferred"]))
    for row in section["rate"]:
        view.add_row(f"rate ({row['algorithm']})", row["name"], row["rate"], "",
                     str(row["deferred"]))
    return view


def locks_table(section: Any) -> Table:
    title = TITLES["locks"]
    missing = _unavailable(title, section)
    if missing:
        return missing
    view = Table(title=f"{title} ({section['count']})", title_justify="left")
    for column in ("key", "kind", "holder", "held", "token", "stale"):
        view.add_column(column)
    for row in section["held"]:
        view.add_row(row["key"], row["kind"], row["holder"], f"{row['held_seconds']}s",
                     _number(row["token"]), "[yellow]stale[/yellow]" if row["stale"] else "")
    return view


def idempotency_table(section: Any) -> Table:
    title = TITLES["idempotency"]
    missing = _unavailable(title, section)
    if missing:
        return missing
    view = Table(title=title, title_justify="left")
    for state in section["by_state"]:
        view.add_column(state, justify="right")
    view.add_row(*(str(n) for n in section["by_state"].values()))
    return view


def outbox_section_table(section: Any) -> Table:
    title = TITLES["outbox"]
    missing = _unavailable(title, section)
    if missing:
        return missing
    from jobs.admin.outbox import outbox_table

    return outbox_table(section, title)


def leader_table(section: Any) -> Table:
    title = TITLES["beat_leader"]
    missing = _unavailable(title, section)
    if missing:
        return missing
    view = Table(title=title, title_justify="left")
    view.add_column("leader")
    view.add_column("leading for")
    leader = section.get("leader")
    view.add_row(str(leader or "no beat leads"),
                 f"{section['leading_seconds']}s" if leader else "")
    return view


def render(snapshot: dict[str, Any]) -> Group:
    """The whole view of one snapshot."""
    header = Text(f"resilience status at {snapshot['taken_at']} "
                  f"(collected in {snapshot['collect_seconds']}s)", style="bold")
    return Group(
        header,
        tiers_table(snapshot["tiers"]),
        breakers_table(snapshot["breakers"]),
        budgets_table(snapshot["budgets"]),
        limits_table(snapshot["limits"]),
        locks_table(snapshot["locks"]),
        idempotency_table(snapshot["idempotency"]),
        outbox_section_table(snapshot["outbox"]),
        leader_table(snapshot["beat_leader"]),
    )


@cli.callback()
def status(
    once: Annotated[bool, typer.Option("--once", help="Print one snapshot and exit.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the snapshot as JSON.")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes.")] = 1.0,
) -> None:
    """Tiers (depth, active, rejected, discarded, shed), breakers, budgets, limits, locks."""
    from jobs import app
    from jobs.observe.snapshot import collect

    app.loader.import_default_modules()
    if as_json:
        typer.echo(json.dumps(collect(app), default=str, indent=2))
        return
    if once:
        console.print(render(collect(app)))
        return
    try:
        with Live(render(collect(app)), console=console, auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                live.update(render(collect(app, inspect_timeout_seconds=min(1.0, interval))),
                            refresh=True)
    except KeyboardInterrupt:
        pass
