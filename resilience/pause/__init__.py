"""Pause switches: a tier or a task paused fleet-wide defers its jobs until resumed.

    @app.task(tier="standard")            # every platform task has the switch already
    def report(day): ...

    PauseSwitch(RedisPauseBackend(client)).pause("tier", "standard", reason="db migration")

A paused job is DEFERRED (no retry spent, nothing lost) until resumed. See
docs/operations.md.
"""

from resilience.pause.backends import PauseBackend, Paused
from resilience.pause.backends.memory import MemoryPauseBackend
from resilience.pause.backends.redis import RedisPauseBackend
from resilience.pause.guard import PauseConfig, PauseGuard, PauseSwitch

__all__ = ["MemoryPauseBackend", "PauseBackend", "PauseConfig", "PauseGuard", "PauseSwitch",
           "Paused", "RedisPauseBackend"]
