"""`jobs status` (live, `--once`, `--json`; the stores probed first), and the helpers every
`jobs <group>` command prints and acts with. See docs/observe.md (`jobs status`).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from jobs.observe.snapshot import VIEWS, collect, probe_stores, problem_lines
from jobs.settings import get_settings
from jobs.tiers import TIERS
from resilience.errors import ResilienceError
from resilience.redact import redact
from resilience.views import ActionRefused, Source, Submitted, View, missing

if TYPE_CHECKING:
    from celery import Celery

cli = typer.Typer(help="Live resilience view: tiers, pauses, cancellations, breakers, "
                       "budgets, limits, locks.",
                  invoke_without_command=True)
console = Console()
#: Problem lines: one line each, never wrapped, so `grep` and a reader see them whole.
errors = Console(stderr=True, soft_wrap=True)

def table(view: View, section: Any) -> Table:
    """`section` of the snapshot as `view` declares its table (or why it is missing)."""
    reason = missing(section)
    if reason is not None:
        unread = Table(title=view.title, title_justify="left")
        unread.add_column("unavailable", style="red")
        unread.add_row(reason)
        return unread
    columns = view.columns_of(section)
    shown = Table(title=view.title_of(section), title_justify="left", show_header=view.headers)
    for column in columns:
        shown.add_column(column.header, justify=column.justify, no_wrap=column.no_wrap)
    for row in view.rows(section):
        # A plain cell is data (a reason, a key): never read as rich markup.
        shown.add_row(*(column.cell(row) if column.text else escape(column.cell(row))
                        for column in columns))
    return shown


def fail(message: str) -> typer.Exit:
    """Print `message` as one red line on stderr; returns the exit (code 2) to raise."""
    errors.print(f"[red]{message}[/red]")
    return typer.Exit(2)


@contextlib.contextmanager
def exit_on(*kinds: type[Exception]) -> Iterator[None]:
    """Turn an error of `kinds` into one red line on stderr and exit code 2."""
    try:
        yield
    except kinds as exc:
        raise fail(str(exc)) from None


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """An action's refusal or a library error (an unknown name, a store down) as one red line
    on stderr and exit code 2."""
    try:
        yield
    except ActionRefused as refused:
        raise fail(escape(redact(str(refused)))) from None
    except ResilienceError as exc:
        raise fail(escape(redact(f"{type(exc).__name__}: {exc}"))) from None


def act(run: Callable[[Source, Submitted], str], form: Submitted) -> None:
    """Run one of a view's actions, as the page's forms do, and print its line."""
    with one_line_errors():
        console.print(escape(run(platform_source(), form)))


def platform_app() -> Celery:
    """The platform's Celery app, built on first use (`jobs --help` must not build it)."""
    from jobs import app  # lazy: builds the Celery app

    return app


def platform_source() -> Source:
    """What an admin command's view reads: the platform's app (its task modules loaded)."""
    app = platform_app()
    app.loader.import_default_modules()
    return Source(app=app, tiers=TIERS)


def show(view: View, *, as_json: bool = False,
         read: Callable[[Source], Any] | None = None) -> None:
    """Read `view` now (or `read` it another way: with a SCAN, more rows) and print its
    table, or with `as_json` its section as JSON: what `jobs <view> list` prints."""
    with one_line_errors():
        section = (read or view.read)(platform_source())
    if as_json:
        typer.echo(json.dumps(section, default=str))
        return
    print_view(table(view, section))


JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def list_command(group: typer.Typer, name: str, view: View, summary: str,
                 read: Callable[[Source], Any] | None = None) -> None:
    """Add `jobs <group> <name> [--json]`: `show(view)` (read another way with `read`)."""
    def command(as_json: JsonOption = False) -> None:
        show(view, as_json=as_json, read=read)

    group.command(name, help=summary)(command)


def render(snapshot: dict[str, Any]) -> Group:
    """The whole view of one snapshot; nothing when no store served (every table would only
    say so)."""
    if not _served(snapshot):
        return Group()
    header = Text(f"resilience status at {snapshot['taken_at']} "
                  f"(collected in {snapshot['collect_seconds']}s)", style="bold")
    return Group(header, *(table(view, snapshot[view.name]) for view in VIEWS))


#: Exit code of `--once` and `--json` when a store cannot serve (as `jobs health ready`).
EXIT_UNAVAILABLE = 1
#: Connect/read timeout of each store probe: the status view's own, not the platform's.
PROBE_TIMEOUT_SECONDS = 1.0
#: Widest table printed when stdout is not a terminal (a file gets whole cells, not `…`).
PIPED_MAX_WIDTH = 1000


def take_snapshot(*, inspect_timeout_seconds: float = 1.0) -> dict[str, Any]:
    """Probe the stores, then collect what they can serve (when none answers, without even
    building the Celery app: an answer in about a second, not every section's timeouts)."""
    stores = probe_stores(get_settings(), timeout_seconds=PROBE_TIMEOUT_SECONDS)
    app = platform_source().app if any(status.ok for status in stores.values()) else None
    return collect(app, inspect_timeout_seconds=inspect_timeout_seconds, stores=stores)


def _served(snapshot: dict[str, Any]) -> bool:
    return any(status["ok"] for status in snapshot["stores"].values())


def live_view(snapshot: dict[str, Any]) -> Group:
    """The live mode's screen: one red line per store that cannot serve, then the tables."""
    return Group(*(Text(line, style="red") for line in problem_lines(snapshot)),
                 render(snapshot))


def print_view(view: Any) -> None:
    """Print `view`; when stdout is not a terminal, as wide as its widest table needs."""
    if console.is_terminal:
        console.print(view)
        return
    needed = Measurement.get(console, console.options.update_width(PIPED_MAX_WIDTH), view)
    Console(width=max(console.width, needed.maximum), file=console.file).print(view)


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
    snapshot = take_snapshot()
    # Nothing to watch live when no store answers: say so and stop.
    if as_json or once or not _served(snapshot):
        if as_json:
            typer.echo(json.dumps(snapshot, default=str, indent=2))
        else:
            print_view(render(snapshot))
            for line in problem_lines(snapshot):
                errors.print(Text(line, style="red"))
        if snapshot["unavailable"]:
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
