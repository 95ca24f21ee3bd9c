"""`BreakerBackend.describe`: a breaker's live state, the same on every backend."""

from __future__ import annotations

import pytest

from resilience.circuit import BreakerState, CircuitBreaker
from tests.resilience.circuit.conftest import BreakerStore

pytestmark = pytest.mark.timeout(60)


def _fail(breaker: CircuitBreaker, times: int) -> None:
    for _ in range(times):
        permission = breaker.acquire()
        assert permission.allowed
        breaker.record(permission, "failure", duration_seconds=0)


class TestDescribe:
    def test_a_breaker_never_used_is_closed(self, store: BreakerStore) -> None:
        """A name with no state describes as a fresh closed breaker, and is not stored."""
        assert store.backend.describe(["never-used"]) == [BreakerState(name="never-used")]
        assert store.backend.describe(include_stored=True) == []
        assert store.backend.names() == []

    def test_window_figures_while_closed(self, store: BreakerStore) -> None:
        """Calls, failures and slow calls of the count window, and the failure rate."""
        breaker = store.breaker(slow_call_seconds=1.0)
        _fail(breaker, 2)
        permission = breaker.acquire()
        breaker.record(permission, "success", duration_seconds=2.0)
        state = breaker.describe()
        assert (state.state, state.open) == ("closed", False)
        assert (state.calls, state.failures, state.slow_calls) == (3, 2, 1)
        assert state.failure_rate == pytest.approx(2 / 3)
        assert state.seconds_in_state is None and state.retry_in_seconds is None

    def test_open_then_half_open(self, store: BreakerStore) -> None:
        """Open: refused, with the time left; half-open: the probes handed out so far."""
        breaker = store.breaker(open_seconds=60)
        _fail(breaker, 4)
        opened = breaker.describe()
        assert (opened.state, opened.open, opened.times_opened) == ("open", True, 1)
        assert opened.calls == 0  # the window is cleared when it opens
        assert opened.retry_in_seconds is not None and 59 <= opened.retry_in_seconds <= 60
        assert opened.seconds_in_state is not None and 0 <= opened.seconds_in_state <= 1
        store.elapse(breaker.name, 60)
        assert breaker.acquire().allowed
        probing = breaker.describe()
        assert (probing.state, probing.open, probing.probes) == ("half_open", False, 1)
        assert probing.generation == opened.generation + 1
        assert (probing.times_half_opened, probing.probes_total) == (1, 1)
        assert probing.retry_in_seconds is None

    def test_forced_open(self, store: BreakerStore) -> None:
        """Held open by an operator: open, with no time left to tell."""
        breaker = store.breaker()
        breaker.force("forced_open")
        state = breaker.describe()
        assert (state.state, state.open, state.retry_in_seconds) == ("forced_open", True, None)

    def test_many_breakers_at_once(self, store: BreakerStore) -> None:
        """Names asked for and names stored, each once, sorted by name."""
        used = [store.breaker(name=name) for name in ("b", "a", "c")]
        for breaker in used:
            _fail(breaker, 1)
        states = store.backend.describe(["a", "z"], include_stored=True)
        assert [state.name for state in states] == ["a", "b", "c", "z"]
        assert [state.failures for state in states] == [1, 1, 1, 0]
        assert store.backend.names() == ["a", "b", "c"]
        assert [state.name for state in store.backend.describe(["z", "a"])] == ["a", "z"]
