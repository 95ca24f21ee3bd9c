"""The producer's side of a batch: members and batch written in one transaction.

Every member is written to the outbox through its task's own enqueue path
(`task.apply_async_in`, with the header `batch_id`) in the same transaction as the workflow
and its steps, so a worker never meets a member of a batch that does not exist and a
rolled-back batch leaves no job. A callback (`report.s("ops")`) runs as `report(batch,
"ops")`, `batch` the batch's summary as a JSON dict (`report.si(...)` gets nothing added);
its effect is exactly once with `@idempotent(key=CALLBACK_KEY)`. See docs/batches.md.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from celery import current_app
from celery.canvas import Signature

from resilience.batches.errors import InvalidBatch
from resilience.batches.summary import COMPLETE, RELEASES, SUCCESS, eager_summary, read_summary
from resilience.errors import InvalidTaskArguments
from resilience.headers import BATCH_HEADER
from resilience.keys import canonical_arguments, check_binding
from resilience.stores import MemoryStores, stores_for
from resilience.workflows.canvas import OUTCOMES, StepSpec, link, outcomes, stored_signature
from resilience.workflows.eager import EagerRun, EagerStep, eager_backend, eager_mode
from resilience.workflows.eager import start as eager_start
from resilience.workflows.guard import WorkflowGuard, workflow_backend

if TYPE_CHECKING:
    from celery import Celery, Task
    from celery.result import AsyncResult

    from resilience.batches.summary import BatchSummary

#: Message header of a callback job: "<batch id>:<success|complete>".
CALLBACK_HEADER = "batch_callback"
#: An idempotency key template for a callback whose first parameter is named `batch`:
#: `@idempotent(key=CALLBACK_KEY, transactional=True)`; one key per batch and callback kind.
CALLBACK_KEY = "batch:{batch[batch_id]}:{batch[callback]}"


@dataclass(eq=False)
class BatchResult:
    """What `Batch.apply_async` returns: the batch id and each member's `AsyncResult`."""

    app: Celery
    id: str
    results: list[AsyncResult]
    #: Run in process (memory mode, `task_always_eager`): read from there.
    eager: bool = False

    def summary(self) -> BatchSummary:
        """The batch now: pending count, tallies per state, callbacks written.

        Raises:
            BatchNotFound: the batch was rolled back (or purged).
        """
        if self.eager:
            return eager_summary(eager_backend(self.app), self.id)
        return read_summary(stores_for(self.app), self.id)

    def __repr__(self) -> str:
        return f"<BatchResult {self.id} ({len(self.results)} members)>"


class Batch:
    """Jobs enqueued together whose callbacks run once, when every member has a final state.

    Args:
        signatures: member jobs, each one task's signature (`task.s(...)`, options kept).
        on_success: a signature run once if every member succeeded (or was replayed).
        on_complete: a signature run once when every member is final, whatever the states.
        description: shown by `jobs batches list/show` and passed to the callbacks.
        app: the Celery app (default: the members' app, else the current app).

    Raises:
        InvalidBatch: a member or callback that is not one registered task's signature.
    """

    def __init__(self, signatures: Iterable[Signature] = (), *,
                 on_success: Signature | None = None, on_complete: Signature | None = None,
                 description: str | None = None, app: Celery | None = None) -> None:
        self.members: list[Signature] = []
        self.on_success = on_success
        self.on_complete = on_complete
        self.description = description
        self._app = app
        self.result: BatchResult | None = None
        self.add(*signatures)

    @property
    def app(self) -> Celery:
        if self._app is None:
            self._app = (self.members[0].type.app if self.members
                         else current_app._get_current_object())
        return self._app

    def add(self, *signatures: Signature) -> Batch:
        """Add member jobs (each `task.s(...)`); returns the batch, for chaining.

        Raises:
            InvalidBatch: a group, chain or chord, or anything else but one task's signature.
        """
        for signature in signatures:
            if not _is_task_signature(signature):
                raise InvalidBatch(
                    f"a batch member must be one task's signature (task.s(...)), not "
                    f"{_kind(signature)}; add a group's tasks one by one", member=repr(signature))
            self.members.append(signature)
        return self

    def __len__(self) -> int:
        return len(self.members)

    # -- enqueue ---------------------------------------------------------------------------
    def apply_async(self) -> BatchResult:
        """`apply_async_in` a transaction of its own (in memory mode and under
        `task_always_eager`: the batch runs in process before this returns)."""
        if eager_mode(self.app):
            return self._run_eagerly(None)
        stores = self._stores()
        with stores.engine().begin() as connection:
            return self.apply_async_in(connection)

    def apply_async_in(self, session: Any) -> BatchResult:
        """Write the batch, its members and their outbox rows in the caller's transaction.

        Args:
            session: a SQLAlchemy Session or Connection on the app's DATABASE_URL.

        Raises:
            InvalidBatch, ArgumentsDoNotBind, NonJsonArguments, PayloadTooLarge: a member or
                callback cannot be sent; raised before anything is written.
            StorageError: an insert failed (the caller's transaction is aborted).

        Memory mode and `task_always_eager`: the batch runs in process when `session`
        commits, and never on rollback.
        """
        if eager_mode(self.app):
            return self._run_eagerly(session)
        self._stores()
        tasks, batch_id, callbacks = self._checked()
        results: list[AsyncResult] = []
        for task, signature in zip(tasks, self.members, strict=True):
            options = dict(signature.options)
            headers = dict(options.pop("headers", None) or {})
            headers[BATCH_HEADER] = batch_id
            results.append(task.apply_async_in(session, tuple(signature.args),
                                               dict(signature.kwargs), headers=headers,
                                               **options))
        steps = self._steps(batch_id, tasks, [{} for _ in tasks],
                            [result.id for result in results], callbacks)
        workflow_backend(self.app).create(
            session, workflow_id=batch_id, name=self.description, steps=steps, hold=False,
            canvas={"batch": {"description": self.description}, "result": None})
        self.result = BatchResult(self.app, batch_id, results)
        return self.result

    def _checked(self) -> tuple[list[Task], str, list[tuple[str, dict[str, Any]]]]:
        """The members' tasks, a new batch id and the callbacks as stored, all checked."""
        batch_id = uuid.uuid4().hex
        return [self._member_task(signature) for signature in self.members], batch_id, [
            (kind, self._callback(batch_id, kind, signature)) for kind, signature in
            ((SUCCESS, self.on_success), (COMPLETE, self.on_complete)) if signature is not None]

    def _steps(self, batch_id: str, tasks: list[Task], options: list[dict[str, Any]],
               task_ids: list[str], callbacks: list[tuple[str, dict[str, Any]]]
               ) -> list[StepSpec]:
        """The workflow's steps: a member step per job, and each callback depending on all
        of them (released when all "succeeded" or all are "final")."""
        members = list(range(len(tasks)))
        steps = [StepSpec(position=position, task_name=task.name, args=list(signature.args),
                          kwargs=dict(signature.kwargs), options=given, immutable=False,
                          source=None, task_id=task_id, member=True)
                 for position, task, signature, given, task_id in zip(
                     members, tasks, self.members, options, task_ids, strict=True)]
        for kind, stored in callbacks:
            steps.append(StepSpec(
                position=len(steps), task_name=stored["task"], args=stored["args"],
                kwargs=stored["kwargs"], options=stored["options"],
                immutable=stored["immutable"], kind="callback", release=RELEASES[kind],
                source={OUTCOMES: members, "with": _with(batch_id, kind, self.description)}))
        link(steps, None)
        return steps

    def _run_eagerly(self, session: Any) -> BatchResult:
        """Memory mode or `task_always_eager`: the members run in process, each through its
        task's `apply()`, then the callbacks once, when `session` commits (None: now)."""
        tasks, batch_id, callbacks = self._checked()
        for task, signature in zip(tasks, self.members, strict=True):
            task.validate_arguments(tuple(signature.args), dict(signature.kwargs))
        task_ids = [str(uuid.uuid4()) for _ in tasks]
        options = [stored_signature(signature, "a batch member")["options"]
                   for signature in self.members]
        steps = self._steps(batch_id, tasks, options, task_ids, callbacks)
        results: list[Any] = [task.AsyncResult(task_id)
                              for task, task_id in zip(tasks, task_ids, strict=True)]
        run = EagerRun(self.app, workflow_id=batch_id, name=self.description, steps=steps,
                       template=None,
                       canvas={"batch": {"description": self.description}, "result": None})

        def kept(step: EagerStep, done: Any) -> None:
            if step.spec.member and done is not None:
                results[step.spec.position] = done  # the member's EagerResult

        run.on_step = kept
        self.result = BatchResult(self.app, batch_id, results, eager=True)
        eager_start(run, session)
        return self.result

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if kind is None:
            self.apply_async()

    # -- validation ------------------------------------------------------------------------
    def _stores(self) -> Any:
        stores = stores_for(self.app)
        if isinstance(stores, MemoryStores) or not stores.has_database:
            raise InvalidBatch("batches keep their state in PostgreSQL (they are workflows): "
                               "configure resilience_database_url (memory stores cannot run "
                               "them)")
        return stores

    def _task(self, name: str, role: str) -> Task:
        task = self.app.tasks.get(name)
        if task is None:
            raise InvalidBatch(f"{role} names {name!r}, which is not a registered task "
                               "(import its module first)", task=name)
        return task

    def _member_task(self, signature: Signature) -> Task:
        task = self._task(signature.task, "a batch member")
        pipeline = task.pipelines()[0] if hasattr(task, "pipelines") else None
        if pipeline is None or not hasattr(task, "apply_async_in") or not any(
                isinstance(guard, WorkflowGuard) for guard in pipeline.guards):
            raise InvalidBatch(
                f"{task.name} cannot report its outcome to a batch: it is not a GuardedTask "
                "with the workflow guards (call resilience.init_app(app))", task=task.name)
        return task

    def _callback(self, batch_id: str, kind: str, signature: Signature) -> dict[str, Any]:
        role = f"on_{kind}"
        if not _is_task_signature(signature):
            raise InvalidBatch(f"{role} must be one task's signature, not {_kind(signature)}")
        task = self._task(signature.task, role)
        stored = stored_signature(signature, role)
        stored["task"] = task.name
        try:
            canonical_arguments(stored)
        except InvalidTaskArguments as exc:
            raise InvalidBatch(f"{role} cannot be stored: {exc}", task=task.name) from None
        # The callback is called with the batch's summary first (unless immutable).
        first = [] if signature.immutable else [
            outcomes({OUTCOMES: [], "with": _with(batch_id, kind, self.description)}, {})]
        arguments = (*first, *signature.args)
        validate = getattr(task, "validate_arguments", None)
        if validate is not None:
            validate(arguments, dict(signature.kwargs))
        else:
            check_binding(task.run, arguments, dict(signature.kwargs))
        stored["options"]["headers"] = {**(stored["options"].pop("headers", None) or {}),
                                        CALLBACK_HEADER: f"{batch_id}:{kind}"}
        return stored


def _with(batch_id: str, kind: str, description: str | None) -> dict[str, Any]:
    """The fixed fields of a callback's first argument."""
    return {"batch_id": batch_id, "callback": kind, "description": description}


#: `batch(...)` is a new `Batch`: `.add()` members, then `.apply_async()`.
batch = Batch


def _is_task_signature(value: Any) -> bool:
    return isinstance(value, Signature) and not value.subtask_type and bool(value.task)


def _kind(value: Any) -> str:
    subtask_type = getattr(value, "subtask_type", None)
    return f"a {subtask_type}" if subtask_type else type(value).__name__
