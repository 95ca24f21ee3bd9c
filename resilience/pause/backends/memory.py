"""Pause switches in process memory: one process only (tests, a single-process app)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from resilience.pause.backends import Paused


class MemoryPauseBackend:
    """Switches in a dict behind a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._on: dict[tuple[str, str], Paused] = {}

    def pause(self, scope: str, name: str, *, reason: str) -> None:
        with self._lock:
            self._on[(scope, name)] = Paused(scope, name, reason, time.time())

    def resume(self, scope: str, name: str) -> bool:
        with self._lock:
            return self._on.pop((scope, name), None) is not None

    def paused(self, switches: Sequence[tuple[str, str]]) -> list[Paused]:
        with self._lock:
            return [self._on[switch] for switch in switches if switch in self._on]

    def all_paused(self) -> list[Paused]:
        with self._lock:
            return list(self._on.values())
