"""One function collecting the whole platform state as a JSON-able dict.

`collect(app)` is what `jobs status`, the Flower page and `/api/resilience` show. Each
section is gathered on its own, in its own `try`: a store that is down or a guard package
that is not installed turns that section into `{"unavailable": "<reason>"}` and the other
sections still show. Cost: one HGETALL for every counter, one pipelined LLEN per broker,
one MGET / pipeline per Redis-held guard kind (pause switches, breakers, budgets) plus one
small pipeline per declared concurrency limit, four SQL statements (live cancellations
included), one broadcast.

No SCAN: this runs on every metrics scrape, `jobs status` and web page refresh, and a SCAN
walks the whole keyspace whatever its pattern (~170 ms per 200k keys, on the Redis every
guard waits on). The names read are the registry the app declares: its tiers and the
guards of its registered tasks (every worker, exporter and CLI imports the same app), so
the view shows a limit even before it has any state in Redis. State under a name no task
declares (a breaker used by hand, a switch on a task name this app lacks, keyed concurrency
limits per key) is listed by the admin commands, which do SCAN on request (`jobs breakers
list`, `jobs paused`, `jobs limits`).

`probe_stores(settings)` asks each store once, quickly (`jobs status` does, before
collecting): a store that cannot serve becomes one `StoreStatus` saying which store, why,
and what to do (start the platform, set its URL, run `jobs migrate`), and `collect(app,
stores=...)` skips the sections that would only wait on it.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from resilience.redact import redact, redact_url

if TYPE_CHECKING:
    import redis
    from celery import Celery

    from jobs.settings import Settings

logger = logging.getLogger("jobs.observe.snapshot")

#: Section names in the order views show them.
SECTIONS = (
    "tiers", "paused", "cancellations", "breakers", "budgets", "limits", "locks",
    "idempotency", "outbox", "batches", "beat_leader",
)

#: Newest live cancellations the snapshot lists.
CANCELLATIONS_SHOWN = 50
#: Newest batches the snapshot lists (`jobs batches list` shows more).
BATCHES_SHOWN = 10

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


#: The store each store-reading part of the snapshot needs (tiers, locks and beat_leader
#: are derived from these parts).
SECTION_STORES = {
    "counters": "redis",
    "queue_depth": "broker",
    "active": "broker",
    "held_locks": "database",
    "paused": "redis",
    "cancellations": "database",
    "batches": "database",
    "breakers": "redis",
    "budgets": "redis",
    "limits": "redis",
    "idempotency": "database",
    "outbox": "database",
}

#: What a store that cannot be reached tells the operator to do.
START_HINT = "start the platform with `make run` (or `jobs up`), or set {variable}"
MIGRATE_HINT = "run `jobs migrate`"


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


# -- can the stores serve? ---------------------------------------------------------------
#: How each problem reads in a message.
PROBLEMS = {"unreachable": "unreachable", "refused": "refused the connection",
            "not_migrated": "not migrated"}

#: Connection failures (message pattern, reason shown): the server is not there.
_UNREACHABLE = (
    (re.compile(r"connection refused", re.I), "Connection refused"),
    (re.compile(r"timed out|timeout", re.I), "no answer in time (timed out)"),
    (re.compile(r"name or service not known|could not translate host name|nodename nor "
                r"servname|name resolution|no address associated", re.I), "unknown host"),
    (re.compile(r"no route to host|network is unreachable", re.I), "no route to host"),
    (re.compile(r"no such file or directory", re.I), "no socket at that path"),
    (re.compile(r"protocol error|invalid response|unexpected response|wrong version number",
                re.I), "what answers there is not {server}"),
)
#: The server answered and said no.
_REFUSED = re.compile(r"authentication|password|wrongpass|noauth|not authorized|permission "
                      r"denied|access refused|pg_hba", re.I)
_MISSING_DATABASE = re.compile(r'database "([^"]*)" does not exist', re.I)


@dataclass(frozen=True, kw_only=True)
class StoreStatus:
    """What a quick probe found for one store the snapshot reads, and what to do about it.

    `problem` is None when the store serves, else `unreachable` (no connection), `refused`
    (it answered but refused: credentials) or `not_migrated` (PostgreSQL without the schema).
    """

    store: str  #: broker, redis or database
    server: str  #: Redis, RabbitMQ or PostgreSQL
    role: str  #: what the platform keeps there
    url: str  #: the URL, password masked
    variable: str  #: the environment variable that sets the URL
    problem: str | None = None
    reason: str = ""
    fix: str = ""

    @property
    def ok(self) -> bool:
        """The store answered (and, for PostgreSQL, every migration is applied)."""
        return self.problem is None

    @property
    def summary(self) -> str:
        """Why a section reading this store is missing: `Redis (guard state) unreachable ...`."""
        problem = PROBLEMS.get(self.problem or "", "serves")
        return f"{self.server} ({self.role}) {problem} ({self.reason}); {self.fix}"

    def as_dict(self) -> dict[str, Any]:
        """JSON form (the `stores` and `unavailable` entries of the snapshot)."""
        return {**asdict(self), "ok": self.ok}


def url_variable(field: str, default: str) -> str:
    """The environment variable settings `field` is read from (`JOBS_REDIS_URL` when that
    one is set, `REDIS_URL` ...); `default` when none of its names is set."""
    from jobs.settings import Settings

    alias = Settings.model_fields[field].validation_alias
    names = [name for name in getattr(alias, "choices", ()) if isinstance(name, str)
             and name.isupper()]
    present = {key.upper() for key in os.environ}
    return next((name for name in names if name in present), default)


def _probe_redis(url: str, timeout_seconds: float) -> None:
    """PING with a client of our own: short timeouts and no retries (redis-py's default
    retries with backoff are what made a down Redis cost seconds)."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from resilience.stores import redis_from_url

    client = redis_from_url(url, socket_connect_timeout=timeout_seconds,
                            socket_timeout=timeout_seconds, retry=Retry(NoBackoff(), 0))
    try:
        client.ping()
    finally:
        client.close()


def _probe_amqp(url: str, timeout_seconds: float) -> None:
    from kombu import Connection

    with Connection(url, connect_timeout=timeout_seconds) as connection:
        connection.ensure_connection(max_retries=1, interval_start=0, interval_step=0,
                                     timeout=timeout_seconds)


@lru_cache(maxsize=4)
def _migration_heads(database_url: str) -> dict[str, frozenset[str]]:
    """Each version table and its history's heads (the library's and the platform's), read
    from the scripts once per process."""
    from jobs.db import expected_versions

    return expected_versions(database_url)


def _probe_database(url: str, timeout_seconds: float) -> tuple[str, str, str] | None:
    """Connect with psycopg2 alone (no engine, no pool: SQLAlchemy's import alone costs
    more than the probe) and compare the applied migrations with the code's heads.

    Returns None when migrated, else (problem, reason, fix); raises when unreachable.
    """
    import psycopg2

    # libpq reads `postgresql://`, not SQLAlchemy's `postgresql+psycopg2://`; its
    # connect_timeout is whole seconds and at least 2; a TCP user timeout of the same bound
    # ends a query whose server was cut off after the connect (a partition).
    dsn = re.sub(r"^postgres(?:ql)?(?:\+\w+)?://", "postgresql://", url)
    bound = max(2, math.ceil(timeout_seconds))
    connection = psycopg2.connect(dsn, connect_timeout=bound, tcp_user_timeout=bound * 1000)
    expected = _migration_heads(url)
    applied: set[str] = set()
    try:
        with connection.cursor() as cursor:
            for table in expected:  # names of our own, never user input
                cursor.execute("SELECT to_regclass(%s) IS NOT NULL", (table,))
                row = cursor.fetchone()
                if row and row[0]:
                    cursor.execute(f"SELECT version_num FROM {table}")
                    applied |= {version for (version,) in cursor.fetchall()}
    finally:
        connection.close()
    missing = frozenset().union(*expected.values()) - applied
    if not missing:
        return None
    reason = ("no migration applied" if not applied
              else f"{len(missing)} migration(s) not applied: {', '.join(sorted(missing))}")
    return "not_migrated", reason, MIGRATE_HINT


def _diagnose(exc: BaseException, server: str, variable: str) -> tuple[str, str, str]:
    """(problem, reason, fix) for a probe's error, in words: never the driver's traceback."""
    text = " ".join(str(exc).split())
    missing = _MISSING_DATABASE.search(text)
    if missing:
        return ("not_migrated", f'database "{missing.group(1)}" does not exist',
                f"{MIGRATE_HINT} (it creates the database)")
    for pattern, reason in _UNREACHABLE:
        if pattern.search(text):
            return ("unreachable", reason.format(server=server),
                    START_HINT.format(variable=variable))
    if _REFUSED.search(text):
        return "refused", "authentication failed", f"check the credentials in {variable}"
    reason = redact(text)[:160] or type(exc).__name__
    return "unreachable", reason, START_HINT.format(variable=variable)


def probe_stores(settings: Settings, *, timeout_seconds: float = 1.0) -> dict[str, StoreStatus]:
    """Can each store the snapshot reads serve? One quick connection each, in parallel.

    The probe uses clients of its own (short timeouts, no retries), so `jobs status` with
    nothing running answers within about a second; the platform's clients and timeouts are
    untouched. A broker on the guard-state Redis URL is probed once.

    Args:
        settings: the platform settings (the URLs; no app is needed).
        timeout_seconds: connect and read timeout of each probe (PostgreSQL: at least 2).

    Returns:
        `StoreStatus` by store: `broker`, `redis`, `database`.
    """
    redis_url = settings.effective_redis_url
    broker_url = settings.effective_broker_url
    database_url = settings.effective_database_url
    redis_variable = url_variable("redis_url", "REDIS_URL")
    broker_variable = (url_variable("broker_url", "BROKER_URL") if settings.broker_url
                       else redis_variable)
    database_variable = url_variable("database_url", "DATABASE_URL")
    broker_server = "Redis" if settings.broker_is_redis else "RabbitMQ"

    def run(check: Callable[[], tuple[str, str, str] | None], server: str,
            variable: str) -> tuple[str | None, str, str]:
        try:
            return check() or (None, "", "")
        except Exception as exc:  # noqa: BLE001 - every failure is reported, in words
            return _diagnose(exc, server, variable)

    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="status-probe") as pool:
        redis_result = pool.submit(run, lambda: _probe_redis(redis_url, timeout_seconds),
                                   "Redis", redis_variable)
        if broker_url == redis_url:
            broker_result = redis_result
        else:
            probe = _probe_redis if settings.broker_is_redis else _probe_amqp
            broker_result = pool.submit(run, lambda: probe(broker_url, timeout_seconds),
                                        broker_server, broker_variable)
        database_result = pool.submit(
            run, lambda: _probe_database(database_url, timeout_seconds), "PostgreSQL",
            database_variable)
    found = {}
    for store, server, role, url, variable, result in (
        ("broker", broker_server, "broker", broker_url, broker_variable, broker_result),
        ("redis", "Redis", "guard state", redis_url, redis_variable, redis_result),
        ("database", "PostgreSQL", "durable state", database_url, database_variable,
         database_result),
    ):
        problem, reason, fix = result.result()
        found[store] = StoreStatus(store=store, server=server, role=role, url=redact_url(url),
                                   variable=variable, problem=problem, reason=reason, fix=fix)
    return found


def problem_lines(snapshot: dict[str, Any]) -> list[str]:
    """One line per store that cannot serve: which, where, why, and what to do.

    Two roles on one server with the same problem (the broker on the guard-state Redis)
    make one line: `Redis (broker and guard state) at redis://...: unreachable (...); ...`.
    """
    merged: dict[tuple[str, ...], list[str]] = {}
    for entry in (snapshot.get("unavailable") or {}).values():
        key = (entry["server"], entry["url"], entry["problem"], entry["reason"], entry["fix"])
        merged.setdefault(key, []).append(entry["role"])
    return [f"{server} ({' and '.join(roles)}) at {url}: {PROBLEMS[problem]} ({reason}); {fix}"
            for (server, url, problem, reason, fix), roles in merged.items()]


def _store_keys(stores: dict[str, StoreStatus] | None) -> dict[str, Any]:
    if stores is None:
        return {"stores": None, "unavailable": None}
    return {"stores": {name: status.as_dict() for name, status in stores.items()},
            "unavailable": {name: status.as_dict() for name, status in stores.items()
                            if not status.ok}}


def unreachable_snapshot(stores: dict[str, StoreStatus]) -> dict[str, Any]:
    """The snapshot when no store can serve: the same keys, every section saying why.

    Built without the Celery app (nothing could be read), so it costs nothing.
    """
    started = time.perf_counter()
    derived = {"tiers": "broker", "locks": "database", "beat_leader": "database"}
    errors = {name: stores[SECTION_STORES.get(name) or derived[name]].summary
              for name in ("counters", "queue_depth", "active", "held_locks", *SECTIONS)}
    snapshot: dict[str, Any] = {
        "taken_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        **_store_keys(stores),
        **{name: unavailable(errors[name]) for name in SECTIONS},
        "counters": unavailable(errors["counters"]),
        "workers": None,
        "errors": errors,
    }
    snapshot["collect_seconds"] = round(time.perf_counter() - started, 3)
    return snapshot


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


def declared_switches(app: Celery) -> list[tuple[str, str]]:
    """The pause switches a job of `app` can hit: one per tier, one per registered task."""
    from jobs.tiers import TIERS

    tasks = [name for name, task in app.tasks.items()
             if not name.startswith("celery.") and hasattr(task, "pipelines")]
    return [("tier", tier) for tier in TIERS] + [("task", name) for name in sorted(tasks)]


def paused_section(app: Celery) -> list[dict[str, Any]]:
    """Declared pause switches that are on (one MGET over `declared_switches`), as `jobs
    paused` lists them: what is paused, why, and since when."""
    from jobs.platform import pause_backend

    now = time.time()
    switches = sorted(pause_backend(app).paused(declared_switches(app)),
                      key=lambda switch: (switch.scope, switch.name))
    return [
        {"scope": switch.scope, "name": switch.name, "reason": switch.reason,
         "since": dt.datetime.fromtimestamp(switch.since_epoch_seconds, dt.UTC)
         .isoformat(timespec="seconds"),
         "paused_seconds": round(max(0.0, now - switch.since_epoch_seconds), 1)}
        for switch in switches
    ]


def cancellations_section(app: Celery) -> list[dict[str, Any]]:
    """Live cancellations, newest first (`Cancellations.describe`: one statement), at most
    `CANCELLATIONS_SHOWN` (`jobs cancellations list` shows them all)."""
    from jobs.platform import cancellations

    return [
        {"target": entry.target, "task_name": entry.task_name, "task_id": entry.task_id,
         "key": entry.key, "reason": entry.reason,
         "created_at": entry.created_at.isoformat(timespec="seconds"),
         "expires_at": entry.expires_at.isoformat(timespec="seconds")}
        for entry in cancellations(app).describe(limit=CANCELLATIONS_SHOWN)
    ]


def batches_section(app: Celery) -> list[dict[str, Any]]:
    """The newest batches, newest first: members per final state and whether they are
    complete (`resilience.batches.recent`: one statement)."""
    from resilience.batches import recent
    from resilience.stores import stores_for

    return [
        {"id": summary.id, "description": summary.description, "total": summary.total,
         "pending": summary.pending,
         "tallies": {state: count for state, count in summary.tallies.items() if count},
         "created_at": summary.created_at.isoformat(timespec="seconds"),
         "completed_at": (summary.completed_at.isoformat(timespec="seconds")
                          if summary.completed_at else None)}
        for summary in recent(stores_for(app), limit=BATCHES_SHOWN)
    ]


def breakers_section(app: Celery, client: redis.Redis) -> list[dict[str, Any]]:
    """Every breaker configured on a registered task: state and failure rate.

    Read by the circuit package (`RedisBreakerBackend.describe` of the declared names: one
    pipeline, no SCAN; `jobs breakers list` also shows undeclared ones).
    """
    from resilience.circuit.backends.redis import RedisBreakerBackend

    configs = {guard.config.name: guard.config for _, guard in _guards_of(app, "breaker")}
    states = RedisBreakerBackend(lambda: client).describe(configs)
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

    Read by the retry package (`RedisBudgetBackend.describe` of the budgets the registered
    tasks configure: one pipeline, no SCAN).
    """
    from resilience.retry.budget import RedisBudgetBackend

    configs: dict[str, Any] = {}
    for task, guard in _guards_of(app, "retry"):
        budget = getattr(getattr(guard, "policy", None), "budget", None)
        if budget is not None:
            configs[guard.policy.dependency or task.name] = budget
    states = RedisBudgetBackend(lambda: client).describe(configs)
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
    """Rate and concurrency limits: configuration, slots in use, and deferrals so far.

    Slots in use are read for the declared names only (no SCAN): a concurrency limit keyed
    per argument has one semaphore per key, which only a SCAN could enumerate, so its
    `in_use` is None here (`jobs limits` lists every key).
    """
    deferred: dict[tuple[str, str], int] = {}
    if isinstance(counters, list):
        for c in counters:
            if c.get("guard") in ("concurrency", "rate-limit"):
                key = (c["guard"], c.get("name") or "")
                deferred[key] = deferred.get(key, 0) + (
                    c["value"] if c["outcome"] == "DEFERRED" else 0)
    from resilience.ratelimit import LEASE, RedisBackend

    backend = RedisBackend(client)
    concurrency, rates, seen = [], [], set()
    for task, guard in configured_guards(app):
        config = getattr(guard, "config", None)
        kind = getattr(guard, "name", None)
        if kind not in ("concurrency", "rate-limit") or (kind, config.name) in seen:
            continue
        seen.add((kind, config.name))
        if kind == "concurrency":
            keyed = getattr(guard, "keys", None) is not None
            # One pipeline (server TIME + the lease set), decoded by the limiter's backend:
            # live leases are in use, a lapsed one is free again.
            used = (None if keyed else
                    sum(state.used for state in backend.describe(LEASE, key=config.name)))
            concurrency.append({"name": config.name, "limit": config.limit, "in_use": used,
                                "keyed": keyed,
                                "deferred": deferred.get((kind, config.name), 0),
                                "task": task.name})
        else:
            rates.append({"name": config.name, "rate": str(getattr(config, "rate", "")),
                          "algorithm": getattr(config, "algorithm", ""),
                          "deferred": deferred.get((kind, config.name), 0),
                          "task": task.name})
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
def collect(app: Celery, *, inspect_timeout_seconds: float = 1.0, active: bool = True,
            stores: dict[str, StoreStatus] | None = None) -> dict[str, Any]:
    """The platform's resilience state; a section that cannot be read says why.

    Args:
        app: the platform's Celery app (its settings give tier limits).
        inspect_timeout_seconds: how long to wait for workers' `active` replies.
        active: ask the workers what runs now (one broadcast); False skips it.
        stores: a `probe_stores` result: sections on a store that cannot serve are not
            read (no waiting on timeouts) and say why; None reads every section.
    """
    from jobs.tiers import TIERS
    from resilience.stores import stores_for

    started = time.perf_counter()
    errors: dict[str, str] = {}

    def client() -> redis.Redis:
        return stores_for(app).redis()

    def section(name: str, read: Callable[[], Any]) -> Any:
        store = (stores or {}).get(SECTION_STORES.get(name, ""))
        if store is not None and not store.ok:
            errors[name] = store.summary
            return unavailable(errors[name])
        return _section(name, errors, read)

    counters = section("counters", lambda: outcome_counters(client()))
    depths = section("queue_depth", lambda: queue_depths(app, TIERS))
    running = (section("active", lambda: active_tasks(app, inspect_timeout_seconds))
               if active else unavailable("not asked"))
    held = section("held_locks", lambda: held_locks(app))
    snapshot: dict[str, Any] = {
        "taken_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        **_store_keys(stores),
        "tiers": section("tiers", lambda: tiers_section(app, counters, depths, running)),
        "paused": section("paused", lambda: paused_section(app)),
        "cancellations": section("cancellations", lambda: cancellations_section(app)),
        "breakers": section("breakers", lambda: breakers_section(app, client())),
        "budgets": section("budgets", lambda: budgets_section(app, client())),
        "limits": section("limits", lambda: limits_section(app, client(), counters)),
        "locks": section("locks", lambda: locks_section(held)),
        "idempotency": section("idempotency", lambda: idempotency_section(app)),
        "outbox": section("outbox", lambda: outbox_section(app)),
        "batches": section("batches", lambda: batches_section(app)),
        "beat_leader": section("beat_leader", lambda: beat_leader_section(held)),
        "counters": counters,
        "workers": running.get("workers") if isinstance(running, dict) else None,
    }
    snapshot["errors"] = errors
    snapshot["collect_seconds"] = round(time.perf_counter() - started, 3)
    return snapshot
