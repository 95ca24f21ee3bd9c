"""Inline execution (`apply()`, caller-runs) never republishes, and a full tier stays full.

A job run inline has no message: when a guard defers it, there is nothing to republish,
and the caller must hear the deferral (`JobDeferred` with `retry_after_seconds`, or a
result saying DEFERRED). Before 8851007 ("Pipeline v2") `GuardedTask.defer` published a
copy of the job with a countdown and raised Celery's `Retry` carrying it, and Celery's
eager `apply()` runs such a `Retry`'s signature again at once: the inline run defers again,
publishes again, and so on — hundreds of real messages, then a `RecursionError`. Under a
bulkhead with `caller_runs`, those copies land in the very queue that was full.

* `test_caller_runs_keeps_the_queue_within_its_depth`: a task with
  `@bulkhead(max_queue_depth=1, policy="caller_runs")` over a guard that defers (a rate of
  one a minute, or a singleton whose lock the test holds), enqueued four times while no
  worker consumes its queue: the depth never exceeds 1, every `.delay()` ends with a clear
  answer, and the rate limit lets at most one inline body run.
* `test_inline_matrix`: the matrix's stacks run inline while a worker holds the same key
  (hypothesis state machine): no worker ever runs or records a job that ran inline, and
  the other invariants of the matrix hold.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery.result import AsyncResult, EagerResult
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule
from sqlalchemy import text

from resilience.admission import depth_backend_for
from resilience.errors import JobDeferred
from resilience.locks.backends.postgres import advisory_id
from tests.resilience.compose import tasks
from tests.resilience.compose.harness import Context, detached
from tests.resilience.compose.machines import ComposeMachine, run_machine

#: `.delay()` calls per caller-runs test: one fills the queue, three run inline.
CALLS = 4


@pytest.fixture()
def inline_queue(app: Any) -> Iterator[str]:
    """The compose-inline queue, empty before and after (nothing consumes it)."""
    backend = depth_backend_for(app)
    client = backend.client()

    def empty() -> None:
        client.delete(*backend.lists(tasks.INLINE_QUEUE),
                      backend.reservations_key(tasks.INLINE_QUEUE))

    empty()
    yield tasks.INLINE_QUEUE
    empty()


@pytest.fixture()
def held_singleton(compose: Context) -> Iterator[Any]:
    """Holds the advisory lock of `inline_singleton` for one run id, as another holder."""
    connections = []

    def hold(run: str) -> None:
        connection = compose.engine.connect()
        connections.append(connection)
        key = f"{tasks.inline_singleton.name}:{run}"
        connection.execute(text("SELECT pg_advisory_lock(:id)"), {"id": advisory_id(key)})

    yield hold
    for connection in connections:
        connection.close()  # ends the session: the lock goes with it


def answer(call: Any) -> tuple[str, Any]:
    """What one `.delay()` gave the producer: published, ran inline, deferred, or else."""
    try:
        result = call()
    except JobDeferred as deferred:
        return "deferred", detached(deferred)
    except Exception as error:  # noqa: BLE001 - any other answer is the finding
        return "raised", detached(error)
    if isinstance(result, EagerResult):
        value = detached(result.result)
        if result.state == "FAILURE" and isinstance(value, JobDeferred):
            return "deferred", value
        if isinstance(value, dict) and value.get("outcome") == "DEFERRED":
            return "deferred", value
        if result.state == "SUCCESS" and isinstance(value, dict) and value.get("ran"):
            return "ran inline", value
        return f"inline {result.state}", value
    if isinstance(result, AsyncResult):
        return "published", result.id
    return "unknown", result


def retry_after(value: Any) -> float:
    if isinstance(value, JobDeferred):
        return float(value.fields.get("retry_after_seconds") or 0)
    return float((value.get("details") or {}).get("retry_after_seconds")
                 or value.get("retry_after_seconds") or 0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("deferring", ["rate", "singleton"])
def test_caller_runs_keeps_the_queue_within_its_depth(
    app: Any, compose: Context, inline_queue: str, held_singleton: Any, deferring: str,
) -> None:
    """A full queue with caller_runs and a deferring guard: depth <= 1, a clear answer each."""
    task = tasks.inline_rate if deferring == "rate" else tasks.inline_singleton
    run = uuid.uuid4().hex[:10]
    if deferring == "singleton":
        held_singleton(run)
    backend = depth_backend_for(app)
    answers: list[tuple[str, Any]] = []
    depths: list[int] = []
    for n in range(CALLS):
        answers.append(answer(lambda n=n: task.delay(run, n)))
        depths.append(backend.depth(inline_queue))
    shown = [(kind, str(value)[:160]) for kind, value in answers]
    assert max(depths) <= 1, (
        f"{task.name}: queue {inline_queue!r} (limit 1) reached depths {depths} over "
        f"{CALLS} .delay() calls: the inline run's deferral was published; answers {shown}")
    assert answers[0][0] == "published", shown
    inline = answers[1:]
    allowed = {"deferred", "ran inline"} if deferring == "rate" else {"deferred"}
    assert all(kind in allowed for kind, _ in inline), (
        f"{task.name}: inline answers must be a run or a deferral, got {shown}")
    assert all(retry_after(value) > 0 for kind, value in inline if kind == "deferred"), (
        f"{task.name}: a deferral must say when to retry: {shown}")
    ran = sum(1 for kind, _ in inline if kind == "ran inline")
    assert ran <= 1, f"rate 1/minute, but {ran} inline bodies ran: {shown}"
    assert any(kind == "deferred" for kind, _ in inline), shown


class InlineMachine(ComposeMachine):
    """Adds inline runs of a key (`apply()`, what caller-runs does), also while a worker
    holds the same key: they must run, replay, skip or defer — and never publish. Every
    example starts with one run inline while a worker holds its key."""

    def first_step(self, data: Any) -> None:
        self.inline_while_held(data)

    @rule(data=st.data())
    def inline_while_held(self, data: Any) -> None:
        """A slow job of a new key runs on a worker; the producer runs the key inline."""
        stack = data.draw(st.sampled_from(self.stacks), label="inline stack")
        key = self.run.new_key(stack, pause=0.8)
        if self.idle:
            return
        self.run.enqueue(stack, key, copies=1)
        running = self.run.wait_in_body(stack, key) is not None
        job = self.run.inline(stack, key)
        self.step(f"inline while {'held' if running else 'queued'}: {stack.name} {key} -> "
                  f"{summary(job)}")

    @precondition(lambda self: bool(self.run.arguments))
    @rule(data=st.data())
    def inline_again(self, data: Any) -> None:
        """A key already enqueued, run inline (probably done: a replay, a skip or a rerun)."""
        stack, key = data.draw(st.sampled_from(self.run.keys()), label="inline key")
        if self.idle:
            return
        job = self.run.inline(stack, key)
        self.step(f"inline again: {stack.name} {key} -> {summary(job)}")


def summary(job: Any) -> str:
    if job.raised is not None:
        return f"raised {type(job.raised).__name__}"
    if isinstance(job.result, dict) and "outcome" in job.result:
        return f"{job.state} {job.result['outcome']}"
    return f"{job.state} {type(job.result).__name__}"


@pytest.mark.chaos
@pytest.mark.timeout(180)
def test_inline_matrix(compose: Context) -> None:
    """Every stack run inline beside its workers: no publish, the matrix invariants hold."""
    run_machine(InlineMachine, compose, tasks.STACKS, examples=6, steps=5)
