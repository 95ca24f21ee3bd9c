"""`jobs workflows list | show | cancel | retry | replay`: durable workflow runs, their steps,
and the view's actions on them (`resilience.workflows.view`), as the page's buttons do. See
docs/workflows.md.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from jobs.admin.status import JsonOption, act, fail, platform_source, print_view, show, table
from resilience.workflows.view import (
    LIST,
    STEPS,
    cancel_run,
    detail,
    graph,
    listed,
    replay_run,
    retry_run,
    status,
)

cli = typer.Typer(help="Durable workflows: runs, steps, cancel, retry, replay.",
                  no_args_is_help=True)
console = Console()

STATES = ("running", "succeeded", "failed", "compensating", "compensated", "cancelled")


@cli.command("list")
def list_command(
    limit: Annotated[int, typer.Option(min=1, help="Newest runs to show.")] = 50,
    state: Annotated[str | None, typer.Option(
        help=f"Only runs in this state: {', '.join(STATES)}.")] = None,
    as_json: JsonOption = False,
) -> None:
    """The newest workflow runs: state, steps done, the other steps' states."""
    if state is not None and state not in STATES:
        raise fail(f"unknown state {state!r}; states are {', '.join(STATES)}")
    show(LIST, as_json=as_json, read=partial(listed, limit=limit, state=state))


@cli.command("show")
def show_command(
    workflow_id: Annotated[str, typer.Argument(help="Workflow id (from `jobs workflows list`).")],
    as_json: JsonOption = False,
    svg: Annotated[Path | None, typer.Option(
        help="Also write the run's graph to this SVG file.")] = None,
) -> None:
    """One run: each step's state, task id, times, result or error, and compensation."""
    run = detail(platform_source(), workflow_id)
    if svg is not None:
        svg.write_text(graph(run))
    if as_json:
        typer.echo(json.dumps(run, default=str))
        return
    console.print(escape(status(run)))
    print_view(table(STEPS, run))
    if svg is not None:
        console.print(f"graph written to {escape(str(svg))}")


@cli.command("cancel")
def cancel_command(
    workflow_id: Annotated[str, typer.Argument(help="Workflow id.")],
) -> None:
    """Cancel a running workflow; the compensations of its succeeded steps run.

    Its queued steps are cancelled (they will not start on any worker), its pending ones
    skipped, a running one finishes (and is compensated if it succeeds)."""
    act(cancel_run, {"id": workflow_id})


@cli.command("retry")
def retry_command(
    workflow_id: Annotated[str, typer.Argument(help="Workflow id.")],
    from_step: Annotated[int | None, typer.Option(
        "--from-step", min=0, help="Position of the step to run again (default: the failed "
        "step).")] = None,
) -> None:
    """Run a stopped workflow again from its failed step (or step N).

    That step, every step that did not succeed and the steps depending on them go back to
    pending; a step depending on none of them is not run again."""
    act(retry_run, {"id": workflow_id,
                     "from_step": "" if from_step is None else str(from_step)})


@cli.command("replay")
def replay_command(
    workflow_id: Annotated[str, typer.Argument(help="Workflow id.")],
    from_step: Annotated[int, typer.Option(
        "--from-step", min=0, help="Position of the first step the new run runs.")],
) -> None:
    """Start a new run of this workflow from step N, linked to this one.

    Steps before N are copied with their results (they must have succeeded); N onward run."""
    act(replay_run, {"id": workflow_id, "from_step": str(from_step)})
