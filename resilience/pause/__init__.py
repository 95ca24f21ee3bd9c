"""Pause switches: a tier or a task paused fleet-wide defers its jobs until resumed.

    @app.task(tier="standard")            # every platform task has the switch already
    def report(day): ...

    PauseSwitch(RedisPauseBackend(client)).pause("tier", "standard", reason="db migration")

A paused job is DEFERRED with reason "paused": it spends no retry and is never lost; the
queue keeps its depth, and a resumed tier drains. Workers read the switches at most every
`refresh_seconds` (1 s) per process, so a pause costs no Redis round trip per job.
"""

from resilience.pause.backends import PauseBackend, Paused
from resilience.pause.backends.memory import MemoryPauseBackend
from resilience.pause.backends.redis import RedisPauseBackend
from resilience.pause.guard import PauseConfig, PauseGuard, PauseSwitch

__all__ = ["MemoryPauseBackend", "PauseBackend", "PauseConfig", "PauseGuard", "PauseSwitch",
           "Paused", "RedisPauseBackend"]
