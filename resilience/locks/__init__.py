"""Exclusive-run guards: `@singleton` (PostgreSQL session advisory lock, at most one run per
key) and `@exclusive` (Redlock, lease heartbeat, fencing token, at most one holder per key);
`describe` and `force_release` for operators. docs/locks.md has a table of the modules.
"""

from resilience.locks.backends import Claimant, Lease, LockBackend, Taken
from resilience.locks.backends.postgres import AdvisoryLockBackend, AdvisorySession, advisory_id
from resilience.locks.backends.redis import RedisLock
from resilience.locks.backends.redlock import Redlock, RedlockBackend, RedlockConfig
from resilience.locks.config import ExclusiveConfig, SingletonConfig
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
