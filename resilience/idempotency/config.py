"""Options of `@idempotent` (`IdempotencyConfig`) and the lease defaults."""

from __future__ import annotations

from dataclasses import dataclass

from resilience.config import check
from resilience.errors import ConfigurationError
from resilience.keys import KeyOption
from resilience.store_down import StoreDown, store_down_policy

#: Seconds added to the task's hard time limit for the default lease.
LEASE_MARGIN_SECONDS = 30.0
#: Default lease when the task has no hard time limit.
DEFAULT_LEASE_SECONDS = 300.0
#: Default life of a cached result in Redis: duplicates mostly come within minutes, a later
#: one is replayed from PostgreSQL (why not the record's TTL: docs/idempotency.md, Cache TTL).
DEFAULT_CACHE_TTL_SECONDS = 600.0


@dataclass(frozen=True, kw_only=True)
class IdempotencyConfig:
    """Options of `@idempotent` (defaults and trade-offs: docs/idempotency.md, Options).

    Args:
        key: None (all bound arguments), a template like ``"transfer:{transfer_id}"``, or
            a callable receiving the bound arguments as keywords.
        ttl_seconds: how long a finished record is kept and replayed (PostgreSQL).
        cache_ttl_seconds: how long a succeeded result stays in the Redis cache (clamped
            to `ttl_seconds`); a later duplicate is replayed from PostgreSQL.
        lease_seconds: how long a claim holds before another delivery may take it over;
            None = the task's hard time limit + 30 s. Non-transactional tasks must not
            lease for less than the hard time limit (a live holder would be overtaken).
        transactional: the body receives `session` (SQLAlchemy); its writes and the
            record's completion commit in one transaction.
        on_store_down: PostgreSQL unreachable at claim time: "fail_closed" (DEFERRED) or
            "fail_open" (run unguarded); see `resilience.store_down`.
        store_down_retry_seconds: deferral delay when the store is down.
        poll_seconds: longest deferral while another holder's claim is live.
        cache: the Redis fast path for finished keys: "auto" (only while the task's keys
            were replayed in this process lately), True (always), False (never).
        synchronous_commit: wait for PostgreSQL's WAL flush on the claim and (outside
            transactional mode) the completion; off, a PostgreSQL crash may forget the last
            ~0.6 s of records. Set per statement, so it works behind PgBouncer.
        prepared_statements: prepare the claim/completion statements once per connection;
            off by itself when the stores declare a transaction/statement pooler.
    """

    key: KeyOption = None
    ttl_seconds: float = 86400.0
    lease_seconds: float | None = None
    transactional: bool = False
    on_store_down: StoreDown | str = StoreDown.FAIL_CLOSED
    store_down_retry_seconds: float = 5.0
    poll_seconds: float = 1.0
    cache: bool | str = "auto"
    cache_ttl_seconds: float = DEFAULT_CACHE_TTL_SECONDS
    synchronous_commit: bool = False
    prepared_statements: bool = True

    def __post_init__(self) -> None:
        check(self, "ttl_seconds", "> 0", lambda v: v > 0)
        check(self, "lease_seconds", "> 0", lambda v: v is None or v > 0)
        check(self, "cache", "True, False or 'auto'", lambda v: v in (True, False, "auto"))
        check(self, "cache_ttl_seconds", "> 0", lambda v: v > 0)
        # A cached copy must never outlive its record (a purge or expiry must win).
        object.__setattr__(self, "cache_ttl_seconds", min(self.cache_ttl_seconds, self.ttl_seconds))
        object.__setattr__(self, "on_store_down", store_down_policy(self.on_store_down))
        if not self.store_down_retry_seconds > 0 or not self.poll_seconds > 0:
            raise ConfigurationError("store_down_retry_seconds and poll_seconds must be > 0")
        if self.key is not None and not isinstance(self.key, str) and not callable(self.key):
            raise ConfigurationError(
                f"key must be None, a template string or a callable, not {type(self.key)}")
