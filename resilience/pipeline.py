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
   entered gets `give_back`, innermost first; after a publish, `after_publish`. The route
   (stage ROUTE: the broker or the outbox) ends the path; a republish goes straight to it.
6. Inline execution (`task.apply()`, `caller_runs`, eager mode) never republishes: a deferral
   there becomes `JobDeferred` for the caller (see `resilience.task`).

docs/pipeline.md has the same contract with examples; `jobs pipeline TASK` prints a task's
effective pipelines.
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
    """Where an execution guard sits; lower runs first (outermost). See `STAGES`."""

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
    """Where an enqueue guard sits in the publish path; lower runs first. See `ENQUEUE_STAGES`."""

    VALIDATE = 10
    BREAKER = 15
    UNIQUE = 20
    ADMIT = 30
    STAMP = 40
    ROUTE = 50


@dataclass(frozen=True)
class StageRule:
    """One row of the order table: what a stage is for and whether it holds several guards."""

    purpose: str
    several: bool = False


#: The execution order, in one place (DESIGN.md "The path of one job").
STAGES: dict[Stage, StageRule] = {
    Stage.SCHEDULE: StageRule("record a scheduled run's outcome, whatever stopped it"),
    Stage.WORKFLOW: StageRule("replay a finished workflow step; record its outcome and "
                              "publish the steps it releases"),
    Stage.UNIQUE: StageRule("give the @unique key back when the job starts (or ends)"),
    Stage.CANCEL: StageRule("stop a job an operator cancelled (jobs cancel)"),
    Stage.POISON: StageRule("dead-letter a message whose worker died too often"),
    Stage.DEADLINE: StageRule("shed a job whose deadline passed before it started"),
    Stage.PAUSE: StageRule("defer the jobs of a paused tier or task"),
    Stage.IDEMPOTENCY: StageRule("claim the key in PostgreSQL; replay finished keys"),
    Stage.WORKFLOW_RECORD: StageRule("a transactional workflow step's state and the steps "
                                     "it releases, in the body's transaction"),
    Stage.SCHEDULE_OVERLAP: StageRule("one run of a schedule entry at a time (overlap skip "
                                      "or queue_one: a singleton on schedule:<name>)"),
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
    EnqueueStage.ROUTE: StageRule("send: the broker, or the outbox (the caller's transaction, "
                                  "a long delay, a republish the broker refused)"),
}


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

    @cached_property
    def stores(self) -> Stores:
        """The task's app's stores (Redis, PostgreSQL), looked up once per call.

        Raises:
            ConfigurationError: the app was never initialised (`resilience.init_app`).
        """
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
        """Count a guard's decision fleet-wide (and as a span event); never raises.

        `tier` defaults to the task's, `name` to the task name.
        """
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
    """Runs the enqueue stages in order, then the route; gives back on refusal.

    Args:
        guards: the task's enqueue guards (`ENQUEUE_STAGES`).
        validate: the VALIDATE stage's first step, the arguments' own check (the task's).
    """

    def __init__(self, guards: Iterable[EnqueueGuard],
                 validate: Callable[[Publish], None] | None = None) -> None:
        self.guards: Sequence[EnqueueGuard] = _ordered(guards, ENQUEUE_STAGES)
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
