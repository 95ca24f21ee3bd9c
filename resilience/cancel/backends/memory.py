"""Cancellation marks in one process (tests, a single-process app)."""

from __future__ import annotations

import threading

from resilience.cancel.backends import Marks


class MemoryCancelBackend:
    def __init__(self) -> None:
        self._marks: Marks = {}
        self._version = 0
        self._lock = threading.Lock()

    def cancel(self, target: str, *, reason: str, expires_at: float) -> None:
        with self._lock:
            self._marks[target] = (reason or "cancelled", expires_at)
            self._version += 1

    def uncancel(self, target: str) -> bool:
        with self._lock:
            self._version += 1
            return self._marks.pop(target, None) is not None

    def version(self) -> str:
        return str(self._version)

    def load(self) -> tuple[str, Marks]:
        with self._lock:
            return str(self._version), dict(self._marks)

    def reasons(self, targets: list[str], *, now: float) -> str | None:
        with self._lock:
            for target in targets:
                mark = self._marks.get(target)
                if mark is not None and mark[1] > now:
                    return mark[0]
        return None

    def prune(self, *, now: float) -> int:
        with self._lock:
            expired = [t for t, (_, until) in self._marks.items() if until <= now]
            for target in expired:
                del self._marks[target]
            if expired:
                self._version += 1
            return len(expired)

    def replace(self, marks: Marks) -> str:
        with self._lock:
            self._marks = dict(marks)
            self._version += 1
            return str(self._version)
