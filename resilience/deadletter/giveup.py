"""Giving up on a call: record it in the dead-letter place, count it, build the error to raise."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from resilience.counters import count_outcome
from resilience.deadletter.place import dead_letter
from resilience.errors import DeadLettered, StorageError
from resilience.outcomes import Outcome
from resilience.stores import stores_for

if TYPE_CHECKING:
    from resilience.pipeline import Call

logger = logging.getLogger("resilience.deadletter")


def give_up(
    call: Call,
    *,
    guard: str,
    reason: str,
    attempts: int,
    exception: BaseException | None = None,
    name: str | None = None,
    dependency: str | None = None,
) -> DeadLettered:
    """Dead-letter `call` and return the `DeadLettered` error the caller raises.

    `dependency` names the dependency that was down (its breaker open, its retry budget
    spent): the row records it, and automatic replay requeues it once that dependency's
    breaker has stayed closed long enough. None when the job itself is at fault.

    The task then fails (state FAILURE in Flower) and its message is acknowledged, so it is
    not delivered again. If PostgreSQL cannot take the row the job still fails, and the
    error says the record is missing (the log line has the arguments).
    """
    task = call.task
    request = call.request
    delivery_info = getattr(request, "delivery_info", None) or {}
    queue = delivery_info.get("routing_key") or getattr(task, "queue", None)
    tier = getattr(task, "tier", None)
    stores = stores_for(task.app)
    entry_id: int | None = None
    try:
        entry_id = dead_letter(
            stores.engine(),
            task_name=task.name,
            task_id=call.task_id,
            args=call.args,
            kwargs=call.kwargs,
            guard=guard,
            reason=reason,
            attempts=attempts,
            tier=tier,
            queue=queue,
            exception=exception,
            dependency=dependency,
        )
    except StorageError as exc:
        logger.error(
            "dead letter NOT recorded for %s[%s] args=%r kwargs=%r: %s",
            task.name,
            call.task_id,
            call.args,
            call.kwargs,
            exc,
        )
    count_outcome(task.app, Outcome.DEAD_LETTERED.value, guard=guard, tier=tier, name=name,
                  reason=reason)
    logger.warning(
        "job dead-lettered",
        extra={
            "task_id": call.task_id,
            "task_name": task.name,
            "tier": tier,
            "guard": guard,
            "outcome": Outcome.DEAD_LETTERED.value,
            "reason": reason,
            "dead_letter_id": entry_id,
        },
    )
    suffix = f" (dead letter {entry_id})" if entry_id is not None else " (record FAILED)"
    return DeadLettered(
        f"DEAD-LETTERED by {guard}: {reason}{suffix}",
        reason=reason,
        guard=guard,
        dead_letter_id=entry_id,
    )
