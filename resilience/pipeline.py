"""The guard pipeline and the contract of a stack of guards.

A call passes through five phases; every guard may act in each, and the pipeline runs them
in one fixed order (the `STAGES` table below), whatever order the decorators were written in:

    admit     `before_run`, outermost first: decide whether the call may run at all (poison,
              deadline, breaker, limits); a guard that says no raises `Stop`.
    take      also `before_run`: take what the call needs (idempotency claim, lock, slot).
    run       the body.
    commit    `commit`, innermost first, while *everything* every guard took is still held:
              the body's transaction and the idempotency record commit here, after a
              `call.checkpoint()` that proves the locks and leases are still owned.
    give back `after_run` / `on_error` / `on_stop`, innermost first: locks, slots, claims.

The rules that make guards compose:

1. No effect commits after anything that protected it was given back: commits happen in
   their own phase, before the first give-back.
2. A guard that stops a call early (`Stop`), or an error anywhere (a guard, the body, a
   commit), makes every guard already entered give back what it took, innermost first;
   one guard failing to give back never keeps the others from it.
3. `on_error` may replace the error for the guards further out (the retry guard turns a
   failure into Celery's `Retry` or `DeadLettered`), as middleware layers do.
4. Two guards never share a stage silently: a stage holds one guard unless the table says
   it holds several (then they run in declaration order); a clash is a `ConfigurationError`
   when the task's pipeline is built.
5. Enqueue guards follow the same shape: `before_publish` takes (a unique key, an admission
   reservation); when a later guard refuses or the publish raises, every guard already
   entered gets `give_back`, innermost first; after a publish, `after_publish`.
6. Inline execution (`task.apply()`, `caller_runs`, eager mode) never republishes: a deferral
   there becomes `JobDeferred` for the caller (see `resilience.task`).

docs/pipeline.md has the same contract with examples; `jobs pipeline TASK` prints a task's
effective pipelines.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from resilience.errors import ConfigurationError
from resilience.keys import bind_arguments
from resilience.outcomes import Stop

if TYPE_CHECKING:
    from celery import Task


class Stage(IntEnum):
    """Where an execution guard sits; lower runs first (outermost). See `STAGES`."""

    BATCH = 1
    UNIQUE = 5
    CANCEL = 6
    POISON = 8
    DEADLINE = 10
    PAUSE = 15
    IDEMPOTENCY = 20
    BATCH_RECORD = 25
    EXCLUSIVITY = 30
    BREAKER = 40
    CONCURRENCY = 50
    RATE = 55
    RETRY = 60


class EnqueueStage(IntEnum):
    """Where an enqueue guard sits in the publish path; lower runs first. See `ENQUEUE_STAGES`."""

    VALIDATE = 10
    BREAKER = 15
    UNIQUE = 20
    ADMIT = 30
    STAMP = 40


@dataclass(frozen=True)
class StageRule:
    """One row of the order table: what a stage is for and whether it holds several guards."""

    purpose: str
    several: bool = False


#: The execution order, in one place (DESIGN.md "The path of one job").
STAGES: dict[Stage, StageRule] = {
    Stage.BATCH: StageRule("record a batch member's final state, whatever stopped it"),
    Stage.UNIQUE: StageRule("give the @unique key back when the job starts (or ends)"),
    Stage.CANCEL: StageRule("stop a job an operator cancelled (jobs cancel)"),
    Stage.POISON: StageRule("dead-letter a message whose worker died too often"),
    Stage.DEADLINE: StageRule("shed a job whose deadline passed before it started"),
    Stage.PAUSE: StageRule("defer the jobs of a paused tier or task"),
    Stage.IDEMPOTENCY: StageRule("claim the key in PostgreSQL; replay finished keys"),
    Stage.BATCH_RECORD: StageRule("a transactional member's state, in the body's transaction"),
    Stage.EXCLUSIVITY: StageRule("@singleton or @exclusive: one holder per key"),
    Stage.BREAKER: StageRule("per-dependency breaker; several dependencies allowed",
                             several=True),
    Stage.CONCURRENCY: StageRule("fleet-wide concurrency slots", several=True),
    Stage.RATE: StageRule("fleet-wide rate limits", several=True),
    Stage.RETRY: StageRule("classify errors; Celery retry within the budget"),
}

#: The enqueue order, in one place.
ENQUEUE_STAGES: dict[EnqueueStage, StageRule] = {
    EnqueueStage.VALIDATE: StageRule("keys of the execution guards build from the arguments",
                                     several=True),
    EnqueueStage.BREAKER: StageRule("refuse while a declared breaker is open", several=True),
    EnqueueStage.UNIQUE: StageRule("@unique: the same key within its TTL is the same job"),
    EnqueueStage.ADMIT: StageRule("tier bulkhead: abort, discard, caller_runs or wait"),
    EnqueueStage.STAMP: StageRule("headers every new message carries (deadline)"),
}


class Round(Protocol):
    """Work a backend queued for a call, sent at once by `execute()` (which never raises)."""

    def execute(self) -> None: ...


#: A call's rounds, keyed by the backend that owns each (one per Redis client, say).
Rounds = dict[Hashable, Round]


def _execute(rounds: Rounds) -> None:
    for queued in list(rounds.values()):
        queued.execute()
    rounds.clear()


@dataclass
class Call:
    """One execution of a task body, as the guards see it."""

    task: Task
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    request: Any
    #: One slot per guard object: what its before_run took and its give-back returns
    #: (`keep` / `kept` / `take_back`). Keyed by the guard itself, so two guards of one
    #: kind (two breakers, two limits) never share a slot and no key is ever spelled.
    slots: dict[object, Any] = field(default_factory=dict)
    #: Callables a guard registers to be checked before the body commits (lease still held?).
    checks: list[Callable[[], None]] = field(default_factory=list)
    #: Extra keyword arguments a guard hands to the body only (a transactional session, a
    #: fencing token); never republished with the message.
    inject: dict[str, Any] = field(default_factory=dict)
    #: Reads a backend queued during `Guard.prefetch` instead of sending them, executed
    #: once after every prefetch and before any before_run. A backend opts in by keeping a
    #: round here (the Redis backends: `resilience.batch.for_client`); the pipeline knows
    #: no store.
    reads: Rounds = field(default_factory=dict)
    #: Writes nobody waits for (cache fills, outcome reports), executed once after the
    #: call's last hook.
    writes: Rounds = field(default_factory=dict)

    @cached_property
    def arguments(self) -> dict[str, Any]:
        """The call's arguments bound to the task signature, defaults applied."""
        return bind_arguments(self.task.run, self.args, self.kwargs)

    @property
    def task_id(self) -> str | None:
        return getattr(self.request, "id", None)

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
        """Raise if any guard's hold was lost; called right before an effect commits.

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


def _described(guard: Any, task: Task | None) -> dict[str, Any]:
    """The options of a guard's config dataclass (`config`, `options` or `policy`)."""
    for attribute in ("config", "options", "policy"):
        value = getattr(guard, attribute, None)
        if callable(value) and not dataclasses.is_dataclass(value) and task is not None:
            try:
                value = value(task)
            except Exception:  # noqa: BLE001 - a description never fails
                continue
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}
    return {}


class Guard:
    """Base class of an execution guard; every hook is a no-op by default."""

    #: Short name used in outcomes, counters and logs.
    name: ClassVar[str] = "guard"
    #: Position in the execution path (`STAGES`).
    stage: ClassVar[Stage] = Stage.RATE

    def bind(self, task: Task) -> None:
        """Called once per task when the pipeline is built; validate options against it."""

    def describe(self, task: Task | None = None) -> dict[str, Any]:
        """The guard's effective options, for `jobs pipeline` and docs."""
        return _described(self, task)

    def prefetch(self, call: Call) -> None:
        """Queue Redis reads (`call.reads`) whose replies `before_run` may use.

        Replies are hints sent before any guard decides: a guard whose read is missing or
        failed makes its own call. Errors raised here are ignored (before_run meets them).
        """

    def before_run(self, call: Call) -> None:
        """Admit and take: decide, take what the call needs (claim, lock, slot), or `Stop`."""

    def commit(self, call: Call, result: Any) -> None:
        """The body returned `result`: make its effect durable while every hold is kept.

        Runs innermost first, before any guard gives anything back. Raising (`Stop` or an
        error) turns the call into a stop or an error for every guard entered.
        """

    def release(self, call: Call) -> None:
        """Give back what before_run took; the three hooks below call it by default, so a
        guard that gives back the same way whatever happened writes only this."""

    def after_run(self, call: Call, result: Any) -> None:
        """Give back after a committed success: what before_run took."""
        self.release(call)

    def on_error(self, call: Call, exc: BaseException) -> None:
        """The body, a commit or an inner guard raised `exc`; give back what was taken.

        Raising here replaces the error for the guards further out (see `Pipeline.run`).
        """
        self.release(call)

    def on_stop(self, call: Call, stop: Stop) -> None:
        """An inner guard (or a commit) stopped the call; give back what before_run took."""
        self.release(call)


class EnqueueGuard:
    """Base class of an enqueue guard, run in the producer before publishing."""

    name: ClassVar[str] = "enqueue-guard"
    stage: ClassVar[EnqueueStage] = EnqueueStage.ADMIT

    def bind(self, task: Task) -> None:
        """Called once per task when the pipeline is built."""

    def describe(self, task: Task | None = None) -> dict[str, Any]:
        """The guard's effective options, for `jobs pipeline` and docs."""
        return _described(self, task)

    def before_publish(self, publish: Publish) -> None:
        """Admit, take, edit or refuse the publish; raise `Stop` or an `AdmissionError`."""

    def give_back(self, publish: Publish, error: BaseException) -> None:
        """A later guard refused, or the publish raised `error`: give back what was taken."""

    def after_publish(self, publish: Publish, result: Any) -> None:
        """The message was published and `result` goes back to the caller."""


def _ordered(guards: Iterable[Any], rules: dict[Any, StageRule]) -> list[Any]:
    """Guards in stage order; two in a stage that holds one is a `ConfigurationError`."""
    ordered = sorted(guards, key=lambda guard: int(guard.stage))  # stable: declaration order
    by_stage: dict[int, list[Any]] = {}
    for guard in ordered:
        by_stage.setdefault(int(guard.stage), []).append(guard)
    for stage, members in by_stage.items():
        names = [guard.name for guard in members]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        rule = next((rule for key, rule in rules.items() if int(key) == stage), None)
        if len(members) > 1 and (rule is None or not rule.several or duplicates):
            label = type(members[0].stage)(stage).name
            raise ConfigurationError(
                f"guards {', '.join(repr(n) for n in names)} share the {label} stage, which "
                f"holds one guard ({rule.purpose if rule else 'unknown stage'}); keep one",
                stage=label, guards=names,
            )
    return ordered


class Pipeline:
    """Runs execution guards around a body in stage order (the contract above)."""

    def __init__(self, guards: Iterable[Guard]) -> None:
        self.guards: Sequence[Guard] = _ordered(guards, STAGES)

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
            _unwind_errors(entered, call, exc)
            raise
        _unwind(entered, lambda guard: guard.after_run(call, result))
        return result


class EnqueuePipeline:
    """Runs enqueue guards in stage order before a publish, giving back on refusal."""

    def __init__(self, guards: Iterable[EnqueueGuard]) -> None:
        self.guards: Sequence[EnqueueGuard] = _ordered(guards, ENQUEUE_STAGES)

    def run(self, publish: Publish, send: Callable[[Publish], Any]) -> Any:
        """Run the guards, then `send`; a refusal or a failed send gives back, then re-raises."""
        entered: list[EnqueueGuard] = []
        try:
            for guard in self.guards:
                guard.before_publish(publish)
                entered.append(guard)
            result = send(publish)
        except BaseException as exc:
            _unwind_replacing(entered, lambda guard, error: guard.give_back(publish, error), exc)
            raise
        _unwind(entered, lambda guard: guard.after_publish(publish, result))
        return result


def _unwind_errors(guards: Sequence[Guard], call: Call, error: BaseException) -> None:
    """Give `error` to each guard's `on_error`, innermost first (see `_unwind_replacing`)."""
    _unwind_replacing(guards, lambda guard, current: guard.on_error(call, current), error)


def _unwind_replacing(guards: Sequence[Any], hook: Callable[[Any, BaseException], None],
                      error: BaseException) -> None:
    """Give `error` to each guard's hook, innermost first.

    A hook may raise to replace the error (the retry guard turns a failure into Celery's
    `Retry` or a dead-letter error; the admission guard turns a broker's `QueueFull` into its
    tier's policy); guards further out then see the replacement, as middleware layers do.
    The last replacement, if any, is raised.
    """
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
    existing = list(getattr(func, GUARDS_ATTRIBUTE, ()))
    existing.append(guard)
    setattr(func, GUARDS_ATTRIBUTE, existing)
    return func


def attached(func: Any) -> list[Guard | EnqueueGuard]:
    """The guards attached to `func` by decorators, in declaration order."""
    return list(getattr(func, GUARDS_ATTRIBUTE, ()))
