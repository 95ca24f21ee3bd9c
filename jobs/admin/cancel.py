"""`jobs cancel` (registered by jobs.cli) and `jobs cancellations`: cancellations that stick
(`resilience.cancel`: PostgreSQL, the workers' Redis copy, and Celery's revoke)."""

from __future__ import annotations

from functools import partial
from typing import Annotated

import typer

from jobs.admin.status import console, fail, list_command, platform_app, platform_source
from resilience.cancel.view import VIEW, cancel, cancellations, read
from resilience.views import ActionRefused


def cancel_command(
    task_id: Annotated[str | None, typer.Argument(help="the job's task id")] = None,
    task: Annotated[str | None, typer.Option("--task", help="task name (with --key)")] = None,
    key: Annotated[str | None, typer.Option(
        "--key", help="the task's cancel_key value, e.g. an order id")] = None,
    reason: Annotated[str, typer.Option(help="shown as the job's outcome")] = (
        "cancelled by an operator"),
) -> None:
    """Cancel a job (ID), or every job of --task NAME whose cancel_key is KEY: it will not
    start on any worker, after restarts and redeliveries too."""
    if (task_id is None) == (task is None and key is None) or (task is None) != (key is None):
        raise fail("give a task id (jobs cancel ID) or both --task NAME and --key KEY")
    form = {"task_id": task_id or "", "task": task or "", "key": key or "", "reason": reason}
    try:
        console.print(cancel(platform_source(), form))
    except ActionRefused as refused:
        raise fail(f"{refused}, or add cancel_key=\"{{...}}\" to its @app.task") from None


cli = typer.Typer(help="Live cancellations: list, withdraw one, restore the Redis copies.",
                  no_args_is_help=True)


list_command(cli, "list", VIEW, "Live cancellations, newest first (the newest 1,000).",
             partial(read, limit=1000))


@cli.command("withdraw")
def withdraw_command(
    target: Annotated[str, typer.Argument(help="id:<task id> or key:<task>:<key>")],
) -> None:
    """Withdraw a cancellation: jobs it has not stopped yet run again."""
    done = cancellations(platform_app()).uncancel(target)
    console.print(f"withdrawn {target}" if done else f"{target} was not cancelled")


@cli.command("restore")
def restore_command() -> None:
    """Write the Redis copy of every live cancellation again (after a Redis flush)."""
    console.print(f"restored {cancellations(platform_app()).restore()} cancellation(s)")
