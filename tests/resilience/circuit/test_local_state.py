"""Local breaker state and aggregated outcomes (issue 14): the documented bounds, measured.

docs/failure.md "Local state and aggregated counts" states what `local_state_seconds` and
the budget's `flush_seconds` change; each bound there is checked here on real Redis, with
real processes where a process boundary is the point (a trip elsewhere, SIGKILL, fork,
interpreter exit).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from typing import Any

import pytest
import redis

from resilience.circuit import (
    BreakerConfig,
    CircuitBreaker,
    CountWindow,
    RedisBreakerBackend,
    TimeWindow,
)
from resilience.flushing import flush_all
from resilience.retry.budget import RedisBudgetBackend, RetryBudget, RetryBudgetGate
from tests.resilience.circuit.conftest import BreakerStore
from tests.support import wait_for

pytestmark = pytest.mark.timeout(60)

#: Slack for a loaded 2-core machine on top of a bound measured in-process.
TOLERANCE = 0.05


def _name() -> str:
    return f"local-{uuid.uuid4().hex[:8]}"


def _breaker(backend: Any, **options: Any) -> CircuitBreaker:
    settings: dict[str, Any] = {"name": _name(), "window": CountWindow(calls=100),
                                "minimum_calls": 1000, "open_seconds": 60}
    settings.update(options)
    return CircuitBreaker(BreakerConfig(**settings), backend)


def _succeed(breaker: CircuitBreaker, times: int = 1) -> None:
    for _ in range(times):
        permission = breaker.acquire()
        assert permission.allowed
        breaker.record(permission, "success", duration_seconds=0.0)


class TestAggregation:
    def test_successes_arrive_as_one_count(self, store: BreakerStore) -> None:
        """Successes wait in the process until flushed; then the window holds every one
        of them (a count window gets N entries, at most its size)."""
        wide = _breaker(store.backend, local_state_seconds=30)
        narrow = _breaker(store.backend, local_state_seconds=30, window=CountWindow(calls=10))
        _succeed(wide, 25)
        _succeed(narrow, 25)
        assert (wide.describe().calls, narrow.describe().calls) == (0, 0)
        flush_all()
        assert (wide.describe().calls, wide.describe().failures) == (25, 0)
        assert narrow.describe().calls == 10

    def test_same_window_as_one_by_one(self, store: BreakerStore) -> None:
        """N aggregated successes leave the window as N single records would: the oldest
        outcomes slide out (count window), the slot counts them (time window)."""
        for window in (CountWindow(calls=10), TimeWindow(seconds=60, slots=6)):
            figures = []
            for seconds in (0, 30):
                breaker = _breaker(store.backend, window=window, local_state_seconds=seconds)
                for _ in range(3):
                    permission = breaker.acquire()
                    breaker.record(permission, "failure", duration_seconds=0.0)
                _succeed(breaker, 9)
                flush_all()
                state = breaker.describe()
                figures.append((state.state, state.calls, state.failures))
            assert figures[0] == figures[1]

    def test_failure_is_judged_on_the_pending_successes(self, store: BreakerStore) -> None:
        """A failure goes at once, after this process's pending successes: 1 failure of 4
        calls stays below 50 %, where alone it would be 1 of 1 and trip."""
        breaker = _breaker(store.backend, minimum_calls=1, local_state_seconds=30)
        _succeed(breaker, 3)
        permission = breaker.acquire()
        verdict = breaker.record(permission, "failure", duration_seconds=0.0)
        assert (verdict.transition, verdict.calls, verdict.failures) == ("", 4, 1)
        assert breaker.describe().state == "closed"

    def test_timer_flushes_when_traffic_stops(self, redis_client: Any) -> None:
        """With no further call to take them, the timer thread sends pending successes
        within local_state_seconds (+ its tick)."""
        breaker = _breaker(RedisBreakerBackend(lambda: redis_client), local_state_seconds=0.1)
        started = time.monotonic()
        _succeed(breaker, 5)
        wait_for(lambda: breaker.describe().calls == 5, timeout_seconds=5,
                 message="the timer flushed the successes")
        assert time.monotonic() - started <= 0.1 + 0.05 + 0.5  # interval + tick + reads

    def test_zero_is_per_call(self, redis_client: Any) -> None:
        """local_state_seconds=0: every success is in Redis at once, and a trip made
        elsewhere refuses the very next call."""
        backend = RedisBreakerBackend(lambda: redis_client)
        breaker = _breaker(backend, local_state_seconds=0)
        _succeed(breaker, 3)
        assert breaker.describe().calls == 3
        elsewhere = RedisBreakerBackend(lambda: redis_client)
        CircuitBreaker(breaker.config, elsewhere).force("forced_open")
        assert not breaker.acquire().allowed


def _force_open_later(url: str, name: str, delay: float, conn: Any) -> None:
    """Child process: wait, force the breaker open, send the moment it was done."""
    client = redis.Redis.from_url(url, decode_responses=True)
    time.sleep(delay)
    CircuitBreaker(BreakerConfig(name=name), RedisBreakerBackend(lambda: client)).force(
        "forced_open"
    )
    conn.send(time.monotonic())  # CLOCK_MONOTONIC is system-wide: comparable across processes
    conn.close()


class TestTripElsewhere:
    def test_stops_admitting_within_local_state_seconds(
        self, stores: Any, redis_client: Any
    ) -> None:
        """A trip made by another process stops admission here at most local_state_seconds
        later: no call is admitted after trip + S; the calls admitted in between are counted
        (at R calls/s that is at most R * S per process)."""
        seconds = 0.1
        breaker = _breaker(RedisBreakerBackend(lambda: redis_client), local_state_seconds=seconds)
        context = multiprocessing.get_context("fork")
        receive, send = context.Pipe(duplex=False)
        child = context.Process(
            target=_force_open_later, args=(stores.redis_url, breaker.name, 0.3, send)
        )
        child.start()
        admitted: list[float] = []
        refused_at = None
        tripped_at = None
        deadline = time.monotonic() + 10
        while refused_at is None and time.monotonic() < deadline:
            permission = breaker.acquire()
            now = time.monotonic()
            if permission.allowed:
                breaker.record(permission, "success", duration_seconds=0.0)
                admitted.append(now)
            else:
                refused_at = now
            if tripped_at is None and receive.poll():
                tripped_at = receive.recv()
            time.sleep(0.001)
        child.join(10)
        if tripped_at is None:
            tripped_at = receive.recv()
        assert refused_at is not None, "never refused after the trip"
        after = [moment for moment in admitted if moment > tripped_at]
        assert not after or max(after) - tripped_at <= seconds + TOLERANCE
        assert refused_at - tripped_at <= seconds + TOLERANCE
        assert len(admitted) > len(after)  # the copy was in use before the trip
        print(f"admitted after the trip: {len(after)} calls in "
              f"{(max(after) - tripped_at) if after else 0:.3f}s; refused "
              f"{refused_at - tripped_at:.3f}s after it")


def _succeed_until_killed(url: str, name: str, seconds: float, stamps: Any, done: Any) -> None:
    """Child process: record successes on a local-state breaker until SIGKILLed, noting
    when each was recorded."""
    client = redis.Redis.from_url(url, decode_responses=True)
    breaker = CircuitBreaker(
        BreakerConfig(name=name, window=TimeWindow(seconds=60, slots=1), minimum_calls=10**6,
                      local_state_seconds=seconds),
        RedisBreakerBackend(lambda: client),
    )
    while done.value < len(stamps):
        permission = breaker.acquire()
        breaker.record(permission, "success", duration_seconds=0.0)
        stamps[done.value] = time.monotonic()
        done.value += 1
        time.sleep(0.002)
    time.sleep(60)


class TestProcesses:
    def test_sigkill_loses_at_most_the_unflushed_window(
        self, stores: Any, redis_client: Any
    ) -> None:
        """A SIGKILLed process loses only the successes it held: those of its last
        local_state_seconds (+ a tick, + a scheduling slack)."""
        seconds = 0.1
        name = _name()
        context = multiprocessing.get_context("fork")
        stamps = context.Array("d", 5000, lock=False)
        done = context.Value("i", 0, lock=False)
        child = context.Process(
            target=_succeed_until_killed, args=(stores.redis_url, name, seconds, stamps, done)
        )
        child.start()
        wait_for(lambda: done.value >= 400, timeout_seconds=30, message="child recording")
        os.kill(child.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        child.join(10)
        total = done.value
        arrived = CircuitBreaker(
            BreakerConfig(name=name, window=TimeWindow(seconds=60, slots=1)),
            RedisBreakerBackend(lambda: redis_client),
        )
        # A time window shows no figures in describe: read its one slot.
        from resilience.circuit.backends.redis import window_key

        counted = int(redis_client.hget(window_key(arrived.name), "c0") or 0)
        missing = total - counted
        recent = sum(1 for i in range(total) if stamps[i] > killed_at - seconds - 0.15)
        print(f"recorded {total}, in Redis {counted}, lost {missing}, "
              f"recorded in the last {seconds + 0.15:.2f}s: {recent}")
        assert 0 <= missing <= recent
        assert counted > 0

    def test_forked_child_never_sends_the_parents_counts(self, redis_client: Any) -> None:
        """After a fork the child has its own (empty) aggregates; the parent's successes
        are sent once, by the parent."""
        breaker = _breaker(RedisBreakerBackend(lambda: redis_client), local_state_seconds=30)
        _succeed(breaker, 7)
        pid = os.fork()
        if pid == 0:  # the child: flush everything it holds, then leave without cleanup
            try:
                flush_all()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        assert breaker.describe().calls == 0
        flush_all()
        assert breaker.describe().calls == 7

    def test_exit_flushes(self, stores: Any, redis_client: Any) -> None:
        """A normal interpreter exit sends what the process held (atexit); so do a
        worker pool child's shutdown signal and the budget's requests."""
        name = _name()
        code = textwrap.dedent(f"""
            import redis
            from resilience.circuit import BreakerConfig, CircuitBreaker, RedisBreakerBackend
            from resilience.retry.budget import RedisBudgetBackend, RetryBudget, RetryBudgetGate
            client = redis.Redis.from_url({stores.redis_url!r}, decode_responses=True)
            breaker = CircuitBreaker(
                BreakerConfig(name={name!r}, minimum_calls=1000, local_state_seconds=30),
                RedisBreakerBackend(lambda: client))
            for _ in range(11):
                breaker.record(breaker.acquire(), "success", duration_seconds=0.0)
            gate = RetryBudgetGate({name!r}, RetryBudget(flush_seconds=30),
                                   RedisBudgetBackend(lambda: client))
            for _ in range(6):
                gate.count_later({{}}, "request")
        """)
        subprocess.run([sys.executable, "-c", code], check=True, timeout=30,
                       cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                           os.path.dirname(os.path.abspath(__file__))))))
        backend = RedisBreakerBackend(lambda: redis_client)
        assert backend.describe([name])[0].calls == 11
        gate = RetryBudgetGate(name, RetryBudget(), RedisBudgetBackend(lambda: redis_client))
        assert gate.describe().requests == 6


class TestBudgetAggregation:
    def test_requests_wait_and_come_with_the_next_decision(self, redis_client: Any) -> None:
        """Guard-path requests wait in the process; a retry decision takes them along in
        its own script call (so it is judged on them), and a flush sends the rest."""
        budget = RetryBudget(ratio=0.5, min_per_second=0, window_seconds=60, flush_seconds=30)
        gate = RetryBudgetGate(_name(), budget, RedisBudgetBackend(lambda: redis_client))
        for _ in range(4):
            gate.count_later({}, "request")
        assert gate.describe().requests == 0
        decision = gate.try_spend()  # 1 retry <= 0.5 * 4: allowed only with the 4 counted
        assert (decision.allowed, decision.requests, decision.retries) == (True, 4, 1)
        for _ in range(3):
            gate.count_later({}, "request")
        flush_all()
        assert gate.describe().requests == 7

    def test_zero_counts_each_request(self, redis_client: Any) -> None:
        """flush_seconds=0: each request is its own script call, in the call's round."""
        from resilience.batch import for_client

        budget = RetryBudget(flush_seconds=0)
        gate = RetryBudgetGate(_name(), budget, RedisBudgetBackend(lambda: redis_client))
        rounds: dict[Any, Any] = {}
        gate.count_later(rounds, "request")
        assert len(for_client(rounds, redis_client)) == 1
        for_client(rounds, redis_client).execute()
        assert gate.describe().requests == 1
