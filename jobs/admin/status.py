"""`jobs status`: the platform's resilience state, live in the terminal (rich).

    jobs status            refreshes every second until Ctrl-C
    jobs status --once     one snapshot, then exit 0 (1 when a store cannot serve)
    jobs status --json     the snapshot as JSON (/api/resilience's document, plus the
                           store probe's `stores` and `unavailable`); exit code as --once

Before reading anything the stores are probed with short timeouts: a store that cannot
serve is one line naming it (URL masked), why, and the fix (`make run`, its URL variable,
`jobs migrate`), instead of a connection error per section. Piped, tables are printed
as wide as they need, never cut to `…`.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

cli = typer.Typer(help="Live resilience view: tiers, pauses, cancellations, breakers, "
                       "budgets, limits, locks.",
                  invoke_without_command=True)
console = Console()
#: Problem lines: one line each, never wrapped, so `grep` and a reader see them whole.
errors = Console(stderr=True, soft_wrap=True)

#: Section titles, in display order (tests look for each).
TITLES = {
    "tiers": "tiers",
    "paused": "paused",
    "cancellations": "cancellations",
    "breakers": "circuit breakers",
    "budgets": "retry budgets",
    "limits": "limits",
    "locks": "locks held",
    "idempotency": "idempotency records",
    "outbox": "outbox",
    "batches": "batches",
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


def paused_table(section: Any) -> Table:
    """Pause switches that are on (`jobs pause`); an empty table says nothing is paused."""
    title = TITLES["paused"]
    missing = _unavailable(title, section)
    if missing:
        return missing
    view = Table(title=f"{title} ({len(section)})", title_justify="left")
    for column in ("scope", "name", "reason", "since", "for"):
        view.add_column(column)
    for row in section:
        view.add_row(row["scope"], f"[bold yellow]{row['name']}[/bold yellow]", row["reason"],
                     row["since"], f"{row['paused_seconds']}s")
    return view


def cancellations_table(section: Any) -> Table:
    """Live cancellations, newest first (`jobs cancel`)."""
    title = TITLES["cancellations"]
    missing = _unavailable(title, section)
    if missing:
        return missing
    view = Table(title=f"{title} ({len(section)})", title_justify="left")
    for column in ("target", "reason", "since", "until"):
        view.add_column(column)
    for row in section:
        view.add_row(row["target"], row["reason"], row["created_at"], row["expires_at"])
    return view


def batches_table(section: Any) -> Table:
    """The newest batches (`jobs batches list` shows more)."""
    title = TITLES["batches"]
    missing = _unavailable(title, section)
    if missing:
        return missing
    view = Table(title=title, title_justify="left")
    for column in ("batch", "description", "total", "pending", "final states", "completed"):
        view.add_column(column, justify="right" if column in ("total", "pending") else "left")
    for row in section:
        tallies = " ".join(f"{state}={count}" for state, count in row["tallies"].items()
                           if state != "pending")
        view.add_row(row["id"], row["description"] or "", str(row["total"]),
                     str(row["pending"]), tallies, row["completed_at"] or "-")
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
        in_use = "per key (jobs limits)" if row.get("keyed") else _number(row["in_use"])
        view.add_row("concurrency", row["name"], _number(row["limit"]), in_use,
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
        paused_table(snapshot["paused"]),
        cancellations_table(snapshot["cancellations"]),
        breakers_table(snapshot["breakers"]),
        budgets_table(snapshot["budgets"]),
        limits_table(snapshot["limits"]),
        locks_table(snapshot["locks"]),
        idempotency_table(snapshot["idempotency"]),
        outbox_section_table(snapshot["outbox"]),
        batches_table(snapshot["batches"]),
        leader_table(snapshot["beat_leader"]),
    )


#: Exit code of `--once` and `--json` when a store cannot serve (as `jobs health ready`).
EXIT_UNAVAILABLE = 1
#: Connect/read timeout of each store probe: the status view's own, not the platform's.
PROBE_TIMEOUT_SECONDS = 1.0
#: Widest table printed when stdout is not a terminal (a file gets whole cells, not `…`).
PIPED_MAX_WIDTH = 1000


def take_snapshot(*, inspect_timeout_seconds: float = 1.0) -> dict[str, Any]:
    """Probe the stores, then collect what they can serve.

    When no store answers, the Celery app is not even built: the answer comes in about a
    second instead of waiting on every section's timeouts.
    """
    from jobs.observe.snapshot import collect, probe_stores, unreachable_snapshot
    from jobs.settings import get_settings

    stores = probe_stores(get_settings(), timeout_seconds=PROBE_TIMEOUT_SECONDS)
    if not any(status.ok for status in stores.values()):
        return unreachable_snapshot(stores)
    from jobs import app

    app.loader.import_default_modules()
    return collect(app, inspect_timeout_seconds=inspect_timeout_seconds, stores=stores)


def _nothing_served(snapshot: dict[str, Any]) -> bool:
    stores = snapshot.get("stores") or {}
    return bool(stores) and not any(status["ok"] for status in stores.values())


def live_view(snapshot: dict[str, Any]) -> Group:
    """The live mode's screen: one red line per store that cannot serve, then the tables."""
    from jobs.observe.snapshot import problem_lines

    lines = [Text(line, style="red") for line in problem_lines(snapshot)]
    if _nothing_served(snapshot):
        return Group(*lines)
    return Group(*lines, render(snapshot))


def print_view(view: Any, target: Console | None = None) -> None:
    """Print `view`; when stdout is not a terminal, as wide as its widest table needs."""
    target = target or console
    if target.is_terminal:
        target.print(view)
        return
    needed = Measurement.get(target, target.options.update_width(PIPED_MAX_WIDTH), view)
    Console(width=max(target.width, needed.maximum), file=target.file).print(view)


def report_problems(snapshot: dict[str, Any]) -> bool:
    """Print one line per store that cannot serve on stderr; True when there was one."""
    from jobs.observe.snapshot import problem_lines

    lines = problem_lines(snapshot)
    for line in lines:
        errors.print(Text(line, style="red"))
    return bool(lines)


@cli.callback()
def status(
    once: Annotated[bool, typer.Option("--once", help="Print one snapshot and exit.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the snapshot as JSON.")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes.")] = 1.0,
) -> None:
    """Tiers (depth, active, rejected, ...), pauses, cancellations, breakers, budgets, limits,
    locks.

    A store that cannot serve is one line saying which and how to fix it; `--once` and
    `--json` then exit 1.
    """
    if as_json:
        snapshot = take_snapshot()
        typer.echo(json.dumps(snapshot, default=str, indent=2))
        if snapshot["unavailable"]:
            raise typer.Exit(EXIT_UNAVAILABLE)
        return
    snapshot = take_snapshot()
    if once or _nothing_served(snapshot):
        # Nothing to watch live when no store answers: say so and stop.
        if not _nothing_served(snapshot):
            print_view(render(snapshot))
        if report_problems(snapshot):
            raise typer.Exit(EXIT_UNAVAILABLE)
        return
    try:
        with Live(live_view(snapshot), console=console, auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                snapshot = take_snapshot(inspect_timeout_seconds=min(1.0, interval))
                live.update(live_view(snapshot), refresh=True)
    except KeyboardInterrupt:
        pass
