"""`collect(app)`: the platform state as a JSON-able dict, one section per view of `VIEWS`,
read without a SCAN after `probe_stores`. See docs/observe.md (The snapshot, `jobs status`).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import lru_cache, partial
from typing import TYPE_CHECKING, Any

from jobs.observe.backlog import per_list, quick_redis
from jobs.settings import Settings
from jobs.tiers import TIERS
from resilience.admission import RedisBrokerDepth, depth_backend_for
from resilience.batches import view as batches_view
from resilience.cancel import view as cancel_view
from resilience.circuit import view as circuit_view
from resilience.counters import read_all
from resilience.deadletter import view as deadletter_view
from resilience.idempotency import view as idempotency_view
from resilience.locks import view as locks_view
from resilience.outbox import view as outbox_view
from resilience.pause import view as pause_view
from resilience.ratelimit import view as ratelimit_view
from resilience.redact import redact, redact_url
from resilience.retry import view as retry_view
from resilience.schedules import view as schedules_view
from resilience.views import Column, Source, View, marked, missing, number
from resilience.workflows import view as workflows_view

if TYPE_CHECKING:
    import redis
    from celery import Celery

logger = logging.getLogger("jobs.observe.snapshot")

#: Counter outcomes summed per tier in the tiers section.
TIER_OUTCOMES = {"rejected": "REJECTED", "discarded": "DISCARDED", "shed": "SHED",
                 "deferred": "DEFERRED", "replayed": "REPLAYED", "skipped": "SKIPPED",
                 "retried": "RETRY", "dead_lettered": "DEAD-LETTERED"}

#: What a store that cannot be reached tells the operator to do.
START_HINT = "start the platform with `make run` (or `jobs up`), or set {variable}"
MIGRATE_HINT = "run `jobs migrate`"


def one_line(exc: BaseException, limit: int = 300) -> str:
    """`Type: first line of the message` (redacted, at most `limit` characters)."""
    text = redact(str(exc).strip().splitlines()[0]) if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:limit] if text else type(exc).__name__


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
    """What a quick probe found for one store the snapshot reads, and what to do about it:
    `problem` None (it serves), `unreachable`, `refused` (credentials) or `not_migrated`."""

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
    alias = Settings.model_fields[field].validation_alias
    names = [name for name in getattr(alias, "choices", ()) if isinstance(name, str)
             and name.isupper()]
    present = {key.upper() for key in os.environ}
    return next((name for name in names if name in present), default)


def _probe_redis(url: str, timeout_seconds: float) -> None:
    with quick_redis(url, timeout_seconds) as client:
        client.ping()


def probe_broker(url: str, timeout_seconds: float) -> None:
    """Connect to the broker at `url` once (any kombu transport); raises when it cannot."""
    from kombu import Connection

    with Connection(url, connect_timeout=timeout_seconds) as connection:
        connection.ensure_connection(max_retries=1, interval_start=0, interval_step=0,
                                     timeout=timeout_seconds)


@lru_cache(maxsize=4)
def migration_heads(database_url: str) -> dict[str, frozenset[str]]:
    """Each version table (the library's, the platform's) and its heads, read once."""
    # lazy: jobs.db loads alembic and SQLAlchemy, which the probes never need
    from jobs.db import expected_versions

    return expected_versions(database_url)


def missing_migrations(cursor: Any, database_url: str) -> tuple[list[str], bool]:
    """(the code's migration heads not applied, sorted; whether any is applied), read on a
    DB-API `cursor` (psycopg2)."""
    expected = migration_heads(database_url)
    applied: set[str] = set()
    for table in expected:  # names of our own, never user input
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", (table,))
        row = cursor.fetchone()
        if row and row[0]:
            cursor.execute(f"SELECT version_num FROM {table}")
            applied |= {version for (version,) in cursor.fetchall()}
    return sorted(frozenset().union(*expected.values()) - applied), bool(applied)


def _probe_database(url: str, timeout_seconds: float) -> tuple[str, str, str] | None:
    """Connect with psycopg2 alone (SQLAlchemy's import alone costs more than the probe) and
    compare the applied migrations with the code's heads: None when migrated, else
    (problem, reason, fix); raises when unreachable."""
    import psycopg2

    # libpq reads `postgresql://`, not SQLAlchemy's `postgresql+psycopg2://`; its
    # connect_timeout is whole seconds and at least 2; a TCP user timeout of the same bound
    # ends a query whose server was cut off after the connect (a partition).
    dsn = re.sub(r"^postgres(?:ql)?(?:\+\w+)?://", "postgresql://", url)
    bound = max(2, math.ceil(timeout_seconds))
    connection = psycopg2.connect(dsn, connect_timeout=bound, tcp_user_timeout=bound * 1000)
    try:
        with connection.cursor() as cursor:
            missing, applied = missing_migrations(cursor, url)
    finally:
        connection.close()
    if not missing:
        return None
    reason = (f"{len(missing)} migration(s) not applied: {', '.join(missing)}" if applied
              else "no migration applied")
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
    """Can `broker`, `redis` and `database` serve? One quick connection each, in parallel, no
    retries (`timeout_seconds`, at least 2 for PostgreSQL); the settings alone, no app."""
    redis_variable = url_variable("redis_url", "REDIS_URL")
    stores = (  # store, server, role, url, variable, probe
        ("broker", "Redis" if settings.broker_is_redis else "RabbitMQ", "broker",
         settings.effective_broker_url,
         url_variable("broker_url", "BROKER_URL") if settings.broker_url else redis_variable,
         _probe_redis if settings.broker_is_redis else probe_broker),
        ("redis", "Redis", "guard state", settings.effective_redis_url, redis_variable,
         _probe_redis),
        ("database", "PostgreSQL", "durable state", settings.effective_database_url,
         url_variable("database_url", "DATABASE_URL"), _probe_database),
    )

    def run(server: str, url: str, variable: str, probe: Callable[..., Any]) -> tuple[Any, ...]:
        try:
            return probe(url, timeout_seconds) or (None, "", "")
        except Exception as exc:  # noqa: BLE001 - every failure is reported, in words
            return _diagnose(exc, server, variable)

    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="status-probe") as pool:
        results: dict[str, Any] = {}
        # The guard-state Redis first: a broker on its URL shares its probe and its line.
        for _, server, _, url, variable, probe in (stores[1], stores[0], stores[2]):
            if url not in results:
                results[url] = pool.submit(run, server, url, variable, probe)
        found = {}
        for store, server, role, url, variable, _ in stores:
            problem, reason, fix = results[url].result()
            found[store] = StoreStatus(store=store, server=server, role=role,
                                       url=redact_url(url), variable=variable,
                                       problem=problem, reason=reason, fix=fix)
    return found


def problem_lines(snapshot: dict[str, Any]) -> list[str]:
    """One line per store that cannot serve: which, where, why, and what to do; two roles
    on one server with one problem make one line (`Redis (broker and guard state) at ...`)."""
    merged: dict[tuple[str, ...], list[str]] = {}
    for entry in (snapshot.get("unavailable") or {}).values():
        key = (entry["server"], entry["url"], entry["problem"], entry["reason"], entry["fix"])
        merged.setdefault(key, []).append(entry["role"])
    return [f"{server} ({' and '.join(roles)}) at {url}: {PROBLEMS[problem]} ({reason}); {fix}"
            for (server, url, problem, reason, fix), roles in merged.items()]


# -- the platform's own sections --------------------------------------------------------
def queue_depths(app: Celery, tiers: Iterable[str]) -> dict[str, int]:
    """Messages waiting per tier queue: one pipelined LLEN on Redis, passive declares on AMQP."""
    backend = depth_backend_for(app)
    if not isinstance(backend, RedisBrokerDepth):
        return {tier: backend.depth(tier) for tier in tiers}
    lists = {tier: backend.lists(tier) for tier in tiers}
    return {tier: sum(map(int, sizes))
            for tier, sizes in per_list(backend.client(), lists, "llen").items()}


def active_tasks(app: Celery, timeout_seconds: float) -> dict[str, Any]:
    """Tasks running now per tier, from `inspect().active()`; no reply counts as none."""
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
    return [{**labels, "value": value} for labels, value in sorted(
        read_all(client), key=lambda item: sorted(item[0].items()))]


def tiers_section(app: Celery, counters: Any, depths: Any, active: Any) -> dict[str, Any]:
    """Per tier: depth against its limit (FULL at or over it), active, and refusals by kind."""
    tiers: dict[str, Any] = {}
    read = missing(depths) is None
    for tier in TIERS:
        limits = app.settings.tier(tier)
        row: dict[str, Any] = {
            "max_queue_depth": limits.max_queue_depth,
            "rejection_policy": limits.rejection_policy,
            "concurrency": limits.concurrency,
            "depth": depths[tier] if read else None,
            "full": depths[tier] >= limits.max_queue_depth if read else None,
            "active": active["per_tier"].get(tier, 0) if missing(active) is None else None,
            **dict.fromkeys(TIER_OUTCOMES),
        }
        if isinstance(counters, list):
            by_guard: dict[str, Counter[str]] = {}
            for c in counters:
                if c.get("tier") == tier:
                    guard = by_guard.setdefault(c.get("guard") or "-", Counter())
                    guard[c["outcome"]] += c["value"]
            row.update({column: sum(guard[outcome] for guard in by_guard.values())
                        for column, outcome in TIER_OUTCOMES.items()}, by_guard=by_guard)
        tiers[tier] = row
    return tiers


TIERS_VIEW = View(
    name="tiers", title="tiers", store="", row_id=lambda r: f"tier-{r['tier']}",
    row_data=lambda r: {"full": "true" if r["full"] else "false"},
    alert=lambda r: "FULL" if r["full"] else None,
    read=lambda source: tiers_section(source.app, source.counters, source.cache["queue_depth"],
                                      source.cache["active"]),
    rows=lambda section: [{"tier": tier, **row} for tier, row in section.items()],
    columns=(Column(header="tier", key="tier"),
             Column(header="depth", justify="right", text=lambda r: marked(
                 number(r["depth"]) + (" FULL" if r["full"] else ""), "bold red", bool(r["full"]))),
             Column(header="max", key="max_queue_depth", justify="right"),
             Column(header="policy", key="rejection_policy"),
             Column(header="active", key="active", justify="right"),
             *(Column(header=column.replace("_", "-"), key=column, justify="right")
               for column in TIER_OUTCOMES)),
)

#: Every section, in the order views show them: the registry the status screen, metrics,
#: page and JSON API render. A guard adds its view here and nowhere else.
VIEWS: tuple[View, ...] = (
    TIERS_VIEW, pause_view.VIEW, cancel_view.VIEW, circuit_view.VIEW, retry_view.VIEW,
    ratelimit_view.VIEW, locks_view.LOCKS, idempotency_view.VIEW, outbox_view.VIEW,
    batches_view.VIEW, workflows_view.VIEW, deadletter_view.VIEW, locks_view.BEAT_LEADER_VIEW,
    schedules_view.VIEW,
)


def collect(app: Celery | None, *, inspect_timeout_seconds: float = 1.0, active: bool = True,
            stores: dict[str, StoreStatus] | None = None) -> dict[str, Any]:
    """The platform's resilience state; a section that cannot be read says why.

    Args:
        app: the platform's Celery app; None only when no store serves.
        inspect_timeout_seconds: how long to wait for workers' `active` replies.
        active: ask the workers what runs now (one broadcast); False skips it.
        stores: a `probe_stores` result: sections on a store that cannot serve are not
            read and say why; None reads every section.
    """
    started = time.perf_counter()
    errors: dict[str, str] = {}
    source = Source(app=app, tiers=TIERS)  # type: ignore[arg-type]

    def section(name: str, store: str, read: Callable[[], Any]) -> Any:
        # The tiers section reads the app's settings; without an app it waits on the broker.
        status = (stores or {}).get(store or ("broker" if app is None else ""))
        if status is not None and not status.ok:
            errors[name] = status.summary
        else:
            try:
                return read()
            except Exception as exc:  # noqa: BLE001 - one broken section must not hide others
                logger.warning("snapshot section %s unavailable: %s", name, redact(str(exc)))
                errors[name] = one_line(exc)
        return {"unavailable": errors[name]}

    source.counters = section("counters", "redis", lambda: outcome_counters(source.redis()))
    source.cache["queue_depth"] = section("queue_depth", "broker",
                                          lambda: queue_depths(app, TIERS))
    running = source.cache["active"] = (
        section("active", "broker", lambda: active_tasks(app, inspect_timeout_seconds))
        if active else {"unavailable": "not asked"})
    snapshot: dict[str, Any] = {
        "taken_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "stores": None if stores is None else {n: s.as_dict() for n, s in stores.items()},
        "unavailable": None if stores is None else {n: s.as_dict() for n, s in stores.items()
                                                    if not s.ok},
        **{view.name: section(view.name, view.store, partial(view.read, source))
           for view in VIEWS},
        "counters": source.counters,
        "workers": running.get("workers"),
        "errors": errors,
    }
    snapshot["collect_seconds"] = round(time.perf_counter() - started, 3)
    return snapshot
