"""The limits' view: rate and concurrency limits the registered tasks configure, slots in
use and the deferrals counted so far."""

from __future__ import annotations

from collections import Counter
from typing import Any

from resilience.ratelimit.algorithms import ALGORITHMS, LEASE
from resilience.ratelimit.backends.redis import RedisBackend
from resilience.views import Column, Family, Row, Source, View, counted, number, per_row

#: The `guard` labels of the limits' counters.
GUARDS = ("concurrency", "rate-limit")


def read(source: Source) -> dict[str, Any]:
    """Configuration, slots in use and deferrals of every declared limit.

    Slots in use are read for the declared names only (no SCAN): a concurrency limit keyed
    per argument has one semaphore per key, which only a SCAN could enumerate, so its
    `in_use` is None here (`jobs limits` lists every key).
    """
    deferred: Counter[tuple[str, str]] = Counter()
    for c in source.counted(GUARDS):
        if c["outcome"] == "DEFERRED":
            deferred[(c["guard"], c.get("name") or "")] += c["value"]
    backend = RedisBackend(source.redis())
    concurrency, rates, seen = [], [], set()
    for task, guard in source.guards_named(*GUARDS):
        config, kind = guard.config, guard.name
        if (kind, config.name) in seen:
            continue
        seen.add((kind, config.name))
        row = {"name": config.name, "deferred": deferred[(kind, config.name)], "task": task.name}
        if kind == "concurrency":
            keyed = getattr(guard, "keys", None) is not None
            # One pipeline (server TIME + the lease set): live leases are in use, a lapsed
            # one is free again.
            used = (None if keyed else
                    sum(state.used for state in backend.describe(LEASE, key=config.name)))
            concurrency.append({**row, "limit": config.limit, "in_use": used, "keyed": keyed})
        else:
            rates.append({**row, "rate": str(getattr(config, "rate", "")),
                          "algorithm": getattr(config, "algorithm", "")})
    return {"concurrency": concurrency, "rate": rates}


def rows(section: dict[str, Any]) -> list[Row]:
    """One table row per limit, concurrency first."""
    return ([{"kind": "concurrency", "name": row["name"], "configured": number(row["limit"]),
              "in_use": "per key (jobs limits)" if row.get("keyed") else number(row["in_use"]),
              "deferred": row["deferred"]} for row in section["concurrency"]]
            + [{"kind": f"rate ({row['algorithm']})", "name": row["name"],
                "configured": row["rate"], "in_use": "", "deferred": row["deferred"]}
               for row in section["rate"]])


VIEW = View(
    name="limits", title="limits", store="redis", read=read, rows=rows,
    columns=(
        Column(header="kind", key="kind"),
        Column(header="limit", key="name"),
        Column(header="configured", key="configured"),
        Column(header="in use", key="in_use"),
        Column(header="deferred", key="deferred"),
    ),
    metrics=(
        Family(name="jobs_limit_decisions",
               help="Rate/concurrency limit decisions that stopped or passed a call",
               kind="counter", labels=("kind", "limit", "outcome"),
               needs_section=False,
               samples=lambda _, snapshot: (
                   ([c["guard"], c.get("name", ""), c["outcome"]], c["value"])
                   for c in counted(snapshot["counters"], GUARDS))),
        # None in use: keyed per argument, not enumerated.
        Family(name="jobs_concurrency_in_use", help="Concurrency slots held now",
               labels=("limit",),
               samples=per_row("in_use", rows="concurrency")),
        Family(name="jobs_concurrency_limit", help="Concurrency slots configured",
               labels=("limit",),
               samples=per_row("limit", rows="concurrency")),
    ),
)


#: How a rate algorithm's figures read in a cell (`LimiterState.figures`); others as "N name".
FIGURES = {"ahead_seconds": "{:.3f}s ahead", "in_window": "{} in window"}


def stored(source: Source) -> dict[str, list[Row]]:
    """Every limiter with state in Redis (one SCAN: `jobs limits show`), decoded by the
    backend (a key too long to keep readable shows as its digest, `#<sha256>`); lease times
    on Redis server time. Lapsed leases are not shown."""
    states = RedisBackend(source.redis()).describe()
    return {
        "semaphores": [
            {"key": state.key, "holders": {lease.owner: round(lease.expires_in_seconds, 3)
                                           for lease in state.holders if lease.alive}}
            for state in states if ALGORITHMS[state.algorithm].holds],
        "rates": [
            {"key": state.key, "algorithm": ALGORITHMS[state.algorithm].namespace,
             **state.figures, "waiting": state.waiting}
            for state in states if not ALGORITHMS[state.algorithm].holds],
    }


def _figures(row: Row) -> str:
    return ", ".join(FIGURES.get(name, f"{{:g}} {name}").format(value)
                     for name, value in row.items() if name not in ("key", "algorithm", "waiting"))


SEMAPHORES = View(
    name="semaphores", title="concurrency limits (lease semaphores)", store="redis",
    read=lambda source: stored(source)["semaphores"],
    columns=(
        Column(header="key", key="key"),
        Column(header="holders", text=lambda r: str(len(r["holders"]))),
        Column(header="lease left (s) per holder", text=lambda r: ", ".join(
            f"{holder}: {left:.1f}" for holder, left in r["holders"].items())),
    ),
)

RATES = View(
    name="rates", title="rate limits", store="redis",
    read=lambda source: stored(source)["rates"],
    columns=(Column(header="key", key="key"), Column(header="algorithm", key="algorithm"),
             Column(header="state", text=_figures), Column(header="waiting", key="waiting")),
)
