"""Exclusive-run guards: PostgreSQL advisory-lock singletons, Redis locks and Redlock.

    singleton   at most one run per key; PostgreSQL session advisory lock (advisory.py)
    exclusive   at most one holder per key; Redlock + lease heartbeat + fencing token
    RedisLock   one-node lock (redis_lock.py);  Redlock  N-node quorum lock (redlock.py)
    FencingTokens   tokens from a PostgreSQL sequence and the resource-side check (fencing.py)
    LeaderElectedScheduler  celery beat that only schedules while it leads (beat.py)
"""

from resilience.locks.advisory import AdvisorySession, advisory_id
from resilience.locks.fencing import FencingTokens
from resilience.locks.guards import (
    ExclusiveConfig,
    ExclusiveGuard,
    ExclusiveOptions,
    SingletonConfig,
    SingletonGuard,
    SingletonOptions,
    exclusive,
    singleton,
)
from resilience.locks.heartbeat import Heartbeat, HeartbeatConfig, HeartbeatOptions
from resilience.locks.redis_lock import Lease, RedisLock
from resilience.locks.redlock import Redlock, RedlockConfig, RedlockOptions

# ExclusiveOptions, SingletonOptions, HeartbeatOptions, RedlockOptions: deprecated
# aliases of the *Config names, removed in the next release.
__all__ = [
    "AdvisorySession",
    "ExclusiveConfig",
    "ExclusiveGuard",
    "ExclusiveOptions",
    "FencingTokens",
    "Heartbeat",
    "HeartbeatConfig",
    "HeartbeatOptions",
    "Lease",
    "RedisLock",
    "Redlock",
    "RedlockConfig",
    "RedlockOptions",
    "SingletonConfig",
    "SingletonGuard",
    "SingletonOptions",
    "advisory_id",
    "exclusive",
    "singleton",
]
