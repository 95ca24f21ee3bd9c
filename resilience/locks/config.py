"""Options of `@singleton` and `@exclusive`: frozen dataclasses, validated when built."""

from __future__ import annotations

from dataclasses import dataclass, field

from resilience.config import check
from resilience.connections.postgres import TCP_USER_TIMEOUT_MS
from resilience.errors import ConfigurationError
from resilience.locks.backends import validate_ttl
from resilience.locks.backends.redlock import RedlockConfig, require_node_count
from resilience.locks.heartbeat import HeartbeatConfig
from resilience.store_down import StoreDown, store_down_policy

POLICIES = ("skip", "defer")


@dataclass(frozen=True, kw_only=True)
class LockConfig:
    """Options shared by both guards.

    Args:
        policy: "skip" (outcome SKIPPED) or "defer" (republished later, no retry spent).
        defer_seconds: delay of a deferral.
        same_task_wait_seconds: how long a run of the holder's own task id (a retry or a
            redelivery) waits for the holder to let go before the policy applies.
        on_store_down: "fail_closed" (DEFERRED, the default) or "fail_open" (unguarded,
            counted FAIL-OPEN); see `resilience.store_down`.
    """

    policy: str = "skip"
    defer_seconds: float = 1.0
    same_task_wait_seconds: float = 5.0
    on_store_down: StoreDown | str = StoreDown.FAIL_CLOSED

    def __post_init__(self) -> None:
        check(self, "policy", f"one of {POLICIES}", lambda v: v in POLICIES)
        object.__setattr__(self, "on_store_down", store_down_policy(self.on_store_down))
        check(self, "defer_seconds", "> 0", lambda v: v > 0)
        check(self, "same_task_wait_seconds", ">= 0", lambda v: v >= 0)


@dataclass(frozen=True, kw_only=True)
class SingletonConfig(LockConfig):
    """Options of `@singleton`.

    Args:
        database_url: PostgreSQL of the advisory locks; None: the app's direct lock URL
            (`Stores.locks_database_url`: `resilience_locks_database_url`, else
            `resilience_database_url`).
        pool_mode: declared pooler mode in front of the locks' URL ("transaction" is
            refused); None: the app's (`Stores.locks_pool_mode`), or with `database_url`
            none.
        probe_seconds: the watcher's probe period (`SessionWatcher`); 0 or None: no watcher,
            each `checkpoint()` queries the session itself (up to 10 s in a partition).
        probe_timeout_seconds: silence tolerated past a probe's due time before the hold
            counts as lost; with `probe_seconds`, below the session's TCP user timeout (10 s).
    """

    database_url: str | None = None
    pool_mode: str | None = None
    probe_seconds: float | None = 2.0
    probe_timeout_seconds: float = 3.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self, "probe_seconds", ">= 0 (0 or None: no watcher)", lambda v: v is None or v >= 0)
        check(self, "probe_timeout_seconds", "> 0", lambda v: v > 0)
        server_bound = TCP_USER_TIMEOUT_MS / 1000
        if self.probe_seconds and self.probe_seconds + self.probe_timeout_seconds >= server_bound:
            raise ConfigurationError(
                f"probe_seconds + probe_timeout_seconds ({self.probe_seconds:g} + "
                f"{self.probe_timeout_seconds:g}) must stay below {server_bound:g}s, the time "
                "after which PostgreSQL may end a silent holder's session and give its lock "
                "to another: a cut-off holder would still believe it holds the lock; lower "
                "them, or set probe_seconds=0 to run without a watcher")

    @property
    def watched(self) -> bool:
        """True when a watcher probes the held session while the body runs."""
        return bool(self.probe_seconds)


@dataclass(frozen=True, kw_only=True)
class ExclusiveConfig(LockConfig):
    """Options of `@exclusive`.

    Args:
        ttl_seconds: lease length; renewed by the heartbeat while the body runs.
        heartbeat: renew the lease in the background (off: the TTL must cover the time limit).
        renew_fraction, max_extensions: heartbeat cadence and cap.
        nodes: Redlock node URLs; None: the app's (`resilience_redlock_urls`).
        retry_count, retry_delay_seconds, clock_drift_factor: Redlock attempts and drift.
        fencing: mint a fencing token per acquisition (PostgreSQL sequence).
    """

    ttl_seconds: float = 60.0
    heartbeat: bool = True
    renew_fraction: float = 1 / 3
    max_extensions: int = 100
    nodes: tuple[str, ...] | None = None
    retry_count: int = 1
    retry_delay_seconds: float = 0.05
    clock_drift_factor: float = 0.01
    fencing: bool = True
    heartbeat_options: HeartbeatConfig = field(init=False)
    redlock_options: RedlockConfig = field(init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        validate_ttl(self.ttl_seconds)
        if self.nodes is not None:  # a sequence, or a comma-separated `REDLOCK_URLS`
            object.__setattr__(self, "nodes", tuple(
                [url.strip() for url in self.nodes.split(",") if url.strip()]
                if isinstance(self.nodes, str) else self.nodes))
            require_node_count(len(self.nodes))
        object.__setattr__(self, "heartbeat_options", HeartbeatConfig(
            renew_fraction=self.renew_fraction, max_extensions=self.max_extensions))
        object.__setattr__(self, "redlock_options", RedlockConfig(
            retry_count=self.retry_count, retry_delay_seconds=self.retry_delay_seconds,
            clock_drift_factor=self.clock_drift_factor))

    @property
    def longest_hold_seconds(self) -> float:
        """The longest a run can keep the lease: the TTL plus every capped renewal."""
        if not self.heartbeat:
            return self.ttl_seconds
        return self.ttl_seconds * (1 + self.max_extensions * self.renew_fraction)
