"""Giving up on a call: record it in the dead-letter place, count it, build the error to raise."""

from __future__ import annotations

import itertools
import logging
import threading
from typing import Any

from resilience.counters import count_outcome
from resilience.deadletter.place import dead_letter
from resilience.errors import DeadLettered, StorageError
from resilience.outcomes import Outcome

logger = logging.getLogger("resilience.deadletter")


class MemoryDeadLetters:
    """The dead-letter place of `resilience.stores.MemoryStores`: the rows `dead_letter`
    would write, kept in a list (`rows`) for tests to read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        #: Each entry's fields as given to `add`, with its `id`.
        self.rows: list[dict[str, Any]] = []

    def add(self, **fields: Any) -> int:
        # As the table keeps them: arguments as a JSON list and object.
        fields["args"] = list(fields.get("args") or ())
        fields["kwargs"] = dict(fields.get("kwargs") or {})
        with self._lock:
            entry_id = next(self._ids)
            self.rows.append({"id": entry_id, **fields})
        return entry_id


class PostgresDeadLetters:
    """The dead-letter place in the stores' PostgreSQL (`dead_letter`)."""

    def __init__(self, stores: Any) -> None:
        self.stores = stores

    def add(self, **fields: Any) -> int:
        return dead_letter(self.stores.guard_engine(), **fields)


def dead_letter_place(stores: Any) -> PostgresDeadLetters | MemoryDeadLetters:
    """Where `give_up` writes: PostgreSQL, or memory on `MemoryStores`."""
    return stores.backend("dead letters", PostgresDeadLetters, memory=MemoryDeadLetters)


def give_up(call: Any, *, guard: str, reason: str, attempts: int,
            exception: BaseException | None = None, name: str | None = None,
            dependency: str | None = None) -> DeadLettered:
    """Dead-letter `call` and return the `DeadLettered` error the caller raises.

    `dependency` names the dependency that was down (its breaker open, its retry budget
    spent), so automatic replay can requeue the row once it recovered; None when the job
    itself is at fault. If PostgreSQL cannot take the row the job still fails, and the error
    says the record is missing (the log line has the arguments).
    """
    task = call.task
    tier = getattr(task, "tier", None)
    entry_id: int | None = None
    try:
        entry_id = dead_letter_place(call.stores).add(
            task_name=task.name, task_id=call.task_id, args=call.args, kwargs=call.kwargs,
            guard=guard, reason=reason, attempts=attempts, tier=tier, queue=call.queue,
            exception=exception, dependency=dependency)
    except StorageError as exc:
        logger.error("dead letter NOT recorded for %s[%s] args=%r kwargs=%r: %s",
                     task.name, call.task_id, call.args, call.kwargs, exc)
    count_outcome(task.app, Outcome.DEAD_LETTERED.value, guard=guard, tier=tier, name=name,
                  reason=reason)
    logger.warning("job dead-lettered", extra={
        "task_id": call.task_id, "task_name": task.name, "tier": tier, "guard": guard,
        "outcome": Outcome.DEAD_LETTERED.value, "reason": reason, "dead_letter_id": entry_id})
    suffix = f" (dead letter {entry_id})" if entry_id is not None else " (record FAILED)"
    return DeadLettered(f"DEAD-LETTERED by {guard}: {reason}{suffix}", reason=reason,
                        guard=guard, dead_letter_id=entry_id)
