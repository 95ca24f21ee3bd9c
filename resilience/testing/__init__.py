"""Test mode: every guard keeps its state in this process's memory, fresh for each test.

Neither Redis nor PostgreSQL is needed or reached, whatever the app's `resilience_*` URLs
say: `@idempotent` records, `@unique` keys, breakers, limits, retry budgets, counters and
dead letters live in one `MemoryStores` per app (`resilience.stores.use_memory_stores`).
Works with `task_always_eager` and with a worker in a thread (`celery.contrib.pytest`'s
`celery_worker`), which shares the process's memory.

    with memory_mode() as mode:
        charge.delay(42); charge.delay(42)
        assert mode.outcomes(app)["REPLAYED"] == 1

`@singleton` and `@exclusive` lock in memory (with fencing tokens `FencingTokens.guard_write`
checks in memory); `apply_async_in(session, ...)` publishes when `session` commits and
nothing on rollback (the backends' modules say how). Durable workflows and batches run in
process, as Celery runs a canvas eagerly (`resilience.workflows.eager`); their operator
actions (cancel, retry, replay) need PostgreSQL. pytest users take the
`resilience_memory` fixture instead (`resilience.testing.pytest_plugin`, registered by the
`[pytest]` extra's entry point).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from resilience.counters import counters_client, read_all
from resilience.deadletter.giveup import MemoryDeadLetters, dead_letter_place
from resilience.errors import ConfigurationError
from resilience.stores import MemoryStores, memory_stores_in_use, stores_for, use_memory_stores

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["MemoryMode", "memory_mode"]


class MemoryMode:
    """What a test reads of the in-memory guard state (given by `memory_mode`)."""

    def stores(self, app: Celery) -> MemoryStores:
        """`app`'s in-memory stores."""
        stores = stores_for(app)
        if not isinstance(stores, MemoryStores):
            raise ConfigurationError(
                f"the stores of {app.main!r} are not in memory: use MemoryMode inside "
                "memory_mode() (or the resilience_memory fixture)"
            )
        return stores

    def outcomes(self, app: Celery, task: str | None = None) -> Counter[str]:
        """How many times each guard decision (`REPLAYED`, `DEFERRED`, ...) was counted on
        `app` in this test, for one task name or all."""
        found: Counter[str] = Counter()
        for labels, value in read_all(counters_client(app)):
            if task is None or labels.get("name") == task:
                found[labels["outcome"]] += value
        return found

    def dead_letters(self, app: Celery) -> list[dict[str, Any]]:
        """The jobs dead-lettered on `app` in this test (their `dead_letter` fields)."""
        place = dead_letter_place(self.stores(app))
        return list(place.rows) if isinstance(place, MemoryDeadLetters) else []

    def reset(self) -> None:
        """Forget every guard's state (what a new test starts from)."""
        for stores in memory_stores_in_use():
            stores.reset()


@contextmanager
def memory_mode() -> Iterator[MemoryMode]:
    """Every app's guards in memory for the block, starting and ending empty.

    Guards bind their backend on a task's first call: call a guarded task first inside
    memory mode (not before, in a test without it), or it keeps the stores it bound.
    """
    mode = MemoryMode()
    use_memory_stores(True)
    mode.reset()
    try:
        yield mode
    finally:
        mode.reset()
        use_memory_stores(False)
