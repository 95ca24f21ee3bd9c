"""The guard pipeline: one ordered list of hook objects around a task body.

Execution guards run `before_run` outermost first (the DESIGN.md order, by `Stage`), and
`after_run` / `on_error` innermost first. A guard ends a call early by raising `Stop` with an
outcome; the guards already entered then get `on_stop` so they can give back what they took
(an idempotency claim, a lock, a concurrency slot).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from resilience.batch import Batches
from resilience.keys import bind_arguments
from resilience.outcomes import Stop

if TYPE_CHECKING:
    from celery import Task


class Stage(IntEnum):
    """Where a guard sits in the execution path; lower runs first (outermost)."""

    DEADLINE = 10
    IDEMPOTENCY = 20
    EXCLUSIVITY = 30
    BREAKER = 40
    LIMITS = 50
    RETRY = 60


class EnqueueStage(IntEnum):
    """Where an enqueue guard sits in the publish path; lower runs first."""

    VALIDATE = 10
    UNIQUE = 20
    ADMIT = 30
    PUBLISH = 40


@dataclass
class Call:
    """One execution of a task body, as the guards see it."""

    task: Task
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    request: Any
    #: Scratch space per guard name: what before_run took and after_run must give back.
    state: dict[str, Any] = field(default_factory=dict)
    #: Callables a guard registers to be checked before the body commits (lease still held?).
    checks: list[Callable[[], None]] = field(default_factory=list)
    #: Extra keyword arguments a guard hands to the body only (a transactional session, a
    #: fencing token); never republished with the message.
    inject: dict[str, Any] = field(default_factory=dict)
    #: Redis reads queued by `Guard.prefetch`, sent in one round trip before any before_run.
    reads: Batches = field(default_factory=Batches)
    #: Redis writes nobody waits for (cache fills, outcome reports), sent in one round trip
    #: after the last hook of the call.
    writes: Batches = field(default_factory=Batches)

    @cached_property
    def arguments(self) -> dict[str, Any]:
        """The call's arguments bound to the task signature, defaults applied."""
        return bind_arguments(self.task.run, self.args, self.kwargs)

    @property
    def task_id(self) -> str | None:
        return getattr(self.request, "id", None)

    def checkpoint(self) -> None:
        """Raise if any guard's hold was lost; call right before committing an effect.

        Raises:
            LockNotOwnedError (or another guard's error): a lease or session was lost.
        """
        for check in self.checks:
            check()


@dataclass
class Publish:
    """One enqueue of a task, as the enqueue guards see it; guards may edit `options`."""

    task: Task
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    options: dict[str, Any]
    state: dict[str, Any] = field(default_factory=dict)


class Guard:
    """Base class of an execution guard; every hook is a no-op by default."""

    #: Short name used in outcomes, counters and logs.
    name: ClassVar[str] = "guard"
    #: Position in the execution path.
    stage: ClassVar[Stage] = Stage.LIMITS

    def bind(self, task: Task) -> None:
        """Called once per task when the pipeline is built; validate options against it."""

    def prefetch(self, call: Call) -> None:
        """Queue Redis reads (`call.reads`) whose replies `before_run` may use.

        Replies are hints sent before any guard decides: a guard whose read is missing or
        failed makes its own call. Errors raised here are ignored (before_run meets them).
        """

    def before_run(self, call: Call) -> None:
        """Take what the call needs (claim, lock, slot) or raise `Stop`."""

    def after_run(self, call: Call, result: Any) -> None:
        """The body returned `result`; record it and give back what before_run took."""

    def on_error(self, call: Call, exc: BaseException) -> None:
        """The body (or an inner guard) raised `exc`; give back what before_run took.

        Raising here replaces the error for the guards further out (see `Pipeline.run`).
        """

    def on_stop(self, call: Call, stop: Stop) -> None:
        """An inner guard stopped the call; give back what before_run took."""


class EnqueueGuard:
    """Base class of an enqueue guard, run in the producer before publishing."""

    name: ClassVar[str] = "enqueue-guard"
    stage: ClassVar[EnqueueStage] = EnqueueStage.ADMIT

    def bind(self, task: Task) -> None:
        """Called once per task when the pipeline is built."""

    def before_publish(self, publish: Publish) -> None:
        """Admit, edit or refuse the publish; raise `Stop` or an `AdmissionError` to refuse."""

    def after_publish(self, publish: Publish, result: Any) -> None:
        """The message was published (or handled) and `result` goes back to the caller."""


def _ordered(guards: Iterable[Any]) -> list[Any]:
    # sorted() is stable: guards of one stage keep the order they were declared in.
    return sorted(guards, key=lambda guard: int(guard.stage))


class Pipeline:
    """Runs execution guards around a body in stage order."""

    def __init__(self, guards: Iterable[Guard]) -> None:
        self.guards: Sequence[Guard] = _ordered(guards)

    def __bool__(self) -> bool:
        return bool(self.guards)

    def run(self, call: Call, body: Callable[[], Any]) -> Any:
        """Run `body` inside every guard; return its result or raise `Stop` / its error."""
        for guard in self.guards:
            try:
                guard.prefetch(call)
            except Exception:  # noqa: BLE001 - before_run raises it again, in order
                continue
        call.reads.execute()
        try:
            return self._run(call, body)
        finally:
            call.writes.execute()

    def _run(self, call: Call, body: Callable[[], Any]) -> Any:
        entered: list[Guard] = []
        try:
            for guard in self.guards:
                guard.before_run(call)
                entered.append(guard)
            result = body()
        except Stop as stop:
            signal = stop
            _unwind(entered, lambda guard: guard.on_stop(call, signal))
            raise
        except BaseException as exc:
            _unwind_errors(entered, call, exc)
            raise
        _unwind(entered, lambda guard: guard.after_run(call, result))
        return result


class EnqueuePipeline:
    """Runs enqueue guards in stage order before a publish."""

    def __init__(self, guards: Iterable[EnqueueGuard]) -> None:
        self.guards: Sequence[EnqueueGuard] = _ordered(guards)

    def run(self, publish: Publish, send: Callable[[Publish], Any]) -> Any:
        """Run the guards, then `send`; a guard's `Stop` skips the send and is re-raised."""
        for guard in self.guards:
            guard.before_publish(publish)
        result = send(publish)
        _unwind(self.guards, lambda guard: guard.after_publish(publish, result))
        return result


def _unwind_errors(guards: Sequence[Guard], call: Call, error: BaseException) -> None:
    """Give `error` to each guard's `on_error`, innermost first.

    A hook may raise to replace the error (the retry guard turns a failure into Celery's
    `Retry` or a dead-letter error); guards further out then see the replacement, as
    middleware layers do. The last replacement, if any, is raised.
    """
    current = error
    for guard in reversed(guards):
        try:
            guard.on_error(call, current)
        except BaseException as replacement:  # noqa: BLE001 - propagated outward
            current = replacement
    if current is not error:
        raise current from error


def _unwind(guards: Sequence[Any], hook: Callable[[Any], None]) -> None:
    """Call `hook` on each guard innermost first; every guard runs even if one raises."""
    first_error: BaseException | None = None
    for guard in reversed(guards):
        try:
            hook(guard)
        except BaseException as exc:  # noqa: BLE001 - re-raised after the others ran
            if first_error is None:
                first_error = exc
    if first_error is not None:
        raise first_error


GUARDS_ATTRIBUTE = "__resilience_guards__"


def attach(func: Callable[..., Any], guard: Guard | EnqueueGuard) -> Callable[..., Any]:
    """Attach `guard` to a task function; `GuardedTask` collects it when the task is built."""
    existing = list(getattr(func, GUARDS_ATTRIBUTE, ()))
    existing.append(guard)
    setattr(func, GUARDS_ATTRIBUTE, existing)
    return func


def attached(func: Any) -> list[Guard | EnqueueGuard]:
    """The guards attached to `func` by decorators, in declaration order."""
    return list(getattr(func, GUARDS_ATTRIBUTE, ()))

