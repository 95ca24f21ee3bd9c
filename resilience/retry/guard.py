"""`RetryGuard` (Stage.RETRY) and the `@retry_policy(...)` decorator.

Every execution counts as a request of the dependency's budget. On error, in order: Celery's
own `Retry` passes through (counted as a forced retry); a non-retryable error, exhausted
attempts, a Retry-After beyond the max countdown or a refused budget dead-letter the job;
otherwise Celery's `task.retry` with the backoff delay. See docs/failure.md, "Retry policy".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from celery.exceptions import Ignore, Reject, Retry

from resilience.classify import ClassifyHook, is_retryable, retry_after
from resilience.config import check, configured
from resilience.errors import ConfigurationError, DeadLettered
from resilience.headers import PREVIOUS_DELAY_HEADER
from resilience.outcomes import Outcome
from resilience.pipeline import Call, Guard, Stage, attach
from resilience.retry.backoff import Wait, check_backoff, wait_full_jitter
from resilience.retry.budget import (
    RedisBudgetBackend,
    RetryBudget,
    RetryBudgetGate,
    budget_backend_of_app,
)

if TYPE_CHECKING:
    from celery import Task

DEFAULT_MAX_COUNTDOWN_SECONDS = 300.0


@dataclass(frozen=True, kw_only=True)
class RetryConfig:
    """How one task retries.

    Args:
        max_attempts: executions in total, the first included (1 = never retry).
        backoff: a strategy of `resilience.retry.backoff` (default
            `wait_full_jitter(base=1, cap=60)`); strategies compose with `+`:
            `wait_exponential(base=1, cap=30) + wait_random(0, 1)`.
        dependency: name of the budget (several tasks calling one service share it);
            None = the task's name.
        budget: the fleet-wide retry budget; None disables it (only max_attempts bounds retries).
        classify_hooks: callables `hook(exc) -> bool | None` consulted before the built-in rules.
    """

    max_attempts: int = 3
    backoff: Wait = field(default_factory=wait_full_jitter)
    dependency: str | None = None
    budget: RetryBudget | None = field(default_factory=RetryBudget)
    classify_hooks: Sequence[ClassifyHook] = ()

    def __post_init__(self) -> None:
        check(self, "max_attempts", "an int >= 1", lambda v: isinstance(v, int) and v >= 1)
        check_backoff(self.backoff)
        check(self, "budget", "a RetryBudget or None",
              lambda v: v is None or isinstance(v, RetryBudget))
        for hook in self.classify_hooks:
            if not callable(hook):
                raise ConfigurationError(f"classify hook {hook!r} is not callable")
        object.__setattr__(self, "classify_hooks", tuple(self.classify_hooks))

    def delay_seconds(
        self, attempt: int, exc: BaseException, previous_delay_seconds: float | None = None
    ) -> float:
        """Delay after failed `attempt` with `exc`; Retry-After honoured as the minimum."""
        delay = self.backoff(attempt, previous_delay_seconds)
        asked = retry_after(exc)
        return delay if asked is None else max(delay, asked)


class RetryGuard(Guard):
    """Classifies failures and retries them through Celery within a fleet-wide budget."""

    name = "retry"
    stage = Stage.RETRY

    def __init__(self, policy: RetryConfig, *, backend: RedisBudgetBackend | None = None) -> None:
        self.policy = policy
        self._backend = backend
        self.gate: RetryBudgetGate | None = None
        self.task: Task | None = None

    def bind(self, task: Task) -> None:
        self.task = task
        if self.policy.budget is not None:
            backend = self._backend or budget_backend_of_app(task.app)
            self.gate = RetryBudgetGate(self.dependency, self.policy.budget, backend)

    @property
    def dependency(self) -> str:
        return self.policy.dependency or (self.task.name if self.task else "?")

    # Every execution counts as a request of the budget. The count is sent with the call's
    # after-run writes (no round trip of its own), or inside the retry decision it precedes.
    def before_run(self, call: Call) -> None:
        if self.gate is not None:
            call.keep(self, _UNCOUNTED)

    def release(self, call: Call, mode: str = "request") -> None:
        """Count the execution as a budget request, unless a retry decision took it along."""
        if self.gate is not None and call.take_back(self) is _UNCOUNTED:
            self.gate.count_later(call.writes, mode)

    def on_error(self, call: Call, exc: BaseException) -> None:
        try:
            if isinstance(exc, Retry):
                self.release(call, "request+forced")
                return
            if isinstance(exc, Ignore | Reject | DeadLettered) or not isinstance(exc, Exception):
                return
            raise self.decide(call, exc)
        finally:
            self.release(call)

    def decide(self, call: Call, exc: Exception) -> BaseException:
        """The error to raise instead of `exc`: Celery's `Retry`, or `DeadLettered`."""
        task, attempt, policy = call.task, call.attempt, self.policy

        def dead(reason: str, *, dependency_down: bool = False) -> BaseException:
            return call.dead_letter(guard=self.name, reason=reason, exception=exc,
                                    name=self.dependency,
                                    dependency=self.dependency if dependency_down else None)

        if not is_retryable(exc, policy.classify_hooks):
            return dead(f"non-retryable {type(exc).__name__}: {exc}")
        if attempt >= policy.max_attempts:
            return dead(f"attempts exhausted ({attempt} of {policy.max_attempts})")
        cap = float(
            task.app.conf.get("resilience_max_countdown_seconds") or DEFAULT_MAX_COUNTDOWN_SECONDS
        )
        asked = retry_after(exc)
        if asked is not None and asked > cap:
            return dead(f"Retry-After {asked:g}s exceeds the max countdown {cap:g}s")
        delay = min(cap, policy.delay_seconds(attempt, exc, call.headers.previous_delay))
        if self.gate is not None:
            decision = self.gate.try_spend(with_request=call.take_back(self) is _UNCOUNTED)
            if not decision.allowed:
                return dead(
                    f"retry budget of {self.dependency!r} exhausted "
                    f"({decision.retries} retries / {decision.requests} requests in window)",
                    dependency_down=True,
                )
        call.count(Outcome.RETRY, guard=self.name, name=self.dependency)
        headers = dict(getattr(call.request, "headers", None) or {})
        headers[PREVIOUS_DELAY_HEADER] = delay
        try:
            task.retry(exc=exc, countdown=delay, max_retries=policy.max_attempts - 1,
                       headers=headers)
        except BaseException as raised:  # noqa: BLE001 - Retry; called inline: exc itself
            return raised
        return exc  # pragma: no cover - task.retry always raises


#: The retry guard's slot while this execution is not yet counted as a budget request.
_UNCOUNTED = "uncounted"


def retry_policy(
    config: RetryConfig | None = None, /, **overrides: Any
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: classified, jittered, budgeted retries through Celery's own retry.

    Takes a `RetryConfig` and/or keyword overrides of its fields (options, defaults and
    meaning: `RetryConfig`); `budget=None` disables the budget.

    Raises:
        ConfigurationError: at definition time: an unknown option or a value `RetryConfig`
            refuses (max_attempts < 1, a backoff that is not a strategy object, ...).
    """
    policy = configured(RetryConfig, config, overrides, where="retry_policy")

    return lambda func: attach(func, RetryGuard(policy))
