"""The stores (Redis, PostgreSQL) registered on a Celery app, one set of clients per process.

Clients are made lazily and dropped in a forked child (`resilience.connections.on_fork`).
Every guard asks its stores for its backend (`Stores.backend`): real stores build the
Redis or PostgreSQL one, `MemoryStores` the guard's in-memory one, so one switch
(`resilience_stores = "memory"`, or `use_memory_stores()`) puts every guard in memory.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from resilience.connections import on_fork, postgres
from resilience.connections.redis import check_redis_url, redis_from_url
from resilience.errors import ConfigurationError
from resilience.redact import redact_url

if TYPE_CHECKING:
    import redis
    from celery import Celery
    from sqlalchemy.engine import Engine

_ATTRIBUTE = "resilience_stores"

_Backend = TypeVar("_Backend")


class Stores:
    """Where guard state lives: one Redis, one PostgreSQL, and the Redlock nodes.

    `resilience.init_app(app)` builds them from the app's configuration on first use
    (`Stores.from_conf`); `install(app, Stores(...))` gives an app explicit ones.

    Args:
        redis_url: shared guard state (breakers, budgets, limits, fast paths): one Redis
            (`redis://`, `rediss://`, `unix://`), a Sentinel-managed master
            (`redis+sentinel://`) or a Redis Cluster (`redis+cluster://`); see
            `redis_from_url`.
        database_url: durable state (idempotency records, fencing counters); may point at a
            transaction-mode pooler (PgBouncer) when `locks_database_url` is set. None: the
            guards that only use Redis (unique, breakers, limits, budgets) work; one that
            needs PostgreSQL raises `ConfigurationError` when it first reaches for it.
        redlock_urls: independent Redis nodes for Redlock (3 or more for a real quorum).
        locks_database_url: PostgreSQL reached directly, for what needs a session of its
            own (advisory locks of singletons and beat leadership); unset: `database_url`.
        socket_timeout_seconds: connect and read timeout of the Redis and PostgreSQL clients.
        statement_timeout_seconds: longest a guard's own PostgreSQL statement runs or waits
            for a lock (`statement_timeout`, `lock_timeout` of `guard_engine()`'s
            transactions); a body's transaction is never bounded by it.
        pool_mode: the pooler's mode in front of `database_url` ("none", "session",
            "transaction", "statement"); None: "none". Transaction and statement pooling
            turn server-side prepared statements off.
        transactions: what a `transactional=True` body runs in: "sqlalchemy" (a Session
            passed as `session`) or "django" (`transaction.atomic` on the Django database
            `django_database`, set by `resilience.contrib.django`).
        django_database: the Django database alias of "django" transactions.

    Raises:
        ConfigurationError: a URL of the wrong kind, an unknown pool mode.
    """

    def __init__(self, *, redis_url: str, database_url: str | None = None,
                 redlock_urls: Sequence[str] = (), locks_database_url: str | None = None,
                 socket_timeout_seconds: float = 5.0, statement_timeout_seconds: float = 5.0,
                 pool_mode: str | None = None, transactions: str = "sqlalchemy",
                 django_database: str = "default") -> None:
        check_redis_url(redis_url, "redis_url")
        for url in redlock_urls:
            check_redis_url(url, "a Redlock URL")
        for name, url in (("database_url", database_url),
                          ("locks_database_url", locks_database_url)):
            if url is not None and not (isinstance(url, str)
                                        and url.startswith(("postgresql", "postgres://"))):
                raise ConfigurationError(
                    f"{name} must be a PostgreSQL URL (postgresql://user@host:port/db), "
                    f"got {redact_url(str(url))!r}")
        self.redis_url = redis_url
        self._database_url = _sqlalchemy_url(database_url) if database_url else None
        locks_url = locks_database_url or database_url
        self._locks_database_url = _sqlalchemy_url(locks_url) if locks_url else None
        self.redlock_urls = tuple(redlock_urls)
        self.socket_timeout_seconds = socket_timeout_seconds
        if not statement_timeout_seconds > 0:
            raise ConfigurationError(
                f"statement_timeout_seconds must be > 0, got {statement_timeout_seconds!r}")
        self.statement_timeout_seconds = statement_timeout_seconds
        #: The pooler's mode in front of `database_url` (lower case; "none" without one).
        self.pool_mode = (pool_mode or "none").strip().lower()
        if self.pool_mode not in ("none", "session", "transaction", "statement"):
            raise ConfigurationError(
                "pool_mode must be none, session, transaction or statement, "
                f"got {self.pool_mode!r}")
        if transactions not in ("sqlalchemy", "django"):
            raise ConfigurationError(
                f"transactions must be 'sqlalchemy' or 'django', got {transactions!r}")
        self.transactions = transactions
        self.django_database = django_database
        self._lock = threading.RLock()
        self._cache: dict[str, Any] = {}
        on_fork(self._forget)

    @classmethod
    def from_conf(cls, conf: Any) -> Stores:
        """The stores `app.conf.resilience_*` names (the keys: docs/library.md); each is
        `__init__`'s argument of the same name, `resilience_redlock_urls` may be a
        comma-separated string, and under `resilience_transactions = "django"` an unset
        database URL is the Django database's. `resilience_stores = "memory"` gives
        `MemoryStores` (the URLs are then not read).

        Raises:
            ConfigurationError: `resilience_redis_url` is missing, or a value is invalid.
        """
        kind = conf.get("resilience_stores")
        if kind == "memory":
            return MemoryStores()
        if kind not in (None, "", "servers"):
            raise ConfigurationError(
                f"resilience_stores must be 'servers' (the default: Redis and PostgreSQL from "
                f"the URLs) or 'memory', got {kind!r}")
        redis_url = conf.get("resilience_redis_url")
        if not redis_url:
            raise ConfigurationError(
                "resilience.init_app(app): set app.conf.resilience_redis_url (Django: "
                "CELERY_RESILIENCE_REDIS_URL) to the Redis that keeps guard state")
        redlock = conf.get("resilience_redlock_urls") or ()
        if isinstance(redlock, str):
            redlock = [url.strip() for url in redlock.split(",") if url.strip()]
        timeouts = {name: float(value)
                    for name in ("socket_timeout_seconds", "statement_timeout_seconds")
                    if (value := conf.get(f"resilience_{name}")) is not None}
        database_url = conf.get("resilience_database_url") or None
        transactions = conf.get("resilience_transactions") or "sqlalchemy"
        django_database = conf.get("resilience_django_database") or "default"
        integration = _integrations.get(transactions)
        if database_url is None and integration is not None:
            # Read now, not at startup: Django's test runner renames the test database.
            database_url = integration.database_url(django_database)
        return cls(redis_url=redis_url, database_url=database_url, redlock_urls=tuple(redlock),
                   locks_database_url=conf.get("resilience_locks_database_url") or None,
                   pool_mode=conf.get("resilience_pool_mode"), transactions=transactions,
                   django_database=django_database, **timeouts)

    def backend(self, kind: str, build: Callable[[Stores], _Backend],
                memory: Callable[[], _Backend] | None = None, *,
                variant: Hashable = None) -> _Backend:
        """The backend a guard keeps its state in: `build(self)`, once per process for each
        `kind` ("idempotency", ...) and `variant` (what else `build` depends on); under
        `MemoryStores`, the one `memory()` instance of `kind` (None: the guard has none)."""
        key = ("backend", kind, variant)
        found = self._cache.get(key)
        return found if found is not None else self._cached(key, lambda: build(self))

    def _cached(self, key: Hashable, build: Callable[[], _Backend]) -> _Backend:
        """`self._cache[key]`, built once under the lock (callers read the cache first)."""
        with self._lock:
            found = self._cache.get(key)
            if found is None:
                found = self._cache[key] = build()
        return found

    def begin_transaction(self) -> Callable[[], Any] | None:
        """What opens a `transactional=True` body's transaction under an integration
        (`transaction.atomic` on `django_database`); None: a SQLAlchemy Session on `engine()`.

        Raises:
            ConfigurationError: the integration never registered itself.
        """
        if self.transactions == "sqlalchemy":
            return None
        integration = _integrations.get(self.transactions)
        if integration is None:
            raise ConfigurationError(
                f"transactions={self.transactions!r} but no such integration registered: add "
                f"'resilience.contrib.{self.transactions}' to INSTALLED_APPS")
        return functools.partial(integration.begin, self.django_database)

    @property
    def database_url(self) -> str:
        """The durable store's URL (SQLAlchemy, psycopg2 driver); ConfigurationError in a
        Redis-only setup."""
        return self._database_url or self._no_server("database_url")

    @property
    def locks_database_url(self) -> str:
        """Where session-bound work runs (advisory locks): PostgreSQL directly when
        `database_url` is a transaction-mode pooler; ConfigurationError in a Redis-only setup."""
        return self._locks_database_url or self._no_server("locks_database_url")

    def _no_server(self, what: str) -> NoReturn:
        raise ConfigurationError(
            f"this guard keeps its state in PostgreSQL but no {what} is configured: set "
            "app.conf.resilience_database_url (Django: CELERY_RESILIENCE_DATABASE_URL), or "
            "Stores(database_url=...)")

    @property
    def has_database(self) -> bool:
        """True when a PostgreSQL is configured (the guards that need one can run)."""
        return self._database_url is not None

    def _forget(self) -> None:
        """In a forked child: drop the parent's clients and engines."""
        engine = self._cache.get("engine")
        if engine is not None:
            engine.dispose(close=False)  # never touch the parent's connections
        self._cache = {}
        self._lock = threading.RLock()  # a parent's thread may have held it at the fork

    def redis(self) -> redis.Redis:
        """The process's client for the shared Redis (decoded responses). After a timeout
        every call fails at once for `socket_timeout_seconds`: the guards of one job meet a
        partitioned Redis in one timeout, not one each (`UnreachableHold`)."""
        client = self._cache.get("redis")
        return client if client is not None else self._cached("redis", lambda: redis_from_url(
            self.redis_url, decode_responses=True, socket_timeout=self.socket_timeout_seconds,
            socket_connect_timeout=self.socket_timeout_seconds, health_check_interval=30,
            hold_after_timeout_seconds=self.socket_timeout_seconds))

    def engine(self) -> Engine:
        """The process's SQLAlchemy engine for the durable store (pooled, pinged)."""
        engine = self._cache.get("engine")
        return engine if engine is not None else self._cached("engine", lambda: postgres.engine(
            self.database_url, connect_timeout_seconds=self.socket_timeout_seconds,
            server_tcp=self.pool_mode == "none"))

    def statements(self) -> postgres.StatementRunner:
        """The process's runner of single autocommit statements on `database_url`, one
        connection held per thread (the idempotency claims and completions)."""
        runner = self._cache.get("statements")
        return runner if runner is not None else self._cached(
            "statements", lambda: postgres.StatementRunner(
                self.database_url, connect_timeout_seconds=self.socket_timeout_seconds))

    @property
    def guard_bound_ms(self) -> int:
        """`statement_timeout_seconds` in milliseconds (`guard_bounds_sql`)."""
        return max(1, int(self.statement_timeout_seconds * 1000))

    def guard_engine(self) -> Engine:
        """`engine()` (same pool) whose transactions first `SET LOCAL statement_timeout` and
        `lock_timeout`: a guard statement stuck behind a vanished transaction's lock ends as
        `StoreUnavailable` instead of waiting. `SET LOCAL` lasts one transaction, so a
        pooler accepts it. Bodies use `engine()`: user work may be long."""
        engine = self._cache.get("guard_engine")
        return engine if engine is not None else self._cached(
            "guard_engine", lambda: self.engine().execution_options(
                **{postgres.GUARD_BOUND_OPTION: self.guard_bound_ms}))

    @property
    def transaction_pooled(self) -> bool:
        """True when `database_url` is a transaction/statement pooler: no session state
        (prepared statements, `SET`, `LISTEN`, session advisory locks) survives a statement."""
        return self.pool_mode in ("transaction", "statement")

    @property
    def locks_pool_mode(self) -> str:
        """The pooler's mode in front of `locks_database_url`: "none" when it is its own
        (direct) URL, else `pool_mode`."""
        return self.pool_mode if self._locks_database_url == self._database_url else "none"


class MemoryStores(Stores):
    """Guard state in this process's memory (unit tests, eager mode, one process): each
    guard gets its in-memory backend; one that has none, or code reaching for a server,
    gets `ConfigurationError`. Shared by the app's tasks in the process; `reset()` empties it.
    """

    redis_url, redlock_urls, pool_mode = "memory://", (), "none"
    _database_url = _locks_database_url = None
    socket_timeout_seconds = statement_timeout_seconds = 0.0
    transactions, django_database = "sqlalchemy", "default"

    def __init__(self) -> None:  # no servers to check, and nothing to drop in a fork
        self._lock = threading.RLock()
        self._cache = {}
        #: kind -> (its factory, the instance handed out).
        self._backends: dict[str, tuple[Callable[[], Any], Any]] = {}

    def backend(self, kind: str, build: Callable[[Stores], _Backend],
                memory: Callable[[], _Backend] | None = None, *,
                variant: Hashable = None) -> _Backend:
        """The one in-memory backend of `kind` (made on first use), whatever `variant`."""
        if memory is None:
            raise ConfigurationError(
                f"{kind} has no in-memory backend: with resilience_stores='memory' (or "
                "resilience.testing) test it against a real Redis/PostgreSQL instead")
        with self._lock:
            made = self._backends.get(kind)
            if made is None:
                made = self._backends[kind] = (memory, memory())
        return made[1]

    def reset(self) -> None:
        """Empty every backend handed out, in place: guards keep the instances they bound
        (a breaker, a limiter, a budget gate), so each is given a fresh one's state."""
        with self._lock:
            for factory, instance in self._backends.values():
                fresh = factory()
                if fresh is not None:
                    instance.__dict__.clear()
                    instance.__dict__.update(fresh.__dict__)

    def _no_server(self, what: str) -> NoReturn:
        raise ConfigurationError(
            f"in-memory stores (resilience_stores='memory' or resilience.testing) have no "
            f"{what}: a guard or view that needs one cannot run in memory")

    def redis(self) -> redis.Redis:
        """Raises `ConfigurationError`: there is no Redis (nor PostgreSQL: `engine()`, ...)."""
        self._no_server("Redis")

    def engine(self) -> Engine:
        self._no_server("PostgreSQL")


def _sqlalchemy_url(url: str) -> str:
    """Pin the psycopg2 driver so `postgresql://` and `postgres://` both work."""
    for prefix in ("postgresql+psycopg2://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg2://" + url[len(prefix) :]
    return url


@dataclass(frozen=True)
class Integration:
    """A framework that runs transactional bodies in its own transactions.

    Args:
        database_url: the URL of the framework's database `alias` (None: not PostgreSQL).
        begin: opens a body's transaction on database `alias` (an idempotency
            `Transaction`).
    """

    database_url: Callable[[str], str | None]
    begin: Callable[[str], Any]


#: Integrations by the name `resilience_transactions` gives them.
_integrations: dict[str, Integration] = {}


def register_integration(name: str, integration: Integration) -> None:
    """Let `Stores(transactions=name)` use `integration` (`resilience.contrib.django`
    registers "django" when its app is ready): the core never imports a framework."""
    _integrations[name] = integration


#: Set on an app by `from_app_conf`: its stores are built from `app.conf` on first use.
_FROM_CONF = "resilience_stores_from_conf"
_building = threading.Lock()


def install(app: Celery, stores: Stores) -> Stores:
    """Register `stores` on `app` so guards of the app's tasks find them (instead of the
    ones `resilience.init_app` would build from `app.conf`)."""
    setattr(app, _ATTRIBUTE, stores)
    return stores


def from_app_conf(app: Celery) -> None:
    """Build `app`'s stores from its configuration when a guard first needs them, unless
    `install` gave it some. Reads nothing now: Django settings may not be loaded yet."""
    setattr(app, _FROM_CONF, True)


#: Each app's `MemoryStores` under `use_memory_stores`, kept for the app's lifetime: guards
#: bind their backends once, so an app switched on again gets the same (reset) instances.
_memory_by_app: weakref.WeakKeyDictionary[Any, MemoryStores] = weakref.WeakKeyDictionary()
_memory: weakref.WeakKeyDictionary[Any, MemoryStores] | None = None


def use_memory_stores(on: bool = True) -> None:
    """Process-wide test switch: with it on, `stores_for` gives every app its own
    `MemoryStores`, whatever its configuration or installed stores say; off, each app
    finds its own stores again. `memory_stores_in_use()` lists them, to `reset()` them."""
    global _memory
    with _building:
        _memory = _memory_by_app if on else None


def memory_stores_in_use() -> list[MemoryStores]:
    """Every `MemoryStores` `use_memory_stores` has handed out to a living app."""
    return list(_memory_by_app.values())


def stores_for(app: Celery) -> Stores:
    """The stores registered on `app`, built from `app.conf` on first use after
    `resilience.init_app(app)`; its `MemoryStores` while `use_memory_stores()` is on.

    Raises:
        ConfigurationError: the app was never initialised (`resilience.init_app(app)`)
            and no stores were installed, or its `resilience_*` configuration is invalid.
    """
    memory = _memory
    if memory is not None:
        found = memory.get(app)
        if found is None:
            with _building:
                found = memory.setdefault(app, MemoryStores())
        return found
    stores = getattr(app, _ATTRIBUTE, None)
    if stores is not None:
        return stores
    if getattr(app, _FROM_CONF, False):
        with _building:
            stores = getattr(app, _ATTRIBUTE, None)
            if stores is None:
                stores = install(app, Stores.from_conf(app.conf))
        return stores
    raise ConfigurationError(
        f"no stores configured for Celery app {app.main!r}: call resilience.init_app(app) "
        "(the stores come from app.conf.resilience_*)")
