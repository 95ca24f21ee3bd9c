"""`BreakerGuard` (Stage.BREAKER) and the `@circuit_breaker(...)` decorator.

Open (or half-open with every probe out): the call is DEFERRED until the breaker may
half-open, dead-lettered when that lies beyond the job's deadline, or answered by
`fallback=`. A retryable error is a failure; a non-retryable one and a guard's stop are
"ignored" (a probe permit is given back). See docs/failure.md, "Circuit breaker".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from celery.exceptions import Retry

from resilience.admission.breaker import BreakerAdmissionGuard
from resilience.circuit.backends import BreakerBackend, Permission, backend_of_app
from resilience.circuit.breaker import CircuitBreaker
from resilience.circuit.config import AdmissionConfig, BreakerConfig, CountWindow, TimeWindow
from resilience.classify import ClassifyHook, is_retryable
from resilience.config import configured
from resilience.errors import DeadLettered, StoreRejected, StoreUnavailable
from resilience.outcomes import Outcome, Stop
from resilience.pipeline import Call, Guard, Stage, attach
from resilience.store_down import store_failed

if TYPE_CHECKING:
    from celery import Task

logger = logging.getLogger("resilience.circuit")


def original_error(exc: BaseException) -> BaseException:
    """The body's own error behind Celery's `Retry` or the retry guard's `DeadLettered`."""
    for _ in range(5):
        if isinstance(exc, Retry) and isinstance(exc.exc, BaseException):
            exc = exc.exc
        elif isinstance(exc, DeadLettered | Retry) and (exc.__cause__ or exc.__context__):
            exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
        else:
            break
    return exc


def _redis_backend(task: Task) -> BreakerBackend:
    """The default store of a fleet-wide breaker: the app's (`backend_of_app`)."""
    return backend_of_app(task.app)


class BreakerGuard(Guard):
    """Gates a task's calls on a fleet-wide circuit breaker.

    Args:
        config: the breaker's thresholds and timings.
        backend: where the breaker lives: a `BreakerBackend`, or a callable giving one for
            the bound task; None = the app's shared Redis.
        classify_hooks: extra rules telling a failure from an ignored error.
    """

    name = "breaker"
    stage = Stage.BREAKER

    def __init__(
        self, config: BreakerConfig, *,
        backend: BreakerBackend | Callable[[Task], BreakerBackend] | None = None,
        classify_hooks: Iterable[ClassifyHook] = (),
    ) -> None:
        self.config = config
        self.classify_hooks = tuple(classify_hooks)
        self._backend = backend if backend is not None else _redis_backend
        self.breaker = None if callable(self._backend) else CircuitBreaker(config, self._backend)
        self.task: Task | None = None

    def bind(self, task: Task) -> None:
        self.task = task
        if self.breaker is None:  # the backend is a callable of the task
            self.breaker = CircuitBreaker(self.config, self._backend(task))

    def prefetch(self, call: Call) -> None:
        assert self.breaker is not None, "BreakerGuard used before bind()"
        # A 1-tuple: a kept None (the breaker is not closed) is not "nothing prefetched".
        self.breaker.peek_later(call.reads, lambda peek: call.keep(self, (peek,)))

    def before_run(self, call: Call) -> None:
        assert self.breaker is not None, "BreakerGuard used before bind()"
        kept = call.take_back(self)
        peek = kept[0] if kept is not None else None
        if isinstance(peek, StoreUnavailable):
            # The store just failed the call's read; asking again would only wait twice.
            permission = self.breaker.store_down(peek)
        else:
            # A closed breaker's acquire only reads; the prefetched read stands in for it.
            permission = peek if isinstance(peek, Permission) else None
            if permission is None:
                try:
                    permission = self.breaker.acquire()
                except StoreRejected as rejected:
                    store_failed(call, rejected, guard=self.name, policy=self.config.on_store_down,
                                 retry_after_seconds=self.config.open_seconds,
                                 name=self.config.name)
                    raise  # store_failed always raises for a rejection
        if permission.allowed:
            call.keep(self, (permission, time.monotonic()))
            return
        call.count(Outcome.DEFERRED if self.config.fallback is None else Outcome.SKIPPED,
                   guard=self.name, name=self.config.name)
        name, state = self.config.name, permission.state
        details = {"breaker": name, "state": state}
        if self.config.fallback is not None:
            raise Stop(Outcome.SKIPPED, guard=self.name,
                       reason=f"breaker {name} is {state}; fallback used",
                       result=self.config.fallback(**call.arguments),
                       details={**details, "fallback": True})
        wait = max(0.05, permission.wait_seconds)
        expires = call.headers.expires_at
        if expires is not None and time.time() + wait > expires:
            raise call.dead_letter(
                guard=self.name, name=name, dependency=name,
                reason=f"breaker {name} is {state} for {wait:.1f}s more, beyond the job's deadline",
            )
        raise Stop(Outcome.DEFERRED, guard=self.name, reason=f"breaker {name} is {state}",
                   retry_after_seconds=wait, details=details)

    def _finish(self, call: Call, outcome: str) -> None:
        held = call.take_back(self)
        if held is None or self.breaker is None:
            return
        permission, started = held
        self.breaker.record_later(call.writes, permission, outcome,
                                  duration_seconds=time.monotonic() - started)

    def after_run(self, call: Call, result: Any) -> None:
        self._finish(call, "success")

    def on_error(self, call: Call, exc: BaseException) -> None:
        error = original_error(exc)
        failed = isinstance(error, Exception) and is_retryable(error, self.classify_hooks)
        self._finish(call, "failure" if failed else "ignored")

    def on_stop(self, call: Call, stop: Stop) -> None:
        self._finish(call, "ignored")


def circuit_breaker(
    name_or_config: str | BreakerConfig,
    /,
    *,
    classify_hooks: Iterable[ClassifyHook] = (),
    on_open: str = "enqueue",
    **overrides: Any,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: gate the task on the fleet-wide breaker `name` (or a `BreakerConfig`,
    whose fields `overrides` replace; options: `BreakerConfig`).

    `on_open="refuse"` also adds an enqueue guard (`resilience.admission.breaker`): while
    the breaker is open `.delay()` raises `DependencyUnavailable(retry_after=...)` and queues
    nothing; the default "enqueue" queues the job, which the worker defers.

    Raises:
        ConfigurationError: at definition time: an unknown option, or a value
            `BreakerConfig` refuses; on_open neither "enqueue" nor "refuse".
    """
    given = isinstance(name_or_config, BreakerConfig)
    config = configured(BreakerConfig, name_or_config if given else None,
                        overrides if given else {"name": name_or_config, **overrides},
                        where="circuit_breaker")
    admission = AdmissionConfig(on_open=on_open)

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        attach(func, BreakerGuard(config, classify_hooks=classify_hooks))
        if admission.on_open == "refuse":
            # Only then: "enqueue" would add a guard that never acts to every publish.
            attach(func, BreakerAdmissionGuard(config, admission, backend=_redis_backend))
        return func

    return decorate


__all__ = ["BreakerGuard", "CountWindow", "Permission", "TimeWindow", "circuit_breaker"]
