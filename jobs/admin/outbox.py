"""`jobs outbox relay` (publish committed rows until SIGTERM; `jobs up` runs it) and
`jobs outbox status` (pending rows, lag, published in the last minute)."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Annotated

import typer

from jobs.admin.status import list_command, platform_source
from jobs.cli import settings_or_exit, wait_for_services
from resilience.outbox import Relay, RelayConfig
from resilience.outbox.view import VIEW

cli = typer.Typer(help="Transactional enqueue: the relay and its backlog.", no_args_is_help=True)


@cli.command("relay")
def relay_command(
    poll_seconds: Annotated[float, typer.Option(
        help="Longest idle sleep; a committed row wakes the relay at once.")] = 1.0,
    batch_size: Annotated[int, typer.Option(help="Rows published per transaction.")] = 100,
    lookahead_seconds: Annotated[float, typer.Option(
        help="Rows due within this are published now with the remainder as countdown.")] = 1.0,
) -> None:
    """Publish committed outbox rows in id order until SIGTERM or Ctrl-C.

    Several relays may run at once: each locks its rows with SKIP LOCKED.
    """
    settings = settings_or_exit()
    wait_for_services(settings)
    logging.basicConfig(level=settings.log_level,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    relay = Relay(platform_source().app, RelayConfig(
        batch_size=batch_size, poll_seconds=poll_seconds, lookahead_seconds=lookahead_seconds))
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    logging.getLogger("resilience.outbox").info(
        "outbox relay ready (batch %s, poll %gs)", batch_size, poll_seconds)
    relay.run(should_stop=stopping.is_set)


list_command(cli, "status", VIEW, "Pending rows (due now, scheduled later), lag, published in "
             "the last minute.")
