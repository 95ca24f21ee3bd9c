"""Poison messages: a message whose execution never finishes is dead-lettered after N deliveries.

A message that kills its worker process each time loops forever under `acks_late` +
`reject_on_worker_lost`. `PoisonGuard` counts only redeliveries (`delivery_info
["redelivered"]`, set by RabbitMQ and kombu's Redis restore), per task id in Redis; any
normal end of an execution deletes the count, so only executions that never return leave it
behind. It runs before any guard takes a claim, a lock or a permit, and fails open when Redis
is unreachable. See docs/failure.md, "Poison messages".
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from resilience.config import check, configured
from resilience.keys import redis_key
from resilience.pipeline import Call, Guard, Stage, attach
from resilience.scripts import LuaScript

if TYPE_CHECKING:
    import redis

logger = logging.getLogger("resilience.deadletter.poison")

NAMESPACE = "resilience:deliveries"


def deliveries_key(task_id: str) -> str:
    """The Redis key of `task_id`'s redelivery counter (see `resilience.keys.redis_key`)."""
    return redis_key(NAMESPACE, task_id)


@dataclass(frozen=True, kw_only=True)
class PoisonConfig:
    """Args:
    max_deliveries: deliveries that may end without the execution returning; the next
        delivery is dead-lettered (3 = run at most 3 times, dead-letter the 4th delivery).
    ttl_seconds: lifetime of a delivery counter (a loop longer apart than this restarts).
    """

    max_deliveries: int = 3
    ttl_seconds: float = 24 * 3600

    def __post_init__(self) -> None:
        check(self, "max_deliveries", "an int >= 1", lambda v: isinstance(v, int) and v >= 1)
        check(self, "ttl_seconds", "> 0", lambda v: v > 0)


class PoisonGuard(Guard):
    """Counts deliveries per task id; dead-letters a message delivered too often."""

    name = "poison"
    stage = Stage.POISON
    SCRIPT = LuaScript.load(__file__, "deliveries.lua")

    def __init__(self, policy: PoisonConfig, *,
                 client: Callable[[], redis.Redis] | None = None) -> None:
        self.policy = policy
        self._client = client

    def _redis(self, call: Call) -> redis.Redis:
        return self._client() if self._client is not None else call.stores.redis()

    def before_run(self, call: Call) -> None:
        task_id = call.task_id
        if not task_id or getattr(call.request, "called_directly", False):
            return
        if not (getattr(call.request, "delivery_info", None) or {}).get("redelivered"):
            return  # a first delivery costs nothing
        try:
            deliveries = int(self.SCRIPT(self._redis(call), [deliveries_key(task_id)],
                                         [int(self.policy.ttl_seconds * 1000)]))
        except Exception as exc:  # noqa: BLE001 - fail open: the job runs, with a warning
            logger.warning("poison check skipped for %s (Redis unavailable): %s", task_id, exc)
            return
        # The counter holds redeliveries; the first delivery was never counted.
        deliveries += 1
        call.keep(self, deliveries)
        if deliveries > self.policy.max_deliveries:
            self._forget(call)
            raise call.dead_letter(
                guard=self.name, attempts=deliveries - 1,
                reason=f"poison message: delivered {deliveries} times, the previous "
                       f"{deliveries - 1} never finished (worker lost each time)")

    def _forget(self, call: Call) -> None:
        try:
            self._redis(call).delete(deliveries_key(call.task_id))
        except Exception as exc:  # noqa: BLE001 - a stale count only expires later
            logger.warning("delivery counter of %s not cleared: %s", call.task_id, exc)

    def release(self, call: Call) -> None:
        """Any normal end of the execution clears the count (see the module doc)."""
        if call.take_back(self) is not None:
            self._forget(call)


def poison_guard(config: PoisonConfig | None = None, /,
                 **overrides: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: dead-letter a message after `max_deliveries` executions that never returned.

    Takes a `PoisonConfig` and/or keyword overrides of its fields (options, defaults and
    meaning: `PoisonConfig`).

    Raises:
        ConfigurationError: an unknown option, max_deliveries < 1 or ttl_seconds <= 0.
    """
    guard = PoisonGuard(configured(PoisonConfig, config, overrides, where="poison_guard"))
    return lambda func: attach(func, guard)
