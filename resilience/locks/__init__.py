"""Exclusive-run guards: PostgreSQL advisory-lock singletons, Redis locks and Redlock.

    singleton   at most one run per key; PostgreSQL session advisory lock
    exclusive   at most one holder per key; Redlock + lease heartbeat + fencing token
    describe    who holds which lock now (`Holder`s), for admin and status views

    config.py       SingletonConfig, ExclusiveConfig (options)
    guards.py       the flow: SingletonGuard, ExclusiveGuard, Hold, the decorators
    backends/       LockBackend and its stores: postgres.py (AdvisorySession, the registry),
                    redis.py (RedisLock, the Lua scripts), redlock.py (Redlock)
    fencing.py      FencingTokens: tokens from a PostgreSQL sequence, the resource-side check
    heartbeat.py    Heartbeat: renews a lease while the body runs
    watcher.py      SessionWatcher: probes a singleton's session while the body runs
    registry.py     describe(), force_release() (`jobs locks`)
    beat.py         BeatLeadership: the beat leader lock (resilience.schedules' Scheduler)
"""

from resilience.locks.backends import Claimant, Lease, LockBackend, Taken
from resilience.locks.backends.postgres import AdvisoryLockBackend, AdvisorySession, advisory_id
from resilience.locks.backends.redis import RedisLock
from resilience.locks.backends.redlock import Redlock, RedlockBackend, RedlockConfig
from resilience.locks.config import (
    ExclusiveConfig,
    SingletonConfig,
)
from resilience.locks.fencing import FencingTokens
from resilience.locks.guards import ExclusiveGuard, Hold, SingletonGuard, exclusive, singleton
from resilience.locks.heartbeat import Heartbeat, HeartbeatConfig
from resilience.locks.registry import describe, force_release
from resilience.locks.watcher import SessionWatcher

__all__ = [
    "AdvisoryLockBackend",
    "AdvisorySession",
    "Claimant",
    "ExclusiveConfig",
    "ExclusiveGuard",
    "FencingTokens",
    "Heartbeat",
    "HeartbeatConfig",
    "Hold",
    "Lease",
    "LockBackend",
    "RedisLock",
    "Redlock",
    "RedlockBackend",
    "RedlockConfig",
    "SessionWatcher",
    "SingletonConfig",
    "SingletonGuard",
    "Taken",
    "advisory_id",
    "describe",
    "exclusive",
    "force_release",
    "singleton",
]
