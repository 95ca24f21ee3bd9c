"""`GuardedTask`: the Celery task base class that applies the guard pipelines.

Enqueue path (`apply_async`, `apply_async_in`, in the producer): the enqueue pipeline, from
argument validation (bind to the signature, JSON only, size limit) through the enqueue guards
to the route `GuardedTask.enqueue` decides: the broker, or the outbox (resilience.outbox).
Execution path (`__call__`, in the worker): the execution guards around `run`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from functools import partial
from typing import Any, ClassVar

from celery import Task, states
from celery._state import _task_stack
from celery.app.task import Context, get_actual_ignore_result
from celery.exceptions import Retry, SoftTimeLimitExceeded, TimeLimitExceeded
from celery.utils.saferepr import saferepr

from resilience.admission import depth_backend_for, queue_of
from resilience.arguments import celery_arguments, validate_arguments, validate_publish
from resilience.errors import AdmissionError, JobDeferred, JobStopped
from resilience.keys import signature_of
from resilience.outbox.enqueue import delay_seconds_of, write
from resilience.outcomes import (
    OUTCOME_REQUEST_ATTRIBUTE,
    Outcome,
    OutcomeStored,
    Stop,
    event_type_of,
    flush_decisions,
)
from resilience.pipeline import (
    Call,
    EnqueueGuard,
    EnqueuePipeline,
    EnqueueStage,
    Guard,
    Pipeline,
    Publish,
    attached,
)
from resilience.schedules.guard import ScheduleRunGuard
from resilience.schedules.singleton import ScheduleSingletonGuard
from resilience.workflows.guard import workflow_guards

logger = logging.getLogger("resilience.task")

#: Execution guards every GuardedTask has after its own (a guard of the same name replaces
#: one): workflow steps and scheduled runs, with no extra code; a job without their headers
#: pays one header lookup each.
LIBRARY_GUARDS: tuple[Guard, ...] = (*workflow_guards(), ScheduleRunGuard(),
                                     ScheduleSingletonGuard())

#: A request with any of these is part of a chain, group or chord, or has links to call.
_CANVAS_FIELDS = ("chain", "callbacks", "chord", "group")

#: A republish the broker refused (full tier queue on RabbitMQ) is published again by the
#: outbox relay no sooner than this.
REFUSED_REPUBLISH_DELAY_SECONDS = 5.0


@contextmanager
def pooled_producer(app: Any) -> Iterator[Any]:
    """A producer from `app`'s pool, as `send_task` acquires one, except that a refusal by
    the transport (`AdmissionError`) keeps the connection: kombu replaces it on any error,
    so a flood of duplicates or a full tier would reconnect on every publish."""
    producer = app.producer_pool.acquire(block=True,
                                         timeout=app.conf.broker_pool_acquire_timeout)
    try:
        yield producer
    except AdmissionError:
        raise
    except BaseException:
        connection = producer.__connection__
        if connection is not None and hasattr(connection, "_pool"):
            connection._pool.replace(connection)  # what kombu does with a broken one
        raise
    finally:
        producer.release()


class GuardedTask(Task):
    """A Celery task whose calls pass through the resilience guards.

    Guards come from decorators on the task function (`@idempotent`, `@singleton`, ...)
    and from the `guards` / `enqueue_guards` class attributes.
    """

    #: Execution guards added to those attached by decorators.
    guards: ClassVar[tuple[Guard, ...]] = ()
    #: Enqueue guards added to those attached by decorators.
    enqueue_guards: ClassVar[tuple[EnqueueGuard, ...]] = ()
    #: Largest serialized argument payload in bytes; None takes
    #: `app.conf.resilience_max_payload_bytes` (default 256 KiB).
    max_payload_bytes: int | None = None
    #: The worker's request class: it sends a stopped job's own event (`task-replayed`,
    #: `task-shed`, ...) so Flower shows the outcome, not SUCCESS.
    Request = "resilience.results:OutcomeRequest"

    _pipelines: tuple[Pipeline, EnqueuePipeline] | None = None

    # -- pipelines ---------------------------------------------------------------------
    def pipelines(self) -> tuple[Pipeline, EnqueuePipeline]:
        """The task's execution and enqueue pipelines, built once per task."""
        if self._pipelines is None:
            declared = attached(self.run)
            names = {guard.name for guard in declared}
            # A class-level default (the platform's) steps aside for the task's own guard
            # of the same name, so e.g. `@poison_guard(max_deliveries=5)` replaces it.
            own = [g for g in (*self.guards, *self.enqueue_guards) if g.name not in names]
            # The library's defaults step aside for any guard of the same name.
            names.update(guard.name for guard in own)
            defaults = [*own, *(g for g in LIBRARY_GUARDS if g.name not in names)]
            found = [*declared, *defaults]
            execution = [g for g in found if isinstance(g, Guard)]
            enqueue = [g for g in found if isinstance(g, EnqueueGuard)]
            for guard in (*execution, *enqueue):
                guard.bind(self)
            self._pipelines = (Pipeline(execution),
                               EnqueuePipeline(enqueue, validate=validate_publish))
        return self._pipelines

    # -- enqueue path ------------------------------------------------------------------
    def apply_async(self, args: Any = None, kwargs: Any = None, task_id: str | None = None,
                    producer: Any = None, link: Any = None, link_error: Any = None,
                    shadow: Any = None, **options: Any) -> Any:
        """Celery's `apply_async` through the enqueue pipeline (`enqueue`).

        Raises:
            InvalidTaskArguments (ArgumentsDoNotBind, NonJsonArguments, PayloadTooLarge): the
                arguments cannot be sent. AdmissionError: an enqueue guard refused the job.
        """
        options.update(producer=producer, link=link, link_error=link_error, shadow=shadow)
        return self.enqueue(self.new_publish(args, kwargs, task_id, options))

    def apply_async_in(self, session: Any, args: Any = None, kwargs: Any = None,
                       **options: Any) -> Any:
        """`apply_async` inside the caller's transaction (a SQLAlchemy Session or Connection):
        an outbox row the relay publishes once `session` commits (docs/outbox.md). Returns
        an `AsyncResult` with the job's id at once; options are `apply_async`'s (JSON only)
        plus `ordering_key`.

        Raises:
            InvalidTaskArguments, InvalidKey: as `apply_async`; nothing is written.
            StorageError: the insert failed (the caller's transaction is aborted).
        """
        publish = self.new_publish(args, kwargs, options.pop("task_id", None), options)
        return self.enqueue(publish, outbox=True, session=session)

    def enqueue_in(self, session: Any, *args: Any, **kwargs: Any) -> Any:
        """`delay` inside the caller's transaction (see `apply_async_in`)."""
        return self.apply_async_in(session, args, kwargs)

    def new_publish(self, args: Any, kwargs: Any, task_id: str | None,
                    options: dict[str, Any]) -> Publish:
        """The `Publish` of one enqueue, arguments as Celery takes and converts them
        (`pydantic=True`), so validation sees what is sent."""
        args, kwargs = celery_arguments(args, kwargs)
        if self._dump_pydantic_arguments is not None and dict(
                self._get_exec_options(), **options).get("serializer") != "pickle":
            # Task.apply_async's own pass then finds no model and returns at once.
            args, kwargs = self._dump_pydantic_arguments(args, kwargs)
        return Publish(task=self, args=args, kwargs=kwargs, options=options, task_id=task_id)

    def enqueue(self, publish: Publish, *, outbox: bool = False, session: Any = None) -> Any:
        """Run the enqueue pipeline to the route of `publish`, decided here and only here
        (docs/pipeline.md rule 4): the outbox after VALIDATE (a transactional enqueue, a
        delay beyond `resilience_max_countdown_seconds`: a Redis broker would redeliver it
        at each visibility timeout), else the broker after every stage; a republish and
        eager mode pass no stage, and a republish the broker refuses goes to the outbox. A
        guard that answers instead of publishing gives the caller its answer."""
        eager = self.app.conf.task_always_eager
        outbox = outbox or (not eager and self._beyond_max_countdown(publish.options))
        if outbox:
            route, through = partial(self._to_outbox, session), EnqueueStage.VALIDATE
        else:
            route, through = self._to_broker, EnqueueStage.ROUTE
        if publish.republish or (eager and not outbox):
            through = 0
        try:
            return self.pipelines()[1].run(publish, route, through)
        except Stop as stop:
            if stop.result is not None:
                return stop.result
            raise
        except Exception as exc:
            if (not publish.republish or outbox or eager
                    or self._broker_refused(exc, publish) is None):
                raise
            options = {k: v for k, v in publish.options.items() if k not in ("countdown", "eta")}
            options["countdown"] = max(REFUSED_REPUBLISH_DELAY_SECONDS,
                                       delay_seconds_of(publish.options) or 0.0)
            logger.warning("%s[%s]: queue full, republish goes through the outbox in %.0fs",
                           self.name, publish.task_id, options["countdown"])
            return self._to_outbox(None, replace(publish, options=options))
        finally:
            if through:
                flush_decisions()  # a refusal's trace event, before the caller's span ends

    def _to_broker(self, publish: Publish) -> Any:
        """Publish as Celery does, on a producer from the app's pool (`pooled_producer`)."""
        producer = publish.options.pop("producer", None)
        given = producer is not None or self.app.conf.task_always_eager
        with nullcontext(producer) if given else pooled_producer(self.app) as chosen:
            return Task.apply_async(self, publish.args, publish.kwargs,
                                    task_id=publish.task_id, producer=chosen, **publish.options)

    def _to_outbox(self, session: Any, publish: Publish) -> Any:
        """Write the job to the outbox, in `session`'s transaction or (None) its own."""
        return write(self, session, publish.args, publish.kwargs, publish.options,
                     task_id=publish.task_id)

    def _broker_refused(self, error: BaseException, publish: Publish) -> Exception | None:
        """`error` as `QueueFull` when the broker refused the publish for a full queue."""
        try:
            backend = depth_backend_for(self.app)
        except Exception:  # noqa: BLE001 - no broker backend: not a refusal we know
            return None
        return backend.refusal(error, queue_of(publish), 0)

    def _beyond_max_countdown(self, options: dict[str, Any]) -> bool:
        """A countdown or ETA longer than `app.conf.resilience_max_countdown_seconds`?"""
        if options.get("countdown") is None and options.get("eta") is None:
            return False  # the common case: no settings lookups on the enqueue path
        limit = self.app.conf.get("resilience_max_countdown_seconds")
        delay = delay_seconds_of(options)
        return bool(limit) and delay is not None and delay > float(limit)

    def validate_arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any], *,
                           serializer: str | None = None) -> None:
        """Refuse arguments that would fail in the worker or could not be sent
        (`resilience.arguments.validate_arguments`)."""
        validate_arguments(self, args, kwargs, serializer=serializer)

    # -- execution path ----------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the task inside its guards, as Celery's `Task.__call__` runs it: the first
        call under a message's request runs in it (Celery's stack protection); any other
        call pushes a request of its own (`called_directly`), so its guards see an inline
        call, never the enclosing message's request."""
        stack = self.request_stack
        top = stack.top
        if (top is not None and not top._protected and len(stack) == 1
                and not top.called_directly):
            top._protected = 1
            return self._guarded(args, kwargs, top)
        _task_stack.push(self)
        self.push_request(args=args, kwargs=kwargs, called_directly=True)
        try:
            return self._guarded(args, kwargs, self.request)
        finally:
            self.pop_request()
            _task_stack.pop()

    def _guarded(self, args: tuple[Any, ...], kwargs: dict[str, Any], request: Any) -> Any:
        pipeline, _ = self.pipelines()
        call = Call(task=self, args=args, kwargs=kwargs, request=request)
        if not call.inline:
            self.check_arguments(call)
        if not pipeline:
            return self.run(*args, **kwargs)
        try:
            return pipeline.run(call, lambda: self.run(*call.args, **call.kwargs, **call.inject))
        except Stop as stop:
            return self.stopped(call, stop)

    def check_arguments(self, call: Call) -> None:
        """Dead-letter (not retry) a message whose arguments cannot fit the task's signature:
        one from elsewhere (`send_task`, an old deploy) would fail on every delivery and
        leave nothing to inspect. Follows Celery's `typing`, as `validate_arguments` does.

        Raises:
            DeadLettered: a typed task's arguments do not bind.
        """
        if not self.typing:
            return
        # Partial: a parameter a guard fills in (a transactional session, a fencing token)
        # is legitimately absent from the message.
        try:
            signature_of(self.run).bind_partial(*call.args, **call.kwargs)
        except TypeError as exc:
            reason = f"arguments do not fit {self.name}{signature_of(self.run)}: {exc}"
            raise call.dead_letter(guard="intake", reason=reason, attempts=1,
                                   exception=exc) from None

    def stopped(self, call: Call, stop: Stop) -> Any:
        """Turn a guard's `Stop` into what Celery records (docs/pipeline.md rule 6): in a
        canvas REPLAYED and a fallback pass their result on and any other stop ends the
        chain or fails the chord; from a message the value is stored here and the worker
        sends the outcome's own event instead of task-succeeded.

        Raises:
            OutcomeStored: from a message, once the value and the decision are stored.
            celery.exceptions.Retry: DEFERRED from a message (republished later).
            JobDeferred: DEFERRED inline (`apply()`, caller-runs, eager): nothing is published.
            JobStopped: a chord member was stopped (not REPLAYED).
        """
        # The message carries the fields: Celery's default log format prints no `extra`.
        logger.info(
            "guard decision: task=%s id=%s guard=%s outcome=%s reason=%s",
            self.name, call.task_id, stop.guard, stop.outcome.value, stop.reason,
            extra={"task_id": call.task_id, "task_name": self.name,
                   "tier": getattr(self, "tier", None), "guard": stop.guard,
                   "outcome": stop.outcome.value, "reason": stop.reason})
        if stop.outcome is Outcome.DEFERRED:
            self.defer(call, stop)
        replayed = stop.outcome is Outcome.REPLAYED
        # What `.get()` answers: a replay the first call's value, any other stop its outcome.
        value = stop.result if replayed else stop.as_result()
        request = call.request
        if request is None or call.inline:
            return value
        # The result backend stores the decision beside the value (`outcome_of`).
        setattr(request, OUTCOME_REQUEST_ATTRIBUTE, stop.as_meta())
        if replayed or stop.result is not None:
            # A stop with a result (REPLAYED's stored one, a breaker's fallback) stands in
            # for the body's: in a canvas it is passed on as the body's would have been.
            if any(getattr(request, name, None) for name in _CANVAS_FIELDS):
                return stop.result
        elif getattr(request, "chord", None):
            raise JobStopped(
                f"{stop.outcome.value} by {stop.guard}: {stop.reason}; a chord member that "
                "did not run fails the chord instead of passing its outcome on",
                outcome=stop.outcome.value, guard=stop.guard, details=stop.details)
        # Stored here, then ignored by Celery: no chain or link runs after a job that did
        # not run, and the worker sends the outcome's own event instead of task-succeeded.
        self.backend.mark_as_done(request.id, value, request=request,
                                  store_result=not get_actual_ignore_result(self, request))
        # `from None`: Celery formats this signal's traceback twice (billiard's
        # ExceptionInfo); the Stop it would chain carries every guard's frames, which made a
        # replay cost ~5 ms of CPU in the worker.
        raise OutcomeStored(event_type_of(stop.outcome), {
            **stop.as_meta(), "result": saferepr(value, self.resultrepr_maxsize)}) from None

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any,
                   einfo: Any) -> None:
        """A job ended by its time limit is dead-lettered with that reason, never only FAILED:
        after a hard limit Celery acknowledges the message (`acks_on_timeout`), so nothing
        would run it again. A message Celery requeues (`acks_on_timeout=False`) is left
        alone, and so is a hard limit that fired after the body stored SUCCESS."""
        if isinstance(exc, TimeLimitExceeded):
            if self.acks_late and not self.acks_on_timeout:
                return
            if self._ended_before_limit(task_id):
                logger.warning(
                    "hard time limit of %s[%s] fired after the job had succeeded (the "
                    "worker's main process read the pool's result late): not dead-lettered",
                    self.name, task_id)
                return
            reason = f"hard time limit exceeded ({exc}): the pool killed the process"
        elif isinstance(exc, SoftTimeLimitExceeded):
            reason = f"soft time limit exceeded ({exc})"
        else:
            return
        call = Call(task=self, args=tuple(args or ()), kwargs=dict(kwargs or {}),
                    request=Context(id=task_id))
        try:
            call.dead_letter(guard="time_limit", reason=reason, attempts=1, exception=exc,
                             name=self.name)
        except Exception:  # never raised into Celery's failure handling
            logger.exception("dead letter NOT recorded for %s[%s] (%s)", self.name, task_id,
                             reason)

    def _ended_before_limit(self, task_id: str) -> bool:
        """Whether the result backend already holds SUCCESS for `task_id` (no when it cannot
        answer). A main process blocked in a broker write reads the pool's result late and
        fires the hard-limit timer first: billiard then reports TimeLimitExceeded for a job
        that stored SUCCESS long before (tests/partition/test_broker_partition.py)."""
        try:
            meta = self.backend.get_task_meta(task_id, cache=False)
        except Exception:
            logger.debug("result of %s[%s] not read", self.name, task_id, exc_info=True)
            return False
        return meta.get("status") == states.SUCCESS

    def defer(self, call: Call, stop: Stop) -> None:
        """Republish this message after `retry_after_seconds`, without spending a retry.
        Inline there is no message: the caller gets `JobDeferred` (Celery's eager path would
        run a `Retry`'s signature again at once, deferring again: a publish storm).

        Raises:
            celery.exceptions.Retry: from a message; Celery records RETRY with the reason.
            JobDeferred: inline.
        """
        countdown = max(0.05, float(stop.retry_after_seconds or 1.0))
        message = f"DEFERRED by {stop.guard}: {stop.reason}"
        # The reason travels as Retry's exception, so Celery's task-retried event (and so
        # Flower) shows which guard deferred the job and why.
        reason = JobDeferred(message, guard=stop.guard, retry_after_seconds=countdown,
                             details=stop.details)
        if call.inline:
            raise reason
        request = call.request
        signature = self.signature_from_request(
            request, call.args, call.kwargs, countdown=countdown, retries=request.retries)
        signature.apply_async()
        raise Retry(message, exc=reason, when=countdown, sig=signature)
