"""Options of `@idempotent` (`IdempotencyConfig`) and the lease defaults."""

from __future__ import annotations

from dataclasses import dataclass

from resilience.errors import ConfigurationError
from resilience.keys import KeyOption
from resilience.store_down import StoreDown, store_down_policy

#: Seconds added to the task's hard time limit for the default lease.
LEASE_MARGIN_SECONDS = 30.0
#: Default lease when the task has no hard time limit.
DEFAULT_LEASE_SECONDS = 300.0
#: Default life of a cached result in Redis. Duplicates mostly come within minutes
#: (redelivery, retries, double clicks); a later one is still replayed from PostgreSQL,
#: one round trip slower. Caching for the record's whole TTL would keep rate x 24 h keys
#: in Redis (~349 B each: ~28 GiB at 1,000 jobs/s), 10 minutes keeps rate x 600.
DEFAULT_CACHE_TTL_SECONDS = 600.0


@dataclass(frozen=True, kw_only=True)
class IdempotencyConfig:
    """Options of `@idempotent`.

    Args:
        key: None (all bound arguments), a template like ``"transfer:{transfer_id}"``, or
            a callable receiving the bound arguments as keywords.
        ttl_seconds: how long a finished record is kept and replayed (PostgreSQL).
        cache_ttl_seconds: how long a succeeded result stays in the Redis cache (the fast
            path; clamped to `ttl_seconds`). Short by default (`DEFAULT_CACHE_TTL_SECONDS`):
            a duplicate after it is still replayed, from PostgreSQL.
        lease_seconds: how long a claim holds before another delivery may take it over;
            None = the task's hard time limit + 30 s. Non-transactional tasks must not
            lease for less than the hard time limit (a live holder would be overtaken).
        transactional: the body receives `session` (SQLAlchemy); its writes and the
            record's completion commit in one transaction.
        on_store_down: PostgreSQL unreachable at claim time: "fail_closed" (DEFERRED,
            the default) or "fail_open" (run unguarded, warn, count FAIL-OPEN); see
            `resilience.store_down`. A store that rejects the claim dead-letters the job.
        store_down_retry_seconds: deferral delay when the store is down.
        poll_seconds: longest deferral while another holder's claim is live.
        cache: the Redis fast path for finished keys: "auto" (default) reads and fills it
            only while the task's keys replayed in this process in the last 60 s (a fresh
            job makes no Redis round trip; PostgreSQL answers a duplicate anyway, in two
            statements), True always (two Redis round trips per fresh job, to spare
            PostgreSQL every duplicate), False never.
        synchronous_commit: wait for PostgreSQL's WAL flush on the claim and (outside
            transactional mode) the completion. Off by default: it halves their latency,
            and a PostgreSQL *crash* may then forget the last ~0.6 s of records, which can
            re-run a non-transactional body (the same exposure as a worker crash between
            effect and record). Transactional mode's completion commits with the body's
            writes and is always durable. Set per statement (`SET LOCAL`, in the same
            query), so it works behind PgBouncer.
        prepared_statements: prepare the claim/completion statements once per connection
            (saves PostgreSQL's parse and plan per call); turned off automatically when
            the stores declare a transaction/statement pooler (`JOBS_PG_POOL_MODE`).
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
        if not self.ttl_seconds > 0:
            raise ConfigurationError(f"ttl_seconds must be > 0, got {self.ttl_seconds!r}")
        if self.lease_seconds is not None and not self.lease_seconds > 0:
            raise ConfigurationError(f"lease_seconds must be > 0, got {self.lease_seconds!r}")
        if self.cache not in (True, False, "auto"):
            raise ConfigurationError(f"cache must be True, False or 'auto', got {self.cache!r}")
        if not self.cache_ttl_seconds > 0:
            raise ConfigurationError(
                f"cache_ttl_seconds must be > 0, got {self.cache_ttl_seconds!r}"
            )
        # A cached copy must never outlive its record (a purge or expiry must win).
        object.__setattr__(self, "cache_ttl_seconds", min(self.cache_ttl_seconds, self.ttl_seconds))
        object.__setattr__(self, "on_store_down", store_down_policy(self.on_store_down))
        if not self.store_down_retry_seconds > 0 or not self.poll_seconds > 0:
            raise ConfigurationError("store_down_retry_seconds and poll_seconds must be > 0")
        if self.key is not None and not isinstance(self.key, str) and not callable(self.key):
            raise ConfigurationError(
                f"key must be None, a template string or a callable, not {type(self.key)}"
            )
