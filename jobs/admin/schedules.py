"""`jobs schedules list | show | add | edit | pause | resume | remove | run-now`: the beat's
schedules in PostgreSQL, edited at runtime through the view's actions
(`resilience.schedules.view`), as the page's forms do. See docs/schedules.md.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from jobs.admin.status import (
    JsonOption,
    act,
    list_command,
    one_line_errors,
    platform_source,
    print_view,
    table,
)
from resilience.schedules.api import recent_runs
from resilience.schedules.policies import CatchUp, Overlap
from resilience.schedules.view import (
    FIRES,
    RUNS,
    VIEW,
    add_schedule,
    detail,
    edit_schedule,
    pause_schedule,
    remove_schedule,
    resume_schedule,
    run_schedule_now,
    status,
)
from resilience.views import Submitted

cli = typer.Typer(help="Schedules: list, show, add, edit, pause, resume, remove, run now.",
                  no_args_is_help=True)
console = Console()

_EVERY_HELP = "A period (30, 30s, 5m, 1h) or a five-field cron expression ('*/5 * * * *')."
_CATCH_UP_HELP = f"Missed slots: {', '.join(CatchUp)}."
_OVERLAP_HELP = f"When the previous run has not finished: {', '.join(Overlap)}."


def _form(**fields: str | float | bool | None) -> Submitted:
    """The action's form from the options given (an option left out stays empty)."""
    return {name: ("1" if value is True else "" if value in (None, False) else str(value))
            for name, value in fields.items()}


list_command(cli, "list", VIEW, "Every schedule: task, timing, policies, paused or not, last "
             "run and next fire.")


@cli.command("show")
def show_command(
    name: Annotated[str, typer.Argument(help="Schedule name (from `jobs schedules list`).")],
    runs: Annotated[int, typer.Option(min=1, help="Newest runs to show.")] = 10,
    as_json: JsonOption = False,
) -> None:
    """One schedule: its settings, its last runs (outcome, lateness) and its next five fires."""
    with one_line_errors():
        source = platform_source()
        row = detail(source, name)
        if runs != len(row["last_runs"]):
            row["last_runs"] = [run.as_dict() for run in recent_runs(source.stores, name, runs)]
    if as_json:
        typer.echo(json.dumps(row, default=str))
        return
    console.print(escape(status(row)))
    print_view(table(RUNS, row))
    print_view(table(FIRES, row))


@cli.command("add")
def add_command(
    name: Annotated[str, typer.Argument(help="A new schedule's name.")],
    task: Annotated[str, typer.Option(help="The task it sends.")],
    every: Annotated[str, typer.Option(help=_EVERY_HELP)],
    timezone: Annotated[str | None, typer.Option(
        help="IANA time zone of a cron expression (default UTC).")] = None,
    args: Annotated[str | None, typer.Option(help="Positional arguments, a JSON list.")] = None,
    kwargs: Annotated[str | None, typer.Option(
        help="Keyword arguments, a JSON object.")] = None,
    options: Annotated[str | None, typer.Option(
        help="apply_async options, a JSON object ({\"expires\": 55}).")] = None,
    catch_up: Annotated[str, typer.Option(help=_CATCH_UP_HELP)] = CatchUp.SKIP.value,
    catch_up_window: Annotated[str | None, typer.Option(
        help="With --catch-up all: how far back missed slots fire (seconds; 1h).")] = None,
    overlap: Annotated[str, typer.Option(help=_OVERLAP_HELP)] = Overlap.ALLOW.value,
    paused: Annotated[bool, typer.Option(help="Add it paused.")] = False,
) -> None:
    """Add a runtime schedule; the beat leader fires it from its next slot on."""
    act(add_schedule, _form(name=name, task=task, every=every, timezone=timezone, args=args,
                             kwargs=kwargs, options=options, catch_up=catch_up,
                             catch_up_window=catch_up_window, overlap=overlap, paused=paused))


@cli.command("edit")
def edit_command(
    name: Annotated[str, typer.Argument(help="Schedule name.")],
    every: Annotated[str | None, typer.Option(help=_EVERY_HELP)] = None,
    timezone: Annotated[str | None, typer.Option(
        help="IANA time zone of its cron expression.")] = None,
    task: Annotated[str | None, typer.Option(help="The task it sends.")] = None,
    args: Annotated[str | None, typer.Option(help="Positional arguments, a JSON list.")] = None,
    kwargs: Annotated[str | None, typer.Option(
        help="Keyword arguments, a JSON object.")] = None,
    options: Annotated[str | None, typer.Option(
        help="apply_async options, a JSON object.")] = None,
    catch_up: Annotated[str | None, typer.Option(help=_CATCH_UP_HELP)] = None,
    catch_up_window: Annotated[str | None, typer.Option(
        help="With --catch-up all: how far back missed slots fire (seconds; 1h).")] = None,
    overlap: Annotated[str | None, typer.Option(help=_OVERLAP_HELP)] = None,
) -> None:
    """Change a schedule; the leader applies it at its next tick, no restart. A code
    entry's task, timing, arguments and options come from code: only its policies change."""
    act(edit_schedule, _form(name=name, every=every, timezone=timezone, task=task, args=args,
                              kwargs=kwargs, options=options, catch_up=catch_up,
                              catch_up_window=catch_up_window, overlap=overlap))


@cli.command("pause")
def pause_command(name: Annotated[str, typer.Argument(help="Schedule name.")]) -> None:
    """Stop firing it from the leader's next tick; slots missed meanwhile go to its
    catch-up policy on resume."""
    act(pause_schedule, {"name": name})


@cli.command("resume")
def resume_command(name: Annotated[str, typer.Argument(help="Schedule name.")]) -> None:
    """Fire it again from the leader's next tick."""
    act(resume_schedule, {"name": name})


@cli.command("remove")
def remove_command(name: Annotated[str, typer.Argument(help="Schedule name.")]) -> None:
    """Delete it and its run history (a code entry comes back at the next seeding unless it
    is removed from code too)."""
    act(remove_schedule, {"name": name})


@cli.command("run-now")
def run_now_command(name: Annotated[str, typer.Argument(help="Schedule name.")]) -> None:
    """Fire it once now, outside its slots; prints the job's task id."""
    act(run_schedule_now, {"name": name})
