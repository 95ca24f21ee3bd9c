"""One function collecting the whole platform state as a JSON-able dict.

`collect(app)` is what `jobs status`, the Flower page and `/api/resilience` show. Each
section is gathered on its own, in its own `try`: a store that is down or a guard package
that is not installed turns that section into `{"unavailable": "<reason>"}` and the other
sections still show. Cost: one HGETALL for every counter, one pipelined LLEN per broker,
a SCAN plus one pipeline per Redis-held guard kind, three SQL statements, one broadcast.

Configured guards (breaker thresholds, retry budgets, limits) are found on the app's
registered tasks, so the view shows a limit even before it has any state in Redis.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from resilience.redact import redact

if TYPE_CHECKING:
    import redis
    from celery import Celery

logger = logging.getLogger("jobs.observe.snapshot")

#: Section names in the order views show them.
SECTIONS = (
    "tiers", "breakers", "budgets", "limits", "locks", "idempotency", "outbox", "beat_leader",
)

#: Counter outcomes summed per tier in the tiers section.
TIER_OUTCOMES = {
    "rejected": "REJECTED",
    "discarded": "DISCARDED",
    "shed": "SHED",
    "deferred": "DEFERRED",
    "replayed": "REPLAYED",
    "skipped": "SKIPPED",
    "retried": "RETRY",
    "dead_lettered": "DEAD-LETTERED",
}

SCAN_COUNT = 1000


def unavailable(reason: str) -> dict[str, str]:
    """The value of a section that could not be read."""
    return {"unavailable": reason}


def _reason(exc: BaseException) -> str:
    text = redact(str(exc).strip().splitlines()[0]) if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


def _section(name: str, errors: dict[str, str], read: Callable[[], Any]) -> Any:
    try:
        return read()
    except Exception as exc:  # noqa: BLE001 - one broken section must not hide the others
        logger.warning("snapshot section %s unavailable: %s", name, redact(str(exc)))
        errors[name] = _reason(exc)
        return unavailable(errors[name])


# -- what the app configures ----------------------------------------------------------------
def configured_guards(app: Celery) -> list[tuple[Any, Any]]:
    """(task, guard) for every execution guard of every registered platform task."""
    found = []
    for name, task in sorted(app.tasks.items()):
        if name.startswith("celery.") or not hasattr(task, "pipelines"):
            continue
        try:
            execution, _ = task.pipelines()
        except Exception as exc:  # noqa: BLE001 - a broken task must not hide the view
            logger.warning("guards of %s unreadable: %s", name, redact(str(exc)))
            continue
        found.extend((task, guard) for guard in execution.guards)
    return found


def _guards_of(app: Celery, kind: str) -> list[tuple[Any, Any]]:
    return [(task, guard) for task, guard in configured_guards(app)
            if getattr(guard, "name", None) == kind]


# -- sections ----------------------------------------------------------------------------
def queue_depths(app: Celery, tiers: Iterable[str]) -> dict[str, int]:
    """Messages waiting per tier queue: one pipelined LLEN on Redis, passive declares on AMQP."""
    from resilience.bulkhead import depth_backend_for
    from resilience.bulkhead.backends.broker import RedisBrokerDepth

    tiers = list(tiers)
    backend = depth_backend_for(app)
    if isinstance(backend, RedisBrokerDepth):
        with backend.client().pipeline(transaction=False) as pipe:
            for tier in tiers:
                for name in backend.lists(tier):
                    pipe.llen(name)
            sizes = pipe.execute()
        steps = len(backend.lists(tiers[0])) if tiers else 0
        return {tier: sum(int(s) for s in sizes[i * steps:(i + 1) * steps])
                for i, tier in enumerate(tiers)}
    return {tier: backend.depth(tier) for tier in tiers}


def active_tasks(app: Celery, timeout_seconds: float) -> dict[str, Any]:
    """Tasks running now per tier, from `inspect().active()`; no reply counts as none."""
    from jobs.tiers import TIERS

    replies = app.control.inspect(timeout=timeout_seconds).active() or {}
    per_tier = dict.fromkeys(TIERS, 0)
    for node, tasks in replies.items():
        for task in tasks or []:
            tier = (task.get("delivery_info") or {}).get("routing_key") or node.split("@")[0]
            if tier in per_tier:
                per_tier[tier] += 1
    return {"per_tier": per_tier, "workers": sorted(replies)}


def outcome_counters(client: redis.Redis) -> list[dict[str, Any]]:
    """Every fleet-wide decision counter as {outcome, tier, guard, name, value}."""
    from resilience.counters import read_all

    return [{**labels, "value": value} for labels, value in sorted(
        read_all(client), key=lambda item: sorted(item[0].items()))]


def tiers_section(app: Celery, counters: Any, depths: Any, active: Any) -> dict[str, Any]:
    """Per tier: depth against its limit (FULL at or over it), active, and refusals by kind."""
    from jobs.tiers import TIERS

    settings = app.settings
    tiers: dict[str, Any] = {}
    for tier in TIERS:
        limits = settings.tier(tier)
        row: dict[str, Any] = {
            "max_queue_depth": limits.max_queue_depth,
            "rejection_policy": limits.rejection_policy,
            "concurrency": limits.concurrency,
        }
        if isinstance(depths, dict) and "unavailable" not in depths:
            row["depth"] = depths[tier]
            row["full"] = depths[tier] >= limits.max_queue_depth
        else:
            row["depth"] = None
            row["full"] = None
        row["active"] = (active["per_tier"].get(tier, 0)
                         if isinstance(active, dict) and "per_tier" in active else None)
        for column, outcome in TIER_OUTCOMES.items():
            if isinstance(counters, list):
                row[column] = sum(c["value"] for c in counters
                                  if c.get("tier") == tier and c.get("outcome") == outcome)
            else:
                row[column] = None
        if isinstance(counters, list):
            by_guard: dict[str, dict[str, int]] = {}
            for c in counters:
                if c.get("tier") == tier:
                    guard = by_guard.setdefault(c.get("guard") or "-", {})
                    guard[c["outcome"]] = guard.get(c["outcome"], 0) + c["value"]
            row["by_guard"] = by_guard
        tiers[tier] = row
    return tiers


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def breakers_section(app: Celery, client: redis.Redis) -> list[dict[str, Any]]:
    """Every breaker with state in Redis or configured on a task: state and failure rate.

    Read by the circuit package (`RedisBreakerBackend.describe`: one SCAN, one pipeline).
    """
    from resilience.circuit.backends.redis import RedisBreakerBackend

    configs = {guard.config.name: guard.config for _, guard in _guards_of(app, "breaker")}
    states = RedisBreakerBackend(lambda: client).describe(configs, include_stored=True)
    return [
        {
            "name": state.name,
            "state": state.state,
            "open": state.open,
            "calls": state.calls,
            "failures": state.failures,
            "slow_calls": state.slow_calls,
            "failure_rate": round(state.failure_rate, 4),
            "failure_rate_threshold": getattr(
                configs.get(state.name), "failure_rate_threshold", None
            ),
            "times_opened": state.times_opened,
            "seconds_in_state": _rounded(state.seconds_in_state, 1),
            "retry_in_seconds": _rounded(state.retry_in_seconds, 1),
        }
        for state in states
    ]


def budgets_section(app: Celery, client: redis.Redis) -> list[dict[str, Any]]:
    """Retry budgets: requests and retries in the window, and the share of the budget used.

    Read by the retry package (`RedisBudgetBackend.describe`: one SCAN, one pipeline); a
    budget no loaded task configures is read with the default window.
    """
    from resilience.retry.budget import RedisBudgetBackend

    configs: dict[str, Any] = {}
    for task, guard in _guards_of(app, "retry"):
        budget = getattr(getattr(guard, "policy", None), "budget", None)
        if budget is not None:
            configs[guard.policy.dependency or task.name] = budget
    states = RedisBudgetBackend(lambda: client).describe(configs, include_stored=True)
    return [
        {
            "dependency": state.dependency,
            "requests": state.requests,
            "retries": state.retries,
            "retries_allowed": round(state.retries_allowed, 2),
            "used": round(state.used, 4),
            "ratio": state.ratio,
            "window_seconds": state.window_seconds,
            "configured": state.dependency in configs,
        }
        for state in states
    ]


def limits_section(app: Celery, client: redis.Redis, counters: Any) -> dict[str, Any]:
    """Rate and concurrency limits: configuration, slots in use, and deferrals so far."""
    deferred: dict[tuple[str, str], int] = {}
    if isinstance(counters, list):
        for c in counters:
            if c.get("guard") in ("concurrency", "rate-limit"):
                key = (c["guard"], c.get("name") or "")
                deferred[key] = deferred.get(key, 0) + (
                    c["value"] if c["outcome"] == "DEFERRED" else 0)
    from resilience.ratelimit import LEASE, RedisBackend

    # Every semaphore with state (one SCAN, one pipeline, on Redis server time), as the
    # limiter's backend decodes it: live leases are in use, a lapsed one is free again.
    in_use = {state.key: state.used for state in RedisBackend(client).describe(LEASE)}
    concurrency, rates, seen = [], [], set()
    for task, guard in configured_guards(app):
        config = getattr(guard, "config", None)
        kind = getattr(guard, "name", None)
        if kind not in ("concurrency", "rate-limit") or (kind, config.name) in seen:
            continue
        seen.add((kind, config.name))
        if kind == "concurrency":
            used = sum(n for k, n in in_use.items()
                       if k == config.name or k.startswith(f"{config.name}:"))
            concurrency.append({"name": config.name, "limit": config.limit, "in_use": used,
                                "deferred": deferred.get((kind, config.name), 0),
                                "task": task.name})
        else:
            rates.append({"name": config.name, "rate": str(getattr(config, "rate", "")),
                          "algorithm": getattr(config, "algorithm", ""),
                          "deferred": deferred.get((kind, config.name), 0),
                          "task": task.name})
    known = {row["name"] for row in concurrency}
    for key, used in sorted(in_use.items()):
        if not any(key == name or key.startswith(f"{name}:") for name in known):
            concurrency.append({"name": key, "limit": None, "in_use": used,
                                "deferred": 0, "task": None})
    return {"concurrency": concurrency, "rate": rates}


def held_locks(app: Celery) -> list[dict[str, Any]]:
    """Every lock held now (and the beat leader): `resilience.locks.describe`.

    Each registry row is checked against the real lock (the advisory lock in `pg_locks`, the
    owner on the Redlock nodes): a row a dead holder left behind is marked `stale`.
    """
    from resilience.locks import describe
    from resilience.stores import stores_for

    stores = stores_for(app)
    return [
        {"key": holder.key, "kind": holder.kind, "holder": holder.owner or "-",
         "held_seconds": round(holder.held_seconds or 0.0, 1), "token": holder.token,
         "stale": not holder.alive}
        for holder in describe(stores, stores.redlock_urls)
    ]


def locks_section(held: Any) -> dict[str, Any]:
    """Locks held now (singleton and exclusive), oldest first; the beat leader apart."""
    if not isinstance(held, list):
        return held
    locks = [lock for lock in held if lock["kind"] != "beat-leader"]
    return {"count": sum(1 for lock in locks if not lock["stale"]), "held": locks}


def idempotency_section(app: Celery) -> dict[str, Any]:
    """Idempotency records by state and the oldest open claims' holders
    (`resilience.idempotency.describe`: two statements; the cache is not scanned)."""
    from resilience.idempotency import describe
    from resilience.stores import stores_for

    return describe(stores_for(app), holders_limit=20, cache_size=False).as_dict()


def outbox_section(app: Celery) -> dict[str, Any]:
    """Outbox rows pending (due, scheduled), the relay's lag, published in the last minute
    (`resilience.outbox.describe`: one statement)."""
    from resilience.outbox import describe
    from resilience.stores import stores_for

    return describe(stores_for(app)).as_dict()


def beat_leader_section(held: Any) -> dict[str, Any]:
    """The beat process holding the leader lock (None when no beat leads)."""
    if not isinstance(held, list):
        return held
    for lock in held:
        if lock["kind"] == "beat-leader":
            return {"leader": lock["holder"], "leading_seconds": lock["held_seconds"]}
    return {"leader": None}


# -- the whole ---------------------------------------------------------------------------
def collect(app: Celery, *, inspect_timeout_seconds: float = 1.0,
            active: bool = True) -> dict[str, Any]:
    """The platform's resilience state; a section that cannot be read says why.

    Args:
        app: the platform's Celery app (its settings give tier limits).
        inspect_timeout_seconds: how long to wait for workers' `active` replies.
        active: ask the workers what runs now (one broadcast); False skips it.
    """
    from jobs.tiers import TIERS
    from resilience.stores import stores_for

    started = time.perf_counter()
    errors: dict[str, str] = {}

    def client() -> redis.Redis:
        return stores_for(app).redis()

    counters = _section("counters", errors, lambda: outcome_counters(client()))
    depths = _section("queue_depth", errors, lambda: queue_depths(app, TIERS))
    running = (_section("active", errors, lambda: active_tasks(app, inspect_timeout_seconds))
               if active else unavailable("not asked"))
    held = _section("held_locks", errors, lambda: held_locks(app))
    snapshot: dict[str, Any] = {
        "taken_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "tiers": _section("tiers", errors,
                          lambda: tiers_section(app, counters, depths, running)),
        "breakers": _section("breakers", errors, lambda: breakers_section(app, client())),
        "budgets": _section("budgets", errors, lambda: budgets_section(app, client())),
        "limits": _section("limits", errors, lambda: limits_section(app, client(), counters)),
        "locks": _section("locks", errors, lambda: locks_section(held)),
        "idempotency": _section("idempotency", errors, lambda: idempotency_section(app)),
        "outbox": _section("outbox", errors, lambda: outbox_section(app)),
        "beat_leader": _section("beat_leader", errors, lambda: beat_leader_section(held)),
        "counters": counters,
        "workers": running.get("workers") if isinstance(running, dict) else None,
    }
    snapshot["errors"] = errors
    snapshot["collect_seconds"] = round(time.perf_counter() - started, 3)
    return snapshot
