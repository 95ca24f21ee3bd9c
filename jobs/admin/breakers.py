"""`jobs breakers`: see the fleet's circuit breakers and override them by hand."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from resilience.circuit.backends.redis import RedisBreakerBackend

cli = typer.Typer(
    help="Circuit breakers: list, force-open, force-close, reset.", no_args_is_help=True
)
console = Console()


def _backend() -> RedisBreakerBackend:
    from jobs import app
    from resilience.circuit.backends.redis import RedisBreakerBackend

    return RedisBreakerBackend.of_app(app)


def _force(name: str, state: str) -> None:
    from resilience.circuit.breaker import CircuitBreaker
    from resilience.circuit.config import BreakerConfig

    previous = CircuitBreaker(BreakerConfig(name=name), _backend()).force(state)
    console.print(f"breaker {name}: {previous} -> {state}")


@cli.command("list")
def list_command() -> None:
    """Every breaker with state in Redis: state, window figures, transitions."""
    view = Table(title="circuit breakers")
    for column in ("name", "state", "since", "calls", "failures", "slow", "opened", "probes"):
        view.add_column(column, no_wrap=column in ("name", "state", "id", "task"))
    for state in _backend().describe(include_stored=True):
        since = state.seconds_in_state
        view.add_row(
            state.name,
            state.state,
            "" if since is None else f"{since:.0f}s ago",
            str(state.calls),
            str(state.failures),
            str(state.slow_calls),
            str(state.times_opened),
            str(state.probes_total),
        )
    console.print(view)


@cli.command("force-open")
def force_open(name: Annotated[str, typer.Argument(help="Breaker name.")]) -> None:
    """Hold the breaker open: every call is deferred (or falls back) until reset."""
    _force(name, "forced_open")


@cli.command("force-close")
def force_close(name: Annotated[str, typer.Argument(help="Breaker name.")]) -> None:
    """Hold the breaker closed: calls always go through, outcomes are not counted."""
    _force(name, "forced_closed")


@cli.command("reset")
def reset(name: Annotated[str, typer.Argument(help="Breaker name.")]) -> None:
    """Back to closed with an empty window (ends a forced state)."""
    _force(name, "closed")
