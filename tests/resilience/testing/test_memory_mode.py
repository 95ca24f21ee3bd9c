"""Test mode (`resilience.testing.memory_mode`, `resilience_stores = "memory"`): one switch
puts every guard of an app in memory, with its Redis and PostgreSQL URLs pointing at ports
where nothing listens, and each block starts from empty state.

The app here is a user's own (`init_app`), eager; the pytest plugin and the README's
idioms run in a subprocess pytest (test_readme.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

import resilience
from jobs.embedded import free_port
from resilience.circuit import circuit_breaker
from resilience.errors import ConfigurationError, DeadLettered, JobDeferred
from resilience.idempotency import idempotent
from resilience.locks import singleton
from resilience.ratelimit import rate_limit
from resilience.retry import retry_policy
from resilience.stores import MemoryStores, Stores, stores_for
from resilience.testing import memory_mode


class NonRetryable(ValueError):
    """A failure the retry guard dead-letters at once (a ValueError)."""


def dead_app(**conf: Any) -> Celery:
    """A user's app whose guard stores are unreachable: nothing listens on its ports."""
    app = Celery(f"dead-{free_port()}", broker=f"redis://127.0.0.1:{free_port()}/0")
    app.conf.resilience_redis_url = f"redis://127.0.0.1:{free_port()}/1"
    app.conf.resilience_database_url = f"postgresql://shop@127.0.0.1:{free_port()}/shop"
    app.conf.resilience_socket_timeout_seconds = 0.5
    app.conf.task_always_eager = True
    app.conf.update(conf)
    return resilience.init_app(app)


@pytest.fixture()
def shop() -> Iterator[tuple[Celery, dict[str, Any]]]:
    """The app and its guarded tasks, with what each body did."""
    app = dead_app()
    runs: list[Any] = []

    @app.task
    @idempotent(key="{order_id}")
    def charge(order_id: int) -> int:
        runs.append(order_id)
        return order_id * 100

    @app.task
    @circuit_breaker("vendor", minimum_calls=2, failure_rate_threshold=0.5, window=4,
                     open_seconds=60)
    def call_vendor(fail: bool) -> str:
        runs.append(("vendor", fail))
        if fail:
            raise ConnectionError("vendor down")
        return "ok"

    @app.task
    @rate_limit("emails", "1/minute")
    def email(to: str) -> str:
        runs.append(("email", to))
        return to

    @app.task
    @retry_policy(max_attempts=2)
    def parse(text: str) -> int:
        raise NonRetryable(text)

    @app.task
    @singleton(key="{name}")
    def nightly(name: str) -> str:
        return name

    yield app, {"charge": charge, "call_vendor": call_vendor, "email": email,
                "parse": parse, "nightly": nightly, "runs": runs}


class TestMemoryMode:
    def test_an_idempotent_task_runs_once_and_the_next_block_starts_clean(
        self, shop: tuple[Celery, dict[str, Any]]
    ) -> None:
        """Twice in one block: one run, one REPLAYED counted, the first value answered;
        in the next block the record is gone and the body runs again."""
        app, tasks = shop
        with memory_mode() as mode:
            assert isinstance(stores_for(app), MemoryStores)
            assert tasks["charge"].delay(7).get() == 700
            assert tasks["charge"].delay(7).get() == 700
            assert tasks["runs"] == [7]
            assert mode.outcomes(app)["REPLAYED"] == 1
        with memory_mode() as mode:
            assert tasks["charge"].delay(7).get() == 700
            assert tasks["runs"] == [7, 7]
            assert mode.outcomes(app)["REPLAYED"] == 0
        assert not isinstance(stores_for(app), MemoryStores)

    def test_a_breaker_and_a_rate_limit_act_in_memory_and_are_reset(
        self, shop: tuple[Celery, dict[str, Any]]
    ) -> None:
        """The breaker opens after its failures and defers the next call without running
        it; the rate limit defers the second email. Both are bound once per task, and
        both are empty again in the next block."""
        _, tasks = shop
        vendor, email = tasks["call_vendor"], tasks["email"]
        for _ in range(2):
            with memory_mode():
                for _ in range(2):
                    with pytest.raises(ConnectionError):
                        vendor.delay(True).get()
                with pytest.raises(JobDeferred, match="breaker"):
                    vendor.delay(False).get()
                assert email.delay("a@example.com").get() == "a@example.com"
                with pytest.raises(JobDeferred):
                    email.delay("b@example.com").get()
        assert tasks["runs"].count(("vendor", True)) == 4
        assert ("vendor", False) not in tasks["runs"]
        assert tasks["runs"].count(("email", "a@example.com")) == 2
        assert ("email", "b@example.com") not in tasks["runs"]

    def test_a_non_retryable_failure_is_dead_lettered_in_memory(
        self, shop: tuple[Celery, dict[str, Any]]
    ) -> None:
        """The retry guard (with its budget) dead-letters a non-retryable error; the row is
        kept in memory for the test to read."""
        app, tasks = shop
        with memory_mode() as mode:
            with pytest.raises(DeadLettered):
                tasks["parse"].delay("x").get()
            (row,) = mode.dead_letters(app)
            assert row["task_name"] == tasks["parse"].name
            assert row["args"] == ["x"]
            assert mode.outcomes(app)["DEAD-LETTERED"] == 1

    def test_a_singleton_runs_in_memory_and_a_server_is_a_named_error(
        self, shop: tuple[Celery, dict[str, Any]]
    ) -> None:
        """`@singleton` has an in-memory lock (test_memory_backends.py); code that reaches
        for a server in memory is refused, naming why, instead of reaching for the
        configured one."""
        app, tasks = shop
        with memory_mode():
            assert tasks["nightly"].delay("report").get() == "report"
            with pytest.raises(ConfigurationError, match="in-memory stores"):
                stores_for(app).engine()


class TestMemoryConfiguration:
    def test_resilience_stores_memory_keeps_one_app_in_memory(self) -> None:
        """`resilience_stores = "memory"`: that app's guards in memory for good, no switch."""
        app = dead_app(resilience_stores="memory")
        runs: list[int] = []

        @app.task
        @idempotent(key="{order_id}")
        def charge(order_id: int) -> int:
            runs.append(order_id)
            return order_id

        assert [charge.delay(3).get() for _ in range(3)] == [3, 3, 3]
        assert runs == [3]
        assert isinstance(stores_for(app), MemoryStores)

    def test_an_unknown_stores_kind_is_refused(self) -> None:
        with pytest.raises(ConfigurationError, match="resilience_stores must be"):
            Stores.from_conf({"resilience_stores": "memroy",
                              "resilience_redis_url": "redis://127.0.0.1:1/0"})
