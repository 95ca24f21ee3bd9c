"""`jobs breakers`: see the fleet's circuit breakers and override them by hand."""

from __future__ import annotations

from functools import partial
from typing import Annotated

import typer

from jobs.admin.status import console, list_command, platform_app
from resilience.circuit.backends.redis import RedisBreakerBackend
from resilience.circuit.breaker import CircuitBreaker
from resilience.circuit.config import BreakerConfig
from resilience.circuit.view import VIEW, read

cli = typer.Typer(
    help="Circuit breakers: list, force-open, force-close, reset.", no_args_is_help=True
)
Name = Annotated[str, typer.Argument(help="Breaker name.")]


def _force(name: str, state: str) -> None:
    backend = RedisBreakerBackend.of_app(platform_app())
    previous = CircuitBreaker(BreakerConfig(name=name), backend).force(state)
    console.print(f"breaker {name}: {previous} -> {state}")


list_command(cli, "list", VIEW, "Every breaker with state in Redis (one SCAN) or configured: "
             "state, window figures.", partial(read, include_stored=True))


@cli.command("force-open")
def force_open(name: Name) -> None:
    """Hold the breaker open: every call is deferred (or falls back) until reset."""
    _force(name, "forced_open")


@cli.command("force-close")
def force_close(name: Name) -> None:
    """Hold the breaker closed: calls always go through, outcomes are not counted."""
    _force(name, "forced_closed")


@cli.command("reset")
def reset(name: Name) -> None:
    """Back to closed with an empty window (ends a forced state)."""
    _force(name, "closed")
