"""Storage of the circuit breakers: `base.py` (the Protocol every store implements and
what its steps return), `redis.py` (Lua scripts, the specification), `memory.py` (one
process), and `backend_of_app`, which picks one for an app."""

from __future__ import annotations

from typing import Any

from resilience.circuit.backends.base import (
    BreakerBackend,
    BreakerState,
    Peek,
    Permission,
    Verdict,
)
from resilience.circuit.backends.memory import MemoryBreakerBackend
from resilience.circuit.backends.redis import RedisBreakerBackend
from resilience.stores import stores_for

__all__ = ["BreakerBackend", "BreakerState", "MemoryBreakerBackend", "Peek",
           "Permission", "RedisBreakerBackend", "Verdict", "backend_of_app"]


def backend_of_app(app: Any) -> BreakerBackend:
    """The breakers of `app`'s tasks: on its shared Redis (one backend per app, so its
    tasks share the process's local copies), in memory on `MemoryStores`."""
    return stores_for(app).backend(
        "circuit", lambda stores: RedisBreakerBackend(stores.redis), memory=MemoryBreakerBackend
    )
