"""`jobs breakers`: see the fleet's circuit breakers and override them by hand."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from resilience.circuit.backends.redis import RedisBreakerBackend

cli = typer.Typer(help="Circuit breakers: list, force-open, force-close, reset.",
                  no_args_is_help=True)
console = Console()


def _backend() -> RedisBreakerBackend:
    from jobs import app
    from resilience.circuit.backends.redis import RedisBreakerBackend
    from resilience.stores import stores_for

    stores = stores_for(app)
    return RedisBreakerBackend(stores.redis)


def _force(name: str, state: str) -> None:
    from resilience.circuit.breaker import CircuitBreaker
    from resilience.circuit.config import BreakerConfig

    previous = CircuitBreaker(BreakerConfig(name=name), _backend()).force(state)
    console.print(f"breaker {name}: {previous} -> {state}")


@cli.command("list")
def list_command() -> None:
    """Every breaker with state in Redis: state, window figures, transitions."""
    backend = _backend()
    view = Table(title="circuit breakers")
    for column in ("name", "state", "since", "calls", "failures", "slow", "opened", "probes"):
        view.add_column(column, no_wrap=column in ("name", "state", "id", "task"))
    now_ms = time.time() * 1000
    for name, state in backend.states().items():
        changed = float(state.get("changed_at") or 0)
        since = f"{(now_ms - changed) / 1000:.0f}s ago" if changed else ""
        view.add_row(
            name,
            state.get("state", "closed"),
            since,
            state.get("calls", "0"),
            state.get("failures", "0"),
            state.get("slow", "0"),
            state.get("n_opened", "0"),
            state.get("n_probes", "0"),
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
