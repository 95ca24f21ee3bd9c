"""The guard pipeline: the stage order, the hooks, and how a stack of guards unwinds.

A call passes admit and take (`before_run`, outermost first), the body, commit (innermost
first, while every hold is kept) and give back (`after_run` / `on_error` / `on_stop`,
innermost first). The contract and its rules are docs/pipeline.md; `jobs pipeline TASK`
prints a task's effective pipelines.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from resilience.batch import Rounds
from resilience.counters import count_outcome
from resilience.deadletter.giveup import give_up
from resilience.errors import ConfigurationError, DeadLettered
from resilience.headers import Headers
from resilience.keys import bind_arguments
from resilience.outcomes import Outcome, Stop
from resilience.stores import Stores, stores_for

if TYPE_CHECKING:
    from celery import Task


class Stage(IntEnum):
    """Where an execution guard sits; lower runs first (outermost)."""

    SCHEDULE = 0
    WORKFLOW = 2
    UNIQUE = 5
    CANCEL = 6
    POISON = 8
    DEADLINE = 10
    PAUSE = 15
    IDEMPOTENCY = 20
    WORKFLOW_RECORD = 22
    SCHEDULE_OVERLAP = 28
    EXCLUSIVITY = 30
    BREAKER = 40
    CONCURRENCY = 50
    RATE = 55
    RETRY = 60


class EnqueueStage(IntEnum):
    """Where an enqueue guard sits in the publish path; lower runs first."""

    VALIDATE = 10
    BREAKER = 15
    UNIQUE = 20
    ADMIT = 30
    STAMP = 40
    ROUTE = 50


#: Stages that hold several guards (run in declaration order); every other stage holds
#: one. Each stage's purpose: docs/pipeline.md, "The order, in one place".
SEVERAL: frozenset[Stage] = frozenset({Stage.BREAKER, Stage.CONCURRENCY, Stage.RATE})
ENQUEUE_SEVERAL: frozenset[EnqueueStage] = frozenset({EnqueueStage.VALIDATE,
                                                      EnqueueStage.BREAKER})


def _execute(rounds: Rounds) -> None:
    for queued in list(rounds.values()):
        queued.execute()
    rounds.clear()


@dataclass
class Call:
    """One execution of a task body, as the guards see it, with the services they use
    (`stores`, `headers`, `count`, `dead_letter`), so no guard looks them up itself."""

    task: Task
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    request: Any
    #: What each guard's before_run took (`keep` / `kept` / `take_back`), keyed by the guard
    #: object itself: two breakers never share a slot.
    slots: dict[object, Any] = field(default_factory=dict)
    #: Callables a guard registers to be checked before the body commits (lease still held?).
    checks: list[Callable[[], None]] = field(default_factory=list)
    #: Extra keyword arguments a guard hands to the body only (a transactional session, a
    #: fencing token); never republished with the message.
    inject: dict[str, Any] = field(default_factory=dict)
    #: Reads queued during `Guard.prefetch`, executed once before any before_run (a Redis
    #: backend opts in with `resilience.batch.for_client`).
    reads: Rounds = field(default_factory=dict)
    #: Writes nobody waits for (cache fills, outcome reports), executed after the last hook.
    writes: Rounds = field(default_factory=dict)

    @cached_property
    def arguments(self) -> dict[str, Any]:
        """The call's arguments bound to the task signature, defaults applied."""
        return bind_arguments(self.task.run, self.args, self.kwargs)

    @property
    def task_id(self) -> str | None:
        return getattr(self.request, "id", None)

    @cached_property
    def stores(self) -> Stores:
        """The task's app's stores, looked up once per call (ConfigurationError without
        `resilience.init_app`)."""
        return stores_for(self.task.app)

    @cached_property
    def headers(self) -> Headers:
        """Typed readers of the message headers (deadline, enqueued_at, outbox id, ...)."""
        return Headers(self.request)

    @property
    def queue(self) -> str | None:
        """The queue the message came from, else the task's own."""
        info = getattr(self.request, "delivery_info", None) or {}
        return info.get("routing_key") or getattr(self.task, "queue", None)

    @property
    def attempt(self) -> int:
        """This execution's attempt number, 1 for the first delivery."""
        return int(getattr(self.request, "retries", 0) or 0) + 1

    def count(self, outcome: Outcome | str, *, guard: str, name: str | None = None,
              tier: str | None = None, reason: str | None = None,
              retry_after_seconds: float | None = None) -> None:
        """Count a guard's decision fleet-wide (and as a span event); never raises. `tier`
        defaults to the task's, `name` to the task name."""
        task = self.task
        count_outcome(task.app, getattr(outcome, "value", outcome), guard=guard,
                      tier=tier or getattr(task, "tier", None),
                      name=task.name if name is None else name, reason=reason,
                      retry_after_seconds=retry_after_seconds)

    def dead_letter(self, *, guard: str, reason: str, attempts: int | None = None,
                    exception: BaseException | None = None, name: str | None = None,
                    dependency: str | None = None) -> DeadLettered:
        """Record the call in the dead-letter place, count it, return the error to raise.

        `attempts` defaults to this attempt's number; `dependency` names a dependency that
        was down (automatic replay waits for its breaker), None when the job is at fault.
        """
        return give_up(self, guard=guard, reason=reason,
                       attempts=self.attempt if attempts is None else attempts,
                       exception=exception, name=name, dependency=dependency)

    def keep(self, guard: object, value: Any) -> None:
        """Put what `guard` took for this call in its slot."""
        self.slots[guard] = value

    def kept(self, guard: object, default: Any = None) -> Any:
        """What `guard` keeps for this call, or `default`."""
        return self.slots.get(guard, default)

    def take_back(self, guard: object) -> Any:
        """Empty `guard`'s slot and return what was in it (None if nothing)."""
        return self.slots.pop(guard, None)

    @property
    def inline(self) -> bool:
        """Run in the caller's process (`apply()`, caller-runs, eager), not from a message."""
        request = self.request
        return (request is None or bool(getattr(request, "called_directly", True))
                or bool(getattr(request, "is_eager", False)))

    def checkpoint(self) -> None:
        """Raise (LockNotOwnedError, ...) if any guard's hold was lost; called right before
        an effect commits."""
        for check in self.checks:
            check()


@dataclass
class Publish:
    """One enqueue of a task, as the enqueue guards see it; guards may edit `options`."""

    task: Task
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    #: `apply_async`'s options (Celery's `producer`, `link`, `shadow`... included).
    options: dict[str, Any]
    #: The id the job is sent with; None until the caller or a guard (`@unique`) fixes it.
    task_id: str | None = None
    #: What each guard took, by a key of its own, for its `give_back` / `after_publish`.
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def republish(self) -> bool:
        """A message admitted once (Celery's retry, a guard's deferral: `retries` is set)."""
        return self.options.get("retries") is not None


class _Hooks:
    """What execution and enqueue guards share: binding to a task, and a description."""

    #: Short name used in outcomes, counters and logs.
    name: ClassVar[str] = "guard"

    def bind(self, task: Task) -> None:
        """Called once per task when the pipeline is built; validate options against it."""

    def describe(self, task: Task | None = None) -> dict[str, Any]:
        """The guard's effective options (its `config`, `options` or `policy` dataclass, or a
        callable giving one for the task), for `jobs pipeline` and docs."""
        for attribute in ("config", "options", "policy"):
            value = getattr(self, attribute, None)
            if callable(value) and not dataclasses.is_dataclass(value) and task is not None:
                try:
                    value = value(task)
                except Exception:  # noqa: BLE001 - a description never fails
                    continue
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)
                        if f.init}
        return {}


class Guard(_Hooks):
    """Base class of an execution guard; every hook is a no-op by default."""

    #: Position in the execution path (`SEVERAL`: the stages holding more than one).
    stage: ClassVar[Stage] = Stage.RATE

    def prefetch(self, call: Call) -> None:
        """Queue Redis reads (`call.reads`) as hints for `before_run`; errors are ignored."""

    def before_run(self, call: Call) -> None:
        """Admit and take: decide, take what the call needs (claim, lock, slot), or `Stop`."""

    def commit(self, call: Call, result: Any) -> None:
        """The body returned `result`: make its effect durable while every hold is kept
        (innermost first, before any give-back); raising stops or fails the call."""

    def release(self, call: Call) -> None:
        """Give back what before_run took; the three hooks below call it by default, so a
        guard that gives back the same way whatever happened writes only this."""

    def after_run(self, call: Call, result: Any) -> None:
        """Give back after a committed success: what before_run took."""
        self.release(call)

    def on_error(self, call: Call, exc: BaseException) -> None:
        """The body, a commit or an inner guard raised `exc`; give back what was taken.
        Raising here replaces the error for the guards further out."""
        self.release(call)

    def on_stop(self, call: Call, stop: Stop) -> None:
        """An inner guard (or a commit) stopped the call; give back what before_run took."""
        self.release(call)


class EnqueueGuard(_Hooks):
    """Base class of an enqueue guard, run in the producer before publishing."""

    name: ClassVar[str] = "enqueue-guard"
    stage: ClassVar[EnqueueStage] = EnqueueStage.ADMIT

    def before_publish(self, publish: Publish) -> None:
        """Admit, take, edit or refuse the publish; raise `Stop` or an `AdmissionError`."""

    def give_back(self, publish: Publish, error: BaseException) -> None:
        """A later guard refused, or the publish raised `error`: give back what was taken."""

    def after_publish(self, publish: Publish, result: Any) -> None:
        """The message was published and `result` goes back to the caller."""


def _ordered(guards: Iterable[Any], several: frozenset[Any]) -> list[Any]:
    """Guards in stage order; two in a stage that holds one is a `ConfigurationError`."""
    ordered = sorted(guards, key=lambda guard: int(guard.stage))  # stable: declaration order
    by_stage: dict[Any, list[Any]] = {}
    for guard in ordered:
        by_stage.setdefault(guard.stage, []).append(guard)
    for stage, members in by_stage.items():
        names = [guard.name for guard in members]
        if len(members) > 1 and (stage not in several or len(set(names)) < len(names)):
            raise ConfigurationError(
                f"guards {', '.join(repr(n) for n in names)} share the {stage.name} stage, "
                "which holds one guard; keep one",
                stage=stage.name, guards=names)
    return ordered


class Pipeline:
    """Runs execution guards around a body in stage order (the contract above)."""

    def __init__(self, guards: Iterable[Guard]) -> None:
        self.guards: Sequence[Guard] = _ordered(guards, SEVERAL)

    def __bool__(self) -> bool:
        return bool(self.guards)

    def run(self, call: Call, body: Callable[[], Any]) -> Any:
        """Run `body` inside every guard; return its result or raise `Stop` / its error."""
        for guard in self.guards:
            try:
                guard.prefetch(call)
            except Exception:  # noqa: BLE001 - before_run raises it again, in order
                continue
        _execute(call.reads)
        try:
            return self._run(call, body)
        finally:
            _execute(call.writes)

    def _run(self, call: Call, body: Callable[[], Any]) -> Any:
        entered: list[Guard] = []
        try:
            for guard in self.guards:
                guard.before_run(call)
                entered.append(guard)
            result = body()
            for guard in reversed(entered):
                guard.commit(call, result)
        except Stop as stop:
            signal = stop
            _unwind(entered, lambda guard: guard.on_stop(call, signal))
            raise
        except BaseException as exc:
            _unwind_replacing(entered, lambda guard, error: guard.on_error(call, error), exc)
            raise
        _unwind(entered, lambda guard: guard.after_run(call, result))
        return result


class EnqueuePipeline:
    """Runs the enqueue stages in order, then the route; gives back on refusal.

    Args:
        guards: the task's enqueue guards.
        validate: the VALIDATE stage's first step, the arguments' own check (the task's).
    """

    def __init__(self, guards: Iterable[EnqueueGuard],
                 validate: Callable[[Publish], None] | None = None) -> None:
        self.guards: Sequence[EnqueueGuard] = _ordered(guards, ENQUEUE_SEVERAL)
        self.validate = validate

    def run(self, publish: Publish, route: Callable[[Publish], Any],
            through: int = EnqueueStage.ROUTE) -> Any:
        """Pass the stages up to `through` (0: none, for a message admitted once), then
        `route` (stage ROUTE); a refusal or a failed route gives back, then re-raises."""
        entered: list[EnqueueGuard] = []
        try:
            if self.validate is not None and through >= EnqueueStage.VALIDATE:
                self.validate(publish)
            for guard in self.guards:
                if guard.stage > through:
                    break
                guard.before_publish(publish)
                entered.append(guard)
            result = route(publish)
        except BaseException as exc:
            _unwind_replacing(entered, lambda guard, error: guard.give_back(publish, error), exc)
            raise
        _unwind(entered, lambda guard: guard.after_publish(publish, result))
        return result


def _unwind_replacing(guards: Sequence[Any], hook: Callable[[Any, BaseException], None],
                      error: BaseException) -> None:
    """Give `error` to each guard's hook, innermost first; a hook may raise a replacement
    (the retry guard's `Retry`), which guards further out see and which is raised last."""
    current = error
    for guard in reversed(guards):
        try:
            hook(guard, current)
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
    setattr(func, GUARDS_ATTRIBUTE, [*getattr(func, GUARDS_ATTRIBUTE, ()), guard])
    return func


def attached(func: Any) -> list[Guard | EnqueueGuard]:
    """The guards attached to `func` by decorators, in declaration order."""
    return list(getattr(func, GUARDS_ATTRIBUTE, ()))
