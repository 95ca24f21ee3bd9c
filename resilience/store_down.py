"""One vocabulary for what a guard does when its store cannot be reached.

Every guard takes `on_store_down=` with one of two values:

- `"fail_open"`: the guard lets the job through as if it had said yes, logs a warning and
  counts the outcome `FAIL-OPEN` (defaults of breakers, budgets, limits, admission, unique
  enqueue: losing them for a while costs less than stopping every job);
- `"fail_closed"`: the guard says no in its own way: an execution guard DEFERS the job (no
  retry spent), the retry budget refuses the retry (the job is dead-lettered), admission
  and unique enqueue raise to the caller (defaults of idempotency and exclusivity: never
  risk a double effect).

Only an unreachable store (`StoreUnavailable`) is "down". A store that answers with a
deterministic error (`StoreRejected`: a value too long, a wrong type) is a bug the job cannot
outrun by waiting: the guard dead-letters the job with the store's reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

from resilience.errors import ConfigurationError


class StoreDown(str, Enum):
    """What a guard does while its store is unreachable."""

    FAIL_OPEN = "fail_open"
    FAIL_CLOSED = "fail_closed"

    def __str__(self) -> str:
        return self.value


def store_down_policy(value: Any, *, option: str = "on_store_down") -> StoreDown:
    """Parse a store-down policy: "fail_open", "fail_closed" or a `StoreDown` member.

    Raises:
        ConfigurationError: any other value (the message names the two valid ones).
    """
    if isinstance(value, StoreDown):
        return value
    if isinstance(value, str):
        try:
            return StoreDown(value)
        except ValueError:
            pass
    raise ConfigurationError(
        f"{option} must be 'fail_open' or 'fail_closed', got {value!r}", option=option
    )


def store_failed(call: Any, error: Exception, *, guard: str, policy: StoreDown,
                 retry_after_seconds: float, name: str | None = None,
                 details: Mapping[str, Any] | None = None) -> None:
    """Apply an execution guard's store-down policy to `error`.

    Returns when failing open (warned, counted FAIL-OPEN): the guard lets the call run.

    Raises:
        Stop: DEFERRED, failing closed while the store is unreachable.
        DeadLettered: the store rejected the operation (`StoreRejected`): waiting cannot help.
    """
    import logging

    from resilience.counters import count_call
    from resilience.errors import StoreRejected
    from resilience.outcomes import Outcome, Stop

    if isinstance(error, StoreRejected):
        from resilience.deadletter.giveup import give_up

        raise give_up(
            call, guard=guard, reason=f"the store refused the operation: {error}",
            attempts=int(getattr(call.request, "retries", 0) or 0) + 1, exception=error,
            name=name,
        ) from error
    logger = logging.getLogger(f"resilience.{guard}")
    if policy is StoreDown.FAIL_OPEN:
        logger.warning("%s: store unavailable, running unguarded (fail_open): %s", guard, error)
        count_call(call, Outcome.FAIL_OPEN.value, guard=guard, name=name)
        return
    count_call(call, Outcome.DEFERRED.value, guard=guard, name=name)
    raise Stop(
        Outcome.DEFERRED, guard=guard,
        reason=f"store unavailable, failing closed: {error}",
        retry_after_seconds=retry_after_seconds,
        details={**(details or {}), "store_down": True},
    ) from error
