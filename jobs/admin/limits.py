"""`jobs limits`: tier bulkheads, concurrency semaphores, rate limiters and their counters."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from jobs.admin.status import console, platform_source, print_view, table
from resilience.admission import RedisBrokerDepth, depth_backend_for
from resilience.counters import read_all
from resilience.ratelimit import LEASE, RedisBackend
from resilience.ratelimit.view import RATES, SEMAPHORES, stored
from resilience.views import Column, Source, View

cli = typer.Typer(
    help="Overload control: bulkheads, semaphores, rate limits.", no_args_is_help=True
)

#: Guards whose counters this view shows.
GUARDS = ("bulkhead", "concurrency", "rate-limit", "deadline")


def bulkheads(source: Source) -> list[dict[str, Any]]:
    """Each tier's queue depth and reservations against its limit and rejection policy."""
    depth = depth_backend_for(source.app)
    return [{"tier": tier, "depth": depth.depth(tier),
             "reserved": depth.reserved(tier) if isinstance(depth, RedisBrokerDepth) else 0,
             "max_queue_depth": source.app.settings.tier(tier).max_queue_depth,
             "policy": source.app.settings.tier(tier).rejection_policy,
             "wait_timeout_seconds": source.app.settings.tier(tier).wait_timeout_seconds}
            for tier in source.tiers]


def decisions(source: Source) -> list[dict[str, Any]]:
    """The fleet-wide counters of the overload guards, by guard, outcome and name."""
    return sorted(({**labels, "count": value} for labels, value in read_all(source.redis())
                   if labels.get("guard") in GUARDS),
                  key=lambda r: (r["guard"], r["outcome"], r["name"]))


BULKHEADS = View(
    name="tiers", title="tier bulkheads", store="broker", read=bulkheads,
    columns=(*(Column(header=h, key=k) for h, k in (
        ("tier", "tier"), ("depth", "depth"), ("reserved", "reserved"),
        ("limit", "max_queue_depth"), ("policy", "policy"))),
        Column(header="wait s", text=lambda r: f"{r['wait_timeout_seconds']:g}")),
)
DECISIONS = View(
    name="counters", title="decisions (fleet-wide counters)", store="redis", read=decisions,
    columns=tuple(Column(header=h, key=h) for h in ("guard", "outcome", "tier", "name", "count")),
)


def snapshot() -> dict[str, Any]:
    """Everything `jobs limits show` prints, as plain data."""
    read = platform_source()
    return {"tiers": bulkheads(read), **stored(read), "counters": decisions(read)}


@cli.command("show")
def show(as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False) -> None:
    """Tier queue depth against its limit, semaphore holders, rate limiter state, counters."""
    state = snapshot()
    if as_json:
        typer.echo(json.dumps(state))
        return
    for view in (BULKHEADS, SEMAPHORES, RATES, DECISIONS):
        print_view(table(view, state[view.name]))


@cli.command("release")
def release(
    key: Annotated[str, typer.Argument(help="semaphore key, as `show` prints it")],
    holder: Annotated[str, typer.Argument(help="holder id, as `show` prints it")],
) -> None:
    """Free one holder's slot by hand (a holder known dead whose lease is long)."""
    released = RedisBackend(platform_source().redis()).release(LEASE, key, holder)
    console.print(f"{key}: {holder} {'released' if released else 'was not holding a slot'}")
