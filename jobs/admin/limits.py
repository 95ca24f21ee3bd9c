"""`jobs limits`: tier bulkheads, concurrency semaphores, rate limiters and their counters."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

cli = typer.Typer(
    help="Overload control: bulkheads, semaphores, rate limits.", no_args_is_help=True
)
console = Console()

#: Guards whose counters this view shows.
GUARDS = ("bulkhead", "concurrency", "rate-limit", "deadline")
#: How `show` prints a rate algorithm's figures (`LimiterState.figures`); others as "N name".
FIGURES = {"ahead_seconds": "{:.3f}s ahead", "in_window": "{} in window"}


def snapshot() -> dict[str, Any]:
    """Everything `jobs limits show` prints, as plain data."""
    from jobs import app
    from jobs.tiers import TIERS
    from resilience.admission import RedisBrokerDepth, depth_backend_for
    from resilience.counters import read_all
    from resilience.ratelimit import ALGORITHMS, RedisBackend
    from resilience.stores import stores_for

    stores = stores_for(app)
    depth = depth_backend_for(app)
    tiers = []
    for tier in TIERS:
        limits = app.settings.tier(tier)
        reserved = depth.reserved(tier) if isinstance(depth, RedisBrokerDepth) else 0
        tiers.append(
            {
                "tier": tier,
                "depth": depth.depth(tier),
                "reserved": reserved,
                "max_queue_depth": limits.max_queue_depth,
                "policy": limits.rejection_policy,
                "wait_timeout_seconds": limits.wait_timeout_seconds,
            }
        )
    # Every limiter with state in Redis, decoded by the backend (a key too long to keep
    # readable shows as its digest, `#<sha256>`); lease times on Redis server time.
    states = RedisBackend(stores.redis).describe()
    semaphores = [
        {
            "key": state.key,
            "holders": {
                lease.owner: round(lease.expires_in_seconds, 3)
                for lease in state.holders
                if lease.alive
            },
        }
        for state in states
        if ALGORITHMS[state.algorithm].holds
    ]
    rates = [
        {
            "key": state.key,
            "algorithm": ALGORITHMS[state.algorithm].namespace,
            **state.figures,
            "waiting": state.waiting,
        }
        for state in states
        if not ALGORITHMS[state.algorithm].holds
    ]
    counters = [
        {**labels, "count": value}
        for labels, value in read_all(stores.redis())
        if labels.get("guard") in GUARDS
    ]
    return {"tiers": tiers, "semaphores": semaphores, "rates": rates, "counters": counters}


@cli.command("show")
def show(as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False) -> None:
    """Tier queue depth against its limit, semaphore holders, rate limiter state, counters."""
    state = snapshot()
    if as_json:
        console.print_json(json.dumps(state))
        return
    view = Table(title="tier bulkheads")
    for column in ("tier", "depth", "reserved", "limit", "policy", "wait s"):
        view.add_column(column)
    for tier in state["tiers"]:
        view.add_row(
            tier["tier"],
            str(tier["depth"]),
            str(tier["reserved"]),
            str(tier["max_queue_depth"]),
            tier["policy"],
            f"{tier['wait_timeout_seconds']:g}",
        )
    console.print(view)
    view = Table(title="concurrency limits (lease semaphores)")
    for column in ("key", "holders", "lease left (s) per holder"):
        view.add_column(column)
    for semaphore in state["semaphores"]:
        holders = semaphore["holders"]
        view.add_row(
            semaphore["key"],
            str(len(holders)),
            ", ".join(f"{h}: {left:.1f}" for h, left in holders.items()),
        )
    console.print(view)
    view = Table(title="rate limits")
    for column in ("key", "algorithm", "state", "waiting"):
        view.add_column(column)
    for rate in state["rates"]:
        figure = ", ".join(
            FIGURES.get(name, f"{{:g}} {name}").format(rate[name])
            for name in rate
            if name not in ("key", "algorithm", "waiting")
        )
        view.add_row(rate["key"], rate["algorithm"], figure, str(rate["waiting"]))
    console.print(view)
    view = Table(title="decisions (fleet-wide counters)")
    for column in ("guard", "outcome", "tier", "name", "count"):
        view.add_column(column)
    for row in sorted(state["counters"], key=lambda r: (r["guard"], r["outcome"], r["name"])):
        view.add_row(row["guard"], row["outcome"], row["tier"], row["name"], str(row["count"]))
    console.print(view)


@cli.command("release")
def release(
    key: Annotated[str, typer.Argument(help="semaphore key, as `show` prints it")],
    holder: Annotated[str, typer.Argument(help="holder id, as `show` prints it")],
) -> None:
    """Free one holder's slot by hand (a holder known dead whose lease is long)."""
    from jobs import app
    from resilience.ratelimit import LEASE, RedisBackend
    from resilience.stores import stores_for

    released = RedisBackend(stores_for(app).redis).release(LEASE, key, holder)
    console.print(f"{key}: {holder} {'released' if released else 'was not holding a slot'}")
