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

import logging
from collections.abc import Mapping
from enum import Enum
from typing import Any

from resilience.errors import ConfigurationError, StoreRejected
from resilience.outcomes import Outcome, Stop


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
    try:
        return StoreDown(value)
    except ValueError:
        raise ConfigurationError(
            f"{option} must be 'fail_open' or 'fail_closed', got {value!r}", option=option
        ) from None


def store_failed(call: Any, error: Exception, *, guard: str, policy: StoreDown,
                 retry_after_seconds: float, name: str | None = None,
                 details: Mapping[str, Any] | None = None) -> None:
    """Apply an execution guard's store-down policy to `error` met by `call` (a
    `resilience.pipeline.Call`: its `count` and `dead_letter` services record the decision).

    Returns when failing open (warned, counted FAIL-OPEN): the guard lets the call run.

    Raises:
        Stop: DEFERRED, failing closed while the store is unreachable.
        DeadLettered: the store rejected the operation (`StoreRejected`): waiting cannot help.
    """
    if isinstance(error, StoreRejected):
        raise call.dead_letter(guard=guard, reason=f"the store refused the operation: {error}",
                               exception=error, name=name) from error
    if policy is StoreDown.FAIL_OPEN:
        logging.getLogger(f"resilience.{guard}").warning(
            "%s: store unavailable, running unguarded (fail_open): %s", guard, error)
        call.count(Outcome.FAIL_OPEN, guard=guard, name=name)
        return
    call.count(Outcome.DEFERRED, guard=guard, name=name)
    raise Stop(
        Outcome.DEFERRED, guard=guard,
        reason=f"store unavailable, failing closed: {error}",
        retry_after_seconds=retry_after_seconds,
        details={**(details or {}), "store_down": True}) from error
