"""Durable canvas on real worker processes: results as plain Celery's, positions and
headers, replay of a duplicated step, compensation order, retry, replay, cancel."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from celery import chain, chord, group
from sqlalchemy import text

from resilience.counters import read_all
from resilience.headers import WORKFLOW_STEP_HEADER
from resilience.workflows import (
    InvalidWorkflow,
    StepState,
    WorkflowFailed,
    WorkflowNotFound,
    WorkflowState,
    cancel,
    describe,
    durable,
    recent,
    replay,
    retry,
)
from tests.resilience.workflows import tasks_workflows as t
from tests.support import wait_for

pytestmark = pytest.mark.timeout(120)


def ledger(engine: Any, run: str, kind: str | None = None) -> list[tuple[str, str]]:
    """(kind, label) rows of a run, in the order they were written."""
    with engine.connect() as connection:
        rows = connection.execute(text(
            "SELECT kind, label FROM workflow_test_ledger WHERE run = :run "
            "AND (CAST(:kind AS TEXT) IS NULL OR kind = CAST(:kind AS TEXT)) ORDER BY ordinal"),
            {"run": run, "kind": kind}).all()
    return [(row.kind, row.label) for row in rows]


def settled(stores: Any, workflow_id: str, *states: WorkflowState) -> Any:
    return wait_for(lambda: (lambda s: s if s.state in states else None)(
        describe(stores, workflow_id)), timeout_seconds=30,
        message=f"workflow {workflow_id} in {states}")


SHAPES = {
    "chain": lambda: chain(t.add.s(1, 2), t.mul.s(10), t.add.s(5)),
    "group": lambda: group(t.add.s(1, 1), t.mul.s(3, 3), t.add.s(2, 2)),
    "chord": lambda: chord([t.add.s(1, 2), t.mul.s(2, 5)], t.pack.s("end")),
    "chain-group-task": lambda: chain(t.add.s(1, 2), group(t.mul.s(2), t.mul.s(3)),
                                      t.pack.s()),
    "chain-ending-in-group": lambda: chain(t.add.s(2, 3), group(t.mul.s(2), t.add.s(1))),
    "group-of-chains": lambda: chain(group(chain(t.add.s(1, 1), t.mul.s(5)),
                                           chain(t.add.s(2, 2), t.mul.s(6))), t.pack.s()),
    "immutable": lambda: chain(t.add.s(1, 2), t.add.si(10, 20), t.pack.s("x")),
    "chord-in-chain": lambda: chain(t.add.s(1, 1), chord([t.mul.s(3), t.mul.s(4)],
                                                         t.total.s()), t.mul.s(2)),
}


class TestResults:
    """The durable run's result is what plain Celery's canvas gives, shape by shape."""

    @pytest.mark.parametrize("shape", list(SHAPES))
    def test_durable_result_equals_plain_celery(self, tier_workers: Any, stores: Any,
                                                 shape: str) -> None:
        """The same canvas run by plain Celery (result backend, chord_unlock) and durably
        (PostgreSQL) returns the same value."""
        expected = SHAPES[shape]().apply_async().get(timeout=30)
        run = durable(SHAPES[shape](), name=f"shape-{shape}").apply_async()
        assert run.get(timeout=30) == expected
        summary = describe(stores, run.id)
        assert summary.state is WorkflowState.SUCCEEDED
        assert summary.result == expected
        assert summary.counts == {"succeeded": len(summary.steps)}

    def test_positions_dependencies_and_headers(self, tier_workers: Any, stores: Any,
                                                engine: Any, run: str) -> None:
        """Positions are depth-first as written; each step depends on its sources; each
        step message carried `resilience_workflow_step` = "<id>:<position>" (the step's
        own record: a continuation its worker published leaves no outbox row)."""
        flow = durable(chain(t.add.s(1, 2), group(t.mul.s(2), t.seen.s(run=run)),
                             t.seen.s(run=run)), name="positions").apply_async()
        assert flow.get(timeout=30) == [[6, [3]]]
        steps = describe(stores, flow.id).steps
        assert [(s.position, s.task_name, s.depends_on) for s in steps] == [
            (0, "tests.workflows.add", []), (1, "tests.workflows.mul", [0]),
            (2, "tests.workflows.seen", [0]), (3, "tests.workflows.seen", [1, 2])]
        with engine.connect() as connection:
            headers = dict(connection.execute(text(
                "SELECT task_id, value #>> '{}' FROM workflow_test_ledger "
                "WHERE run = :run AND kind = 'header'"), {"run": run}).all())
        assert headers == {s.task_id: f"{flow.id}:{s.position}" for s in steps[2:]}
        assert flow.id in {w.id for w in recent(stores, limit=20)}

    def test_a_task_of_an_app_never_initialised_is_refused(self) -> None:
        """`durable()` names a task that cannot record its step."""
        from celery import Celery

        other = Celery("never-initialised", set_as_current=False)

        @other.task(name="tests.workflows.not_guarded")
        def not_guarded() -> None: ...

        with pytest.raises(InvalidWorkflow, match="tests.workflows.not_guarded"):
            durable(chain(t.add.s(1, 2), not_guarded.si()), app=t.app)


class TestDeliveries:
    """A redelivered or duplicated step never runs or releases twice."""

    def test_a_duplicated_step_is_replayed_and_releases_nothing(
            self, tier_workers: Any, stores: Any, engine: Any, run: str) -> None:
        """A second copy of a finished step's message (the same task id and workflow header,
        as the relay sends after a lost mark) answers its recorded result; the next step's
        effect happens once."""
        flow = durable(chain(t.step.s(None, run, "a"), t.step.s(run, "b")),
                       name="dup").apply_async()
        assert flow.get(timeout=30) == "b"
        first = describe(stores, flow.id).steps[0]
        again = t.step.apply_async((None, run, "a"), task_id=first.task_id, headers={
            WORKFLOW_STEP_HEADER: f"{flow.id}:0"})
        assert again.get(timeout=30) == "a"  # REPLAYED: the recorded result
        assert ledger(engine, run) == [("step", "a"), ("step", "b")]
        summary = describe(stores, flow.id)
        assert [s.state for s in summary.steps] == [StepState.SUCCEEDED] * 2

    def test_a_celery_retry_is_not_final(self, tier_workers: Any, stores: Any, engine: Any,
                                         run: str) -> None:
        """`self.retry()` in a step republishes it with its header: the retried delivery
        records the step and releases the next one, once."""
        flow = durable(chain(t.step.s(None, run, "a"), t.retry_once.s(run, "b"),
                             t.step.s(run, "c")), name="celery-retry").apply_async()
        assert flow.get(timeout=30) == "c"
        assert ledger(engine, run) == [("step", "a"), ("attempt", "b"), ("step", "b"),
                                       ("step", "c")]
        assert describe(stores, flow.id).counts == {"succeeded": 3}


def workflow_counts(stores: Any, name: str | None = None) -> dict[str, int]:
    """The workflow events counted so far (`resilience.counters`), by event (of the
    workflows called `name` only, when given)."""
    counts: dict[str, int] = {}
    for labels, value in read_all(stores.redis()):
        if labels.get("guard") == "workflow" and name in (None, labels.get("name")):
            counts[labels["outcome"]] = counts.get(labels["outcome"], 0) + value
    return counts


def failing_chain(run: str) -> Any:
    """a and b succeed (each with a compensation), c fails until the run's switch is set."""
    return chain(t.step.s(None, run, "a").set(compensate=t.undo.s(run, "a")),
                 t.step.s(run, "b").set(compensate=t.undo.s(run, "b")),
                 t.flaky.s(run, "c"))


def switch_on(engine: Any, run: str) -> None:
    with engine.begin() as connection:
        connection.execute(text("INSERT INTO workflow_test_switches (run) VALUES (:run)"),
                           {"run": run})


class TestCompensation:
    """A failed workflow undoes its succeeded steps in reverse order, one at a time, once."""

    def test_compensations_run_in_reverse_completion_order_once(
            self, tier_workers: Any, stores: Any, engine: Any, run: str) -> None:
        """c fails: b's compensation, then a's, each given its step's result first; the
        workflow ends compensated and `get()` says which step failed."""
        before = workflow_counts(stores)
        flow = durable(failing_chain(run), name="compensate").apply_async()
        with pytest.raises(WorkflowFailed) as failed:
            flow.get(timeout=30)
        assert failed.value.step == 2
        assert "fails on purpose" in (failed.value.error or "")
        summary = settled(stores, flow.id, WorkflowState.COMPENSATED)
        assert ledger(engine, run) == [("step", "a"), ("step", "b"), ("attempt", "c"),
                                       ("undo", "b"), ("undo", "a")]
        with engine.connect() as connection:
            undone = connection.execute(text(
                "SELECT label, value FROM workflow_test_ledger WHERE run = :run AND kind = "
                "'undo' ORDER BY ordinal"), {"run": run}).all()
        assert [(row.label, row.value) for row in undone] == [("b", "b"), ("a", "a")]
        assert [s.compensation_state for s in summary.steps] == [
            StepState.SUCCEEDED, StepState.SUCCEEDED, None]
        assert [s.state for s in summary.steps] == [
            StepState.SUCCEEDED, StepState.SUCCEEDED, StepState.FAILED]
        # counted fleet-wide (the platform's Prometheus collector exports these)
        wait_for(lambda: (lambda now: all(now.get(event, 0) - before.get(event, 0) >= 1
                                          for event in ("STARTED", "FAILED", "COMPENSATED")))(
            workflow_counts(stores)), timeout_seconds=10, message="workflow counters")


class TestOperatorActions:
    """retry, replay and cancel, published by the outbox relay."""

    def test_retry_reruns_the_failed_step_with_its_recorded_input(
            self, tier_workers: Any, relay: Any, stores: Any, engine: Any, run: str) -> None:
        """The same run goes on from the failed step; earlier steps do not run again."""
        flow = durable(chain(t.step.s(None, run, "a"), t.flaky.s(run, "c"),
                             t.step.s(run, "d")), name="retry").apply_async()
        with pytest.raises(WorkflowFailed):
            flow.get(timeout=30)
        assert describe(stores, flow.id).state is WorkflowState.FAILED
        switch_on(engine, run)
        summary = retry(stores, flow.id)
        assert summary.state is WorkflowState.RUNNING
        assert [s.state for s in summary.steps] == [
            StepState.SUCCEEDED, StepState.QUEUED, StepState.PENDING]
        assert flow.get(timeout=30) == "d"
        assert ledger(engine, run) == [("step", "a"), ("attempt", "c"), ("attempt", "c"),
                                       ("step", "c"), ("step", "d")]
        # and then a new run from step 2: steps 0 and 1 are copied, only d runs again
        replayed = replay(stores, flow.id, from_step=2)
        assert replayed.replay_of == flow.id and replayed.id != flow.id
        assert [s.state for s in replayed.steps] == [
            StepState.SUCCEEDED, StepState.SUCCEEDED, StepState.QUEUED]
        again = settled(stores, replayed.id, WorkflowState.SUCCEEDED)
        assert again.result == "d"
        assert ledger(engine, run, "step") == [("step", "a"), ("step", "c"), ("step", "d"),
                                               ("step", "d")]

    def test_retry_from_an_earlier_step(self, tier_workers: Any, relay: Any, stores: Any,
                                        engine: Any, run: str) -> None:
        """`from_step` reruns that step and everything after it, with the recorded input."""
        flow = durable(chain(t.step.s(None, run, "a"), t.step.s(run, "b"),
                             t.step.s(run, "c")), name="retry-from").apply_async()
        assert flow.get(timeout=30) == "c"
        retry(stores, flow.id, from_step=1)
        assert settled(stores, flow.id, WorkflowState.SUCCEEDED).result == "c"
        assert ledger(engine, run) == [("step", "a"), ("step", "b"), ("step", "c"),
                                       ("step", "b"), ("step", "c")]

    def test_cancel_skips_what_is_left_and_compensates(
            self, tier_workers: Any, relay: Any, stores: Any, engine: Any, run: str) -> None:
        """Cancelled while b runs: c never runs, b finishes and is compensated, then a."""
        flow = durable(chain(
            t.step.s(None, run, "a").set(compensate=t.undo.s(run, "a")),
            t.step.s(run, "b", pause_seconds=1.5).set(compensate=t.undo.s(run, "b")),
            t.step.s(run, "c")), name="cancel").apply_async()
        wait_for(lambda: describe(stores, flow.id).steps[1].started_at, timeout_seconds=20,
                 message="step b started")
        summary = cancel(stores, flow.id, app=t.app)
        assert summary.state is WorkflowState.CANCELLED
        assert summary.steps[2].state is StepState.SKIPPED
        wait_for(lambda: len(ledger(engine, run, "undo")) == 2, timeout_seconds=30,
                 message="both compensations")
        with pytest.raises(WorkflowFailed) as failed:
            flow.get(timeout=1)
        assert failed.value.state == WorkflowState.CANCELLED
        assert ledger(engine, run) == [("step", "a"), ("step", "b"), ("undo", "b"),
                                       ("undo", "a")]


class TestTransactions:
    """Steps written in the caller's transaction; transactional steps record in theirs."""

    def test_apply_async_in_the_callers_transaction(self, tier_workers: Any, relay: Any,
                                                    stores: Any, engine: Any) -> None:
        """Rolled back: no workflow. Committed: the relay starts it."""
        with engine.connect() as connection, connection.begin() as transaction:
            gone = durable(chain(t.add.s(1, 2), t.mul.s(3))).apply_async_in(connection)
            transaction.rollback()
        with pytest.raises(WorkflowNotFound):
            describe(stores, gone.id)
        with engine.begin() as connection:
            kept = durable(chain(t.add.s(1, 2), t.mul.s(3))).apply_async_in(connection)
        assert kept.get(timeout=30) == 9

    def test_a_transactional_step_records_in_its_bodys_transaction(
            self, tier_workers: Any, stores: Any, engine: Any, run: str) -> None:
        """`@idempotent(transactional=True)`: the step's state commits with its ledger row;
        its idempotency key is workflow:<id>:<position>."""
        flow = durable(chain(t.ledger_step.s(None, run, "a"), t.ledger_step.s(run, "b")),
                       name="transactional").apply_async()
        assert flow.get(timeout=30) == "b"
        with engine.connect() as connection:
            same = connection.execute(text(
                "SELECT s.position, l.xmin::text = s.xmin::text AS same "
                "FROM resilience_workflow_steps s JOIN workflow_test_ledger l "
                "ON l.task_id = s.task_id WHERE s.workflow_id = :id ORDER BY s.position"),
                {"id": flow.id}).all()
            keys = set(connection.execute(text(
                "SELECT key FROM resilience_idempotency_records WHERE key LIKE :prefix"),
                {"prefix": f"workflow:{flow.id}:%"}).scalars())
        # the last step's row is updated again by nothing; the first by its own record only
        assert [(row.position, row.same) for row in same] == [(0, True), (1, True)]
        assert keys == {f"workflow:{flow.id}:0", f"workflow:{flow.id}:1"}


class TestRerunScope:
    """retry and replay re-run a step and its dependents only; a re-run step really runs."""

    def test_retry_keeps_a_group_sibling_that_succeeded(
            self, tier_workers: Any, relay: Any, stores: Any, engine: Any, run: str) -> None:
        """c (1) fails, its sibling d (2) succeeds: retry re-runs c and the fan-in e (3)
        only; d keeps its result and runs once."""
        flow = durable(chain(t.step.s(None, run, "a"),
                             group(t.flaky.s(run, "c", after="d"), t.step.s(run, "d")),
                             t.pack.s()), name="rerun-scope").apply_async()
        with pytest.raises(WorkflowFailed):
            flow.get(timeout=30)
        wait_for(lambda: describe(stores, flow.id).steps[2].state is StepState.SUCCEEDED,
                 timeout_seconds=30, message="sibling d succeeded")
        switch_on(engine, run)
        summary = retry(stores, flow.id)
        assert [s.state for s in summary.steps] == [
            StepState.SUCCEEDED, StepState.QUEUED, StepState.SUCCEEDED, StepState.PENDING]
        assert flow.get(timeout=30) == [["c<-a", "d"]]
        assert sorted(label for _, label in ledger(engine, run, "step")) == ["a", "c", "d"]
        # from_step=1 of the succeeded run: c and e again, neither a nor d
        retry(stores, flow.id, from_step=1)
        assert settled(stores, flow.id, WorkflowState.SUCCEEDED).result == [["c<-a", "d"]]
        labels = [label for _, label in ledger(engine, run, "step")]
        assert sorted(labels) == ["a", "c", "c", "d"]
        # a replay from step 1 copies a and d
        replayed = replay(stores, flow.id, from_step=1)
        assert [s.state for s in replayed.steps] == [
            StepState.SUCCEEDED, StepState.QUEUED, StepState.SUCCEEDED, StepState.PENDING]
        assert settled(stores, replayed.id, WorkflowState.SUCCEEDED).result == [
            ["c<-a", "d"]]
        labels = [label for _, label in ledger(engine, run, "step")]
        assert sorted(labels) == ["a", "c", "c", "c", "d"]

    def test_a_retried_idempotent_step_runs_again_under_a_new_key(
            self, tier_workers: Any, relay: Any, stores: Any, engine: Any, run: str) -> None:
        """`@idempotent` steps keyed workflow:<id>:<pos>: a retry from step 1 runs b again
        (key workflow:<id>:1:1), not a replay of its first result; a is not re-run."""
        flow = durable(chain(t.ledger_step.s(None, run, "a"), t.ledger_step.s(run, "b"),
                             t.ledger_step.s(run, "c")), name="rerun-key").apply_async()
        assert flow.get(timeout=30) == "c"
        retry(stores, flow.id, from_step=1)
        assert settled(stores, flow.id, WorkflowState.SUCCEEDED).result == "c"
        assert ledger(engine, run) == [("step", "a"), ("step", "b"), ("step", "c"),
                                       ("step", "b"), ("step", "c")]
        with engine.connect() as connection:
            keys = set(connection.execute(text(
                "SELECT key FROM resilience_idempotency_records WHERE key LIKE :prefix"),
                {"prefix": f"workflow:{flow.id}:%"}).scalars())
        assert keys == {f"workflow:{flow.id}:{p}" for p in ("0", "1", "2", "1:1", "2:1")}


    @pytest.mark.parametrize("simple", [True, False], ids=["one-statement", "transaction"])
    def test_an_earlier_run_ending_late_records_nothing(self, stores: Any, engine: Any,
                                                        simple: bool) -> None:
        """Step 0 failed and was retried (run 1) while its first run's body was still
        going: that body's success or failure, ending late, records nothing (its result
        would pass for run 1's); run 1's own completion records and releases step 1."""
        from resilience.workflows.backend import WorkflowBackend

        canvas = durable(chain(t.add.s(1, 1), t.add.s(10)), name="stale-run")
        backend, workflow_id = unrun(WorkflowBackend, stores, engine, canvas)
        assert backend.start(workflow_id, 0) is not None
        assert backend.fail(None, workflow_id, 0, StepState.FAILED, "boom", run=0).recorded
        held = backend.restart(workflow_id, None).rows
        try:
            assert backend.start(workflow_id, 0).run == 1  # type: ignore[union-attr]
            late = backend.succeed(None, workflow_id, 0, 2, simple=simple, run=0)
            assert not late.recorded and late.rows == []
            assert not backend.fail(None, workflow_id, 0, StepState.FAILED, "late",
                                    run=0).recorded
            step = describe(stores, workflow_id).steps[0]
            assert (step.state, step.result) == (StepState.QUEUED, None)
            own = backend.succeed(None, workflow_id, 0, 2, simple=simple, run=1)
            held += own.rows
            assert own.recorded and [row.args for row in own.rows] == [[2, 10]]
        finally:
            with engine.begin() as connection:
                connection.execute(text("DELETE FROM resilience_outbox WHERE id = ANY(:ids)"),
                                   {"ids": [row.id for row in held]})


@pytest.mark.parametrize(("value", "parsed"), [
    ("w1:3", ("w1", 3, False, 0)),
    ("w1:3:compensation", ("w1", 3, True, 0)),
    ("w1:3:2", ("w1", 3, False, 2)),
    ("w1:3:compensation:2", ("w1", 3, True, 2)),
    ("w1:x", None),
])
def test_step_header_carries_the_run(value: str, parsed: tuple[Any, ...] | None) -> None:
    """`step_header` and `Headers.workflow_step` agree, the run counter included."""
    from types import SimpleNamespace

    from resilience.headers import Headers
    from resilience.workflows.backend import step_header

    step = Headers(SimpleNamespace(headers={WORKFLOW_STEP_HEADER: value})).workflow_step
    assert (None if step is None else tuple(step)) == parsed
    if parsed is not None:
        assert step_header(parsed[0], parsed[1], parsed[2], parsed[3]) == value


def unrun(backend_class: Any, stores: Any, engine: Any, canvas: Any,
          prepared: bool = True) -> tuple[Any, str]:
    """`canvas` created as a workflow nobody runs (its outbox rows deleted): the test plays
    the worker through the returned backend (`prepared`: its statements server-side
    prepared, as they are unless a transaction pooler is in front). Returns (backend,
    workflow id)."""
    import uuid

    backend = backend_class(stores.guard_engine, stores.statements(),
                            prepared=prepared and not stores.transaction_pooled)
    workflow_id = uuid.uuid4().hex
    backend.create(None, workflow_id=workflow_id, name=canvas.name,
                   canvas=canvas._document(), steps=canvas.steps, hold=False)
    with engine.begin() as connection:
        connection.execute(text("DELETE FROM resilience_outbox WHERE task_id = ANY(:ids)"),
                           {"ids": [step.task_id for step in canvas.steps]})
    return backend, workflow_id


@contextmanager
def statement_names(stores: Any) -> Iterator[list[str]]:
    """The names of the statements the stores' runner sends while the block runs."""
    statements: list[str] = []
    runner = stores.statements()
    original = runner.run

    def counted(statement: Any, *args: Any, **kwargs: Any) -> Any:
        statements.append(statement.name)
        return original(statement, *args, **kwargs)

    runner.run = counted  # type: ignore[method-assign]
    try:
        yield statements
    finally:
        del runner.run


class TestLateSuccess:
    """A step that succeeds after its workflow stopped is recorded with the next
    compensation, in one transaction."""

    def test_a_crash_before_the_compensation_is_queued_records_nothing(
            self, stores: Any, engine: Any, run: str) -> None:
        """The workflow is cancelled while a (simple) step runs; its completion then
        records the step and queues its compensation together: a crash in between leaves
        the step live (its redelivery records both), never succeeded with no compensation
        to come. Then the real completion queues the compensation."""

        from resilience.workflows.backend import WorkflowBackend

        class Crashing(WorkflowBackend):
            def _advance_compensation(self, session: Any, workflow_id: str,
                                      hold: bool = True) -> Any:
                raise RuntimeError("the worker died here")

        canvas = durable(chain(t.step.s(None, run, "a").set(compensate=t.undo.s(run, "a")),
                               t.step.s(run, "b")), name="late-success")
        backend, workflow_id = unrun(WorkflowBackend, stores, engine, canvas)
        started = backend.start(workflow_id, 0)
        assert started is not None and started.simple
        backend.cancel(workflow_id)
        crashing = Crashing(stores.guard_engine, stores.statements(),
                            prepared=not stores.transaction_pooled)
        with pytest.raises(RuntimeError):
            crashing.succeed(None, workflow_id, 0, "a", simple=True, run=0)
        first = describe(stores, workflow_id).steps[0]
        assert (first.state, first.compensation_state) == (StepState.QUEUED, None)
        released = backend.succeed(None, workflow_id, 0, "a", simple=True, run=0)
        assert released.recorded
        assert [row.task_id for row in released.rows] == [
            describe(stores, workflow_id).steps[0].compensation_task_id]
        first = describe(stores, workflow_id).steps[0]
        assert (first.state, first.compensation_state) == (StepState.SUCCEEDED,
                                                           StepState.QUEUED)
        with engine.begin() as connection:
            connection.execute(text("DELETE FROM resilience_outbox WHERE task_id = :id"),
                               {"id": first.compensation_task_id})


class TestCounters:
    """Workflow events are counted under the workflow's name, a start once it commits."""

    def test_events_by_name_and_a_start_counted_on_commit(
            self, tier_workers: Any, relay: Any, stores: Any, engine: Any, run: str) -> None:
        """A rolled-back apply_async_in counts nothing; committed, it counts STARTED then
        SUCCEEDED under its name; a cancel counts CANCELLED under the cancelled one's."""
        name = f"counted-{run}"
        with engine.connect() as connection, connection.begin() as transaction:
            durable(chain(t.add.s(1, 2)), name=name).apply_async_in(connection)
            transaction.rollback()
        assert workflow_counts(stores, name) == {}
        with engine.begin() as connection:
            kept = durable(chain(t.add.s(1, 2), t.mul.s(3)), name=name
                           ).apply_async_in(connection)
            assert workflow_counts(stores, name) == {}  # not committed yet
        assert kept.get(timeout=30) == 9
        wait_for(lambda: workflow_counts(stores, name) == {"STARTED": 1, "SUCCEEDED": 1},
                 timeout_seconds=10, message="counted under the workflow's name")
        stopped = durable(chain(t.step.s(None, run, "a", pause_seconds=1.0),
                                t.step.s(run, "b")), name=f"{name}-cancel").apply_async()
        cancel(stores, stopped.id, app=t.app)
        assert workflow_counts(stores, f"{name}-cancel") == {"STARTED": 1, "CANCELLED": 1}

    def test_a_worker_s_counts_go_together(self, app: Any, stores: Any,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
        """`count_later` (a worker's workflow ends): held in the process, then one write
        per counter by the flush timer once due (at once at shutdown); a name Redis's
        field format cannot parse back is counted too, not dropped with the batch."""
        import uuid

        from resilience import counters, flushing

        name = f"later-{uuid.uuid4().hex[:8]}"
        monkeypatch.setattr(counters, "LATER_INTERVAL_SECONDS", 60.0)
        for outcome in ("SUCCEEDED", "SUCCEEDED", "FAILED"):
            counters.count_later(app, outcome, guard="workflow", name=name)
        counters.count_later(app, "FAILED", guard="workflow", name=f"{name}|odd")
        assert workflow_counts(stores, name) == {}
        flushing.flush_all()
        assert workflow_counts(stores, name) == {"SUCCEEDED": 2, "FAILED": 1}
        assert workflow_counts(stores, f"{name}|odd") == {"FAILED": 1}
        monkeypatch.setattr(counters, "LATER_INTERVAL_SECONDS", 0.2)
        counters.count_later(app, "SUCCEEDED", guard="workflow", name=name)
        wait_for(lambda: workflow_counts(stores, name) == {"SUCCEEDED": 3, "FAILED": 1},
                 timeout_seconds=5, message="the held count written by the timer")

    def test_recent_does_not_read_canvases(self, tier_workers: Any, stores: Any) -> None:
        """The list query names no canvas column (a batch's canvas is as long as it)."""
        from resilience.workflows.backend import _RECENT, _WORKFLOW

        assert "canvas" not in str(_RECENT)
        assert "canvas" in str(_WORKFLOW)  # a run's own page (and replay) reads it
        run = durable(chain(t.add.s(1, 2)), name="listed").apply_async()
        run.get(timeout=30)
        assert run.id in {w.id for w in recent(stores, limit=20)}


def test_a_chord_header_member_completes_in_one_statement() -> None:
    """`link` marks fan-in members simple (their completion is one statement unless they
    are the last source: the backend then takes the transaction), and the chord body."""
    from resilience.workflows.canvas import flatten

    steps, _ = flatten(chain(t.add.s(1, 1), chord([t.mul.s(3), t.mul.s(4)], t.total.s())))
    assert [(s.position, s.dependents, s.simple) for s in steps] == [
        (0, [1, 2], True), (1, [3], True), (2, [3], True), (3, [], True)]
    steps, _ = flatten(group(t.add.s(1, 1), t.add.s(2, 2)))
    assert [s.simple for s in steps] == [False, False]  # the result is both: a transaction


def test_a_chord_header_member_that_feeds_the_body_locks_first() -> None:
    """`link` marks the members of a fan-in `fan_in` (their one statement takes the locks
    first), and only them; the mark is in the step's stored signature."""
    from resilience.workflows.canvas import flatten

    steps, _ = flatten(chain(t.add.s(1, 1), chord([t.mul.s(3), t.mul.s(4)], t.total.s())))
    assert [(s.position, s.fan_in) for s in steps] == [
        (0, False), (1, True), (2, True), (3, False)]
    assert steps[1].signature()["fan_in"] is True
    assert "fan_in" not in steps[0].signature()


class TestChainRelease:
    def test_each_chain_step_is_one_statement_that_releases_the_next(
            self, stores: Any, engine: Any) -> None:
        """A step whose dependents wait for it alone records itself and releases them in
        one lean statement (no fan-in CTEs): each released row carries the previous result
        first, as Celery's chain passes it; the last step finishes the workflow."""

        from resilience.workflows.backend import WorkflowBackend

        canvas = durable(chain(t.add.s(1, 1), t.add.s(10), t.add.s(100)), name="chain")
        backend, workflow_id = unrun(WorkflowBackend, stores, engine, canvas)
        released = []
        with statement_names(stores) as statements:
            for position, result in ((0, 2), (1, 12), (2, 112)):
                started = backend.start(workflow_id, position)
                assert started is not None and started.simple and not started.fan_in
                released.append(backend.succeed(None, workflow_id, position, result,
                                                simple=True, fan_in=False, run=started.run))
        assert statements == ["resilience_workflow_start",
                              "resilience_workflow_succeed_chain"] * 3
        assert [[(row.task_id, row.args) for row in r.rows] for r in released] == [
            [(canvas.steps[1].task_id, [2, 10])], [(canvas.steps[2].task_id, [12, 100])], []]
        assert released[2].finished == WorkflowState.SUCCEEDED
        assert describe(stores, workflow_id).result == 112
        with engine.begin() as connection:
            connection.execute(text("DELETE FROM resilience_outbox WHERE task_id = ANY(:ids)"),
                               {"ids": [step.task_id for step in canvas.steps]})


def outbox_states(engine: Any, ids: list[int]) -> list[str]:
    with engine.connect() as connection:
        return list(connection.execute(text(
            "SELECT state FROM resilience_outbox WHERE id = ANY(:ids) ORDER BY id"),
            {"ids": ids}).scalars())


class TestLateMark:
    """A worker's mark of the continuations it published (their rows deleted) rides on its
    next statement; the flush timer sends one that no statement carried."""

    @contextmanager
    def released(self, stores: Any, engine: Any) -> Iterator[tuple[Any, str, list[int]]]:
        """A chain whose first step succeeded: (backend, workflow id, its held row ids);
        the rows are deleted afterwards."""
        from resilience.workflows.backend import WorkflowBackend

        canvas = durable(chain(t.add.s(1, 1), t.add.s(10)), name="late-mark")
        backend, workflow_id = unrun(WorkflowBackend, stores, engine, canvas)
        backend.start(workflow_id, 0)
        ids = [row.id for row in backend.succeed(None, workflow_id, 0, 2, simple=True,
                                                 run=0).rows]
        assert len(ids) == 1 and outbox_states(engine, ids) == ["pending"]
        try:
            yield backend, workflow_id, ids
        finally:
            with engine.begin() as connection:
                connection.execute(text("DELETE FROM resilience_outbox WHERE id = ANY(:ids)"),
                                   {"ids": ids})

    def test_the_mark_rides_on_the_next_step_start(self, stores: Any, engine: Any) -> None:
        with self.released(stores, engine) as (backend, workflow_id, ids):
            backend.outbox.mark_delay_seconds = 60.0  # the timer stays out of it
            with statement_names(stores) as statements:
                backend.outbox.mark_published(ids, later=True)
                assert outbox_states(engine, ids) == ["pending"]
                assert backend.start(workflow_id, 1) is not None
            assert statements == ["resilience_workflow_start"]  # one round trip for both
            assert outbox_states(engine, ids) == []

    def test_an_idle_thread_s_mark_is_sent_by_the_timer(self, stores: Any,
                                                         engine: Any) -> None:
        with self.released(stores, engine) as (backend, _, ids):
            backend.outbox.mark_published(ids, later=True)
            wait_for(lambda: outbox_states(engine, ids) == [], timeout_seconds=5,
                     message="the late mark sent by the flush timer")

    def test_a_mark_whose_statement_failed_is_sent_by_the_timer(self, stores: Any,
                                                                engine: Any) -> None:
        from resilience.errors import StorageError
        from resilience.prepared import PreparedStatement

        with self.released(stores, engine) as (backend, _, ids):
            backend.outbox.mark_published(ids, later=True)
            with pytest.raises(StorageError):
                stores.statements().run(PreparedStatement("late_mark_fails", "SELECT 1 / 0"),
                                        {}, "late mark test", lead=True)
            wait_for(lambda: outbox_states(engine, ids) == [], timeout_seconds=5,
                     message="the dropped mark sent by the flush timer")

    def test_a_row_the_relay_published_keeps_the_relay_s_mark(self, stores: Any,
                                                              engine: Any) -> None:
        """The relay took the row after its hold (the worker's mark was late): the worker's
        mark leaves the relay's record as it is."""
        with self.released(stores, engine) as (backend, _, ids):
            with engine.begin() as connection:
                connection.execute(text(
                    "UPDATE resilience_outbox SET state = 'published', "
                    "finished_at = clock_timestamp() WHERE id = ANY(:ids)"), {"ids": ids})
            backend.outbox.mark_published(ids)
            assert outbox_states(engine, ids) == ["published"]


class TestFanInRelease:
    """The last source of a chord body releases it in its one statement."""

    @pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "unprepared"])
    def test_the_last_header_member_releases_the_body_with_every_result(
            self, stores: Any, engine: Any, prepared: bool) -> None:
        """Each header member's completion is one statement; the last one writes the body's
        outbox row with the header's results in header order (its own included), as plain
        Celery passes them; the body's completion then finishes the workflow. The same
        with the statements unprepared (behind a transaction pooler)."""

        from resilience.workflows.backend import WorkflowBackend

        canvas = durable(chord([t.add.s(1, 1), t.add.s(2, 2), t.add.s(3, 3)],
                               t.pack.s("end")), name="fan-in")
        backend, workflow_id = unrun(WorkflowBackend, stores, engine, canvas, prepared)
        released = []
        with statement_names(stores) as statements:
            for position, result in ((2, 6), (0, 2), (1, 4)):  # out of order
                started = backend.start(workflow_id, position)
                assert started is not None and started.simple and started.fan_in
                released.append(backend.succeed(None, workflow_id, position, result,
                                                simple=True, fan_in=True, run=started.run))
        assert statements == ["resilience_workflow_start", "resilience_workflow_succeed"] * 3
        if prepared and not stores.transaction_pooled:  # the lock sent before each member's
            assert "resilience_workflow_lock" in stores.statements().connection().prepared
        assert [r.rows for r in released[:2]] == [[], []]
        body = canvas.steps[3]
        assert [(row.task_id, row.args) for row in released[2].rows] == [
            (body.task_id, [[2, 4, 6], "end"])]
        started = backend.start(workflow_id, 3)
        assert started is not None and not started.fan_in
        finished = backend.succeed(None, workflow_id, 3, [[2, 4, 6], "end"],
                                   simple=started.simple, fan_in=started.fan_in,
                                   run=started.run)
        assert finished.finished == WorkflowState.SUCCEEDED
        summary = describe(stores, workflow_id)
        assert summary.result == [[2, 4, 6], "end"]
        assert summary.counts == {"succeeded": 4}
        with engine.begin() as connection:
            connection.execute(text("DELETE FROM resilience_outbox WHERE task_id = :id"),
                               {"id": body.task_id})
