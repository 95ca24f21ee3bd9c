"""Breakers in process memory (tests, a single-process app): each method follows its Lua
script (`acquire.lua`, `record.lua`, `force.lua`) step by step, under one lock instead of
Redis' single thread, on an injectable clock instead of Redis server time.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from resilience.circuit.backends.base import CLOSED, BreakerState, Peek, Permission, Verdict
from resilience.circuit.config import CountWindow

if TYPE_CHECKING:
    from resilience.batch import Rounds
    from resilience.circuit.config import BreakerConfig
    from resilience.errors import StorageError


@dataclass
class _Breaker:
    """One breaker: the fields of the Redis state hash, and its window."""

    state: str = "closed"
    gen: int = 0
    open_until: int = 0  # ms
    half_open_until: int = 0  # ms
    probes: int = 0
    probes_ok: int = 0
    calls: int = 0
    failures: int = 0
    slow: int = 0
    changed_at: int = 0  # ms; 0 = never changed
    n_opened: int = 0
    n_half_opened: int = 0
    n_closed: int = 0
    n_probes: int = 0
    #: Count window: newest first, each entry failed + 2 * slow (as the Redis list).
    outcomes: deque[int] = field(default_factory=deque)
    #: Time window: slot -> [epoch, calls, failures, slow] (as the Redis slot hash).
    slots: dict[int, list[int]] = field(default_factory=dict)

    def clear_window(self) -> None:
        self.outcomes.clear()
        self.slots.clear()
        self.calls = self.failures = self.slow = 0

    def move(self, state: str, now: int) -> None:
        """A transition: a new generation, its time and its tally."""
        self.gen += 1
        self.state = state
        self.changed_at = now
        tally = {"open": "n_opened", "half_open": "n_half_opened", "closed": "n_closed"}[state]
        setattr(self, tally, getattr(self, tally) + 1)


class MemoryBreakerBackend:
    """Breakers in a dict behind a lock; the clock is injectable.

    Args:
        clock: epoch seconds now (tests pass a fake clock and never sleep).
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._breakers: dict[str, _Breaker] = {}
        #: (breaker name, outcome) -> how often it was counted (see `count`).
        self.counted: Counter[tuple[str, str]] = Counter()

    def _now_ms(self) -> int:
        return math.floor(self.clock() * 1000)

    def _breaker(self, name: str) -> _Breaker:
        return self._breakers.setdefault(name, _Breaker())

    def acquire(self, config: BreakerConfig) -> Permission:
        open_ms = int(config.open_seconds * 1000)
        with self._lock:
            now = self._now_ms()
            breaker = self._breaker(config.name)
            state = breaker.state
            if state in CLOSED:
                return Permission(True, state, breaker.gen)
            if state == "forced_open":
                return Permission(False, state, breaker.gen, open_ms / 1000)
            transition = ""
            if state == "open":
                if now < breaker.open_until:
                    return Permission(False, state, breaker.gen, (breaker.open_until - now) / 1000)
                breaker.move("half_open", now)
                breaker.probes = breaker.probes_ok = 0
                breaker.half_open_until = now + int(config.probe_timeout_seconds * 1000)
                transition = "half_open"
            elif now >= breaker.half_open_until:
                # Probes were handed out but no verdict came back in time: open again.
                breaker.move("open", now)
                breaker.open_until = now + open_ms
                return Permission(False, "open", breaker.gen, open_ms / 1000, "open")
            if breaker.probes < config.half_open_probes:
                breaker.probes += 1
                breaker.n_probes += 1
                return Permission(True, breaker.state, breaker.gen, 0.0, transition)
            wait_ms = min(breaker.half_open_until - now, open_ms)
            return Permission(False, breaker.state, breaker.gen, wait_ms / 1000, transition)

    def record(
        self, config: BreakerConfig, generation: int, outcome: str, slow: bool, calls: int = 1
    ) -> Verdict:
        with self._lock:
            now = self._now_ms()
            breaker = self._breaker(config.name)
            state = breaker.state
            if (generation != breaker.gen or state in ("open", "forced_open", "forced_closed")
                    or (calls != 1 and state != "closed")):
                return Verdict("", state)  # an older state's call; aggregates: closed only
            failed = outcome == "failure"
            if state == "half_open":
                return self._record_probe(config, breaker, now, outcome, failed or slow)
            if outcome == "ignored":
                return Verdict("", state)
            total, failures, slows = self._add(config, breaker, now, failed, slow, calls)
            slow_threshold = config.slow_call_rate_threshold
            if total >= config.minimum_calls and (
                failures >= config.failure_rate_threshold * total
                or (slow_threshold is not None and slows >= slow_threshold * total)
            ):
                self._open(config, breaker, now)
                return Verdict("open", "open", total, failures, slows)
            return Verdict("", state, total, failures, slows)

    def _record_probe(
        self, config: BreakerConfig, breaker: _Breaker, now: int, outcome: str, bad: bool
    ) -> Verdict:
        if outcome == "ignored":
            breaker.probes = max(0, breaker.probes - 1)  # the permit is given back
            return Verdict("", breaker.state)
        if bad:
            self._open(config, breaker, now)
            return Verdict("open", "open")
        breaker.probes_ok += 1
        if breaker.probes_ok >= config.half_open_probes:
            breaker.move("closed", now)
            breaker.clear_window()
            return Verdict("closed", "closed")
        return Verdict("", breaker.state)

    @staticmethod
    def _open(config: BreakerConfig, breaker: _Breaker, now: int) -> None:
        breaker.move("open", now)
        breaker.open_until = now + int(config.open_seconds * 1000)
        breaker.clear_window()

    @staticmethod
    def _add(
        config: BreakerConfig, breaker: _Breaker, now: int, failed: bool, slow: bool,
        calls: int = 1,
    ) -> tuple[int, int, int]:
        """Add `calls` equal outcomes to the window; its calls, failures and slow calls."""
        window = config.window
        if isinstance(window, CountWindow):
            pushed = min(calls, window.calls)  # older ones would leave the window at once
            breaker.outcomes.extendleft([int(failed) + 2 * int(slow)] * pushed)
            breaker.calls += pushed
            breaker.failures += int(failed) * pushed
            breaker.slow += int(slow) * pushed
            while breaker.calls > window.calls:
                old = breaker.outcomes.pop()
                breaker.calls -= 1
                breaker.failures -= old % 2
                breaker.slow -= int(old >= 2)
            return breaker.calls, breaker.failures, breaker.slow
        slots = window.slots
        slot_ms = max(1, int(window.seconds * 1000) // slots)
        epoch = now // slot_ms
        current = breaker.slots.get(epoch % slots)
        if current is None or current[0] != epoch:
            current = breaker.slots[epoch % slots] = [epoch, 0, 0, 0]
        current[1] += calls
        current[2] += int(failed) * calls
        current[3] += int(slow) * calls
        live = [slot for slot in breaker.slots.values() if slot[0] > epoch - slots]
        calls_in, failures, slows = (sum(slot[i] for slot in live) for i in (1, 2, 3))
        return calls_in, failures, slows

    def force(self, name: str, state: str) -> str:
        with self._lock:
            breaker = self._breaker(name)
            previous = breaker.state
            breaker.gen += 1
            breaker.state = state
            breaker.changed_at = self._now_ms()
            breaker.probes = breaker.probes_ok = 0
            breaker.clear_window()
            return previous

    # -- the call's rounds: nothing to batch in one process, so each step runs at once ------
    def peek_later(
        self, rounds: Rounds, name: str, then: Callable[[Peek | StorageError], None]
    ) -> None:
        with self._lock:
            breaker = self._breakers.get(name) or _Breaker()
            peek = Permission(True, breaker.state, breaker.gen) if breaker.state in CLOSED else None
        then(peek)

    def record_later(
        self, rounds: Rounds, config: BreakerConfig, generation: int, outcome: str, slow: bool,
        then: Callable[[Verdict | StorageError], None], calls: int = 1,
    ) -> None:
        then(self.record(config, generation, outcome, slow, calls))

    # -- live state ----------------------------------------------------------------------
    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._breakers)

    def describe(
        self, names: Iterable[str] = (), *, include_stored: bool = False
    ) -> list[BreakerState]:
        with self._lock:
            now = self._now_ms()
            wanted = set(names) | (set(self._breakers) if include_stored else set())
            return [
                BreakerState.decode(name, vars(self._breakers.get(name) or _Breaker()), now_ms=now)
                for name in sorted(wanted)
            ]

    def count(self, name: str, outcome: str) -> None:
        with self._lock:
            self.counted[(name, outcome)] += 1
