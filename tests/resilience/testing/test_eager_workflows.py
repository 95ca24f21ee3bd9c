"""Durable canvases in a user's tests (`resilience.workflows.eager`): in memory mode and under
`task_always_eager` `durable(sig).apply_async()` runs the canvas in process, with Celery's
eager results, compensations in reverse order and a run whose `.get()` answers or raises
`WorkflowFailed`. The app is a user's own whose Redis and PostgreSQL URLs point at ports where
nothing listens (so nothing here can reach a server).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery, chain, chord, group
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from resilience.retry import retry_policy
from resilience.stores import stores_for
from resilience.testing import memory_mode
from resilience.workflows import (
    EagerWorkflowRun,
    InvalidWorkflow,
    StepState,
    WorkflowFailed,
    WorkflowNotFound,
    WorkflowState,
    describe,
    durable,
    recent,
)
from tests.resilience.testing.test_memory_mode import NonRetryable, dead_app


class Shop:
    """A user's app and tasks, with what their bodies did (`log`)."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.mode: Any = None  # the MemoryMode, in memory mode
        self.log: list[Any] = []
        log = self.log

        @app.task(shared=False, name="shop.add")
        def add(x: int, y: int) -> int:
            return x + y

        @app.task(shared=False, name="shop.mul")
        def mul(x: int, y: int) -> int:
            return x * y

        @app.task(shared=False, name="shop.pack")
        def pack(values: Any, label: str | None = None) -> list[Any]:
            return [values, label]

        @app.task(shared=False, name="shop.total")
        def total(values: list[int]) -> int:
            return sum(values)

        @app.task(shared=False, name="shop.charge")
        def charge(order: int) -> dict[str, int]:
            log.append(("charge", order))
            return {"order": order, "charged": order * 100}

        @app.task(shared=False, name="shop.reserve")
        def reserve(charged: dict[str, int]) -> str:
            log.append(("reserve", charged["order"]))
            return f"slot-{charged['order']}"

        @app.task(shared=False, name="shop.ship")
        def ship(slot: str) -> None:
            log.append(("ship", slot))
            raise ValueError(f"no courier for {slot}")

        @app.task(shared=False, name="shop.undo")
        def undo(result: Any, what: str) -> None:
            log.append(("undo", what, result))

        @app.task(shared=False, name="shop.parse")
        @retry_policy(max_attempts=2)
        def parse(text: str) -> int:
            raise NonRetryable(text)

        @app.task(shared=False, name="shop.opaque")
        def opaque() -> object:
            return object()

        self.add, self.mul, self.pack, self.total = add, mul, pack, total
        self.charge, self.reserve, self.ship, self.undo = charge, reserve, ship, undo
        self.parse, self.opaque = parse, opaque


@pytest.fixture()
def shop() -> Iterator[Shop]:
    with memory_mode() as mode:
        found = Shop(dead_app())
        found.mode = mode
        yield found


def shapes(s: Shop) -> dict[str, Callable[[], Any]]:
    """The canvas shapes tests/resilience/workflows compares with plain Celery's."""
    return {
        "task": lambda: s.add.s(2, 3),
        "chain": lambda: chain(s.add.s(1, 2), s.mul.s(10), s.add.s(5)),
        "group": lambda: group(s.add.s(1, 1), s.mul.s(3, 3), s.add.s(2, 2)),
        "chord": lambda: chord([s.add.s(1, 2), s.mul.s(2, 5)], s.pack.s("end")),
        "chain-group-task": lambda: chain(s.add.s(1, 2), group(s.mul.s(2), s.mul.s(3)),
                                          s.pack.s()),
        "chain-ending-in-group": lambda: chain(s.add.s(2, 3), group(s.mul.s(2), s.add.s(1))),
        "group-of-chains": lambda: chain(group(chain(s.add.s(1, 1), s.mul.s(5)),
                                               chain(s.add.s(2, 2), s.mul.s(6))), s.pack.s()),
        "immutable": lambda: chain(s.add.s(1, 2), s.add.si(10, 20), s.pack.s("x")),
        "chord-in-chain": lambda: chain(s.add.s(1, 1), chord([s.mul.s(3), s.mul.s(4)],
                                                             s.total.s()), s.mul.s(2)),
    }


class TestEagerResults:
    def test_each_shape_answers_what_plain_celery_eager_answers(self, shop: Shop) -> None:
        """Every shape: the run's value is plain Celery's eager `.get()` of the same canvas,
        and `describe` shows every step succeeded, in position order."""
        for name, make in shapes(shop).items():
            expected = make().apply_async().get()
            run = durable(make(), name=name).apply_async()
            assert isinstance(run, EagerWorkflowRun)
            assert run.get() == expected, name
            assert run.state is WorkflowState.SUCCEEDED and run.ready()
            summary = describe(stores_for(shop.app), run.id)
            assert summary.result == expected
            assert summary.counts == {"succeeded": len(summary.steps)}
            assert [s.position for s in summary.steps] == list(range(len(summary.steps)))
        assert len(recent(stores_for(shop.app), limit=50)) == len(shapes(shop))

    def test_results_pass_through_celerys_json(self, shop: Shop) -> None:
        """A tuple arrives as a list (as between workers); a value JSON cannot carry fails
        its step, as it would in PostgreSQL."""
        assert durable(chain(shop.add.s(1, 2), shop.pack.s((1, 2)))).apply_async().get() == [
            3, [1, 2]]
        run = durable(shop.opaque.s()).apply_async()
        with pytest.raises(WorkflowFailed, match="UnserializableResult") as failed:
            run.get()
        assert failed.value.state == WorkflowState.FAILED and failed.value.step == 0

    def test_a_task_of_an_app_never_initialised_is_refused(self) -> None:
        plain = Celery("plain", broker="memory://")

        @plain.task(shared=False)
        def step() -> None:
            return None

        with memory_mode(), pytest.raises(InvalidWorkflow, match="resilience.init_app"):
            durable(step.s(), app=plain)


class TestEagerFailure:
    def test_compensations_run_in_reverse_order_and_get_raises(self, shop: Shop) -> None:
        """charge → reserve → ship: ship fails, so reserve's then charge's compensation
        run, each once with its step's result first; `.get()` raises WorkflowFailed from
        ship's own exception; the run ends compensated."""
        s = shop
        canvas = chain(s.charge.s(7).set(compensate=s.undo.s("charge")),
                       s.reserve.s().set(compensate=s.undo.s("reserve")),
                       s.ship.s(), s.add.s(1))
        run = durable(canvas, name="order").apply_async()
        with pytest.raises(WorkflowFailed, match="at step 2: ValueError") as failed:
            run.get()
        assert failed.value.state == WorkflowState.COMPENSATED
        assert failed.value.step == 2
        assert isinstance(failed.value.__cause__, ValueError)
        assert s.log == [("charge", 7), ("reserve", 7), ("ship", "slot-7"),
                         ("undo", "reserve", "slot-7"),
                         ("undo", "charge", {"order": 7, "charged": 700})]
        steps = describe(stores_for(s.app), run.id).steps
        assert [step.state for step in steps] == [
            StepState.SUCCEEDED, StepState.SUCCEEDED, StepState.FAILED, StepState.SKIPPED]
        assert [step.compensation_state for step in steps] == [
            StepState.SUCCEEDED, StepState.SUCCEEDED, None, None]

    def test_a_failed_group_member_cancels_its_released_siblings(self, shop: Shop) -> None:
        """group(a, ship, b) then a body: ship fails, so b (released with it) is cancelled,
        the body is skipped, and a, with no compensation, leaves the run failed."""
        s = shop
        run = durable(chord([s.add.s(1, 1), s.ship.s("x"), s.add.s(2, 2)], s.total.s())
                      ).apply_async()
        with pytest.raises(WorkflowFailed) as failed:
            run.get()
        assert failed.value.state == WorkflowState.FAILED and failed.value.step == 1
        assert [step.state for step in describe(stores_for(s.app), run.id).steps] == [
            StepState.SUCCEEDED, StepState.FAILED, StepState.CANCELLED, StepState.SKIPPED]

    def test_a_dead_lettered_step_fails_the_run(self, shop: Shop) -> None:
        """A guard's decision is the step's state: a non-retryable error is dead-lettered
        (in memory) and the run fails at that step."""
        run = durable(chain(shop.add.s(1, 2), shop.parse.si("bad"))).apply_async()
        with pytest.raises(WorkflowFailed) as failed:
            run.get()
        assert failed.value.step == 1
        assert describe(stores_for(shop.app), run.id).steps[1].state is \
            StepState.DEAD_LETTERED
        assert len(shop.mode.dead_letters(shop.app)) == 1


class TestEagerTransactions:
    def test_apply_async_in_runs_on_commit_and_never_on_rollback(self, shop: Shop) -> None:
        engine = create_engine("sqlite://")
        try:
            with Session(engine) as session:
                dropped = durable(shop.charge.s(1)).apply_async_in(session)
                session.rollback()
            with pytest.raises(WorkflowNotFound):
                dropped.get()
            with Session(engine) as session:
                kept = durable(shop.charge.s(2)).apply_async_in(session)
                assert shop.log == []  # not before the commit
                session.commit()
            assert kept.get() == {"order": 2, "charged": 200}
            assert shop.log == [("charge", 2)]
        finally:
            engine.dispose()


class TestAlwaysEager:
    def test_task_always_eager_without_memory_mode_runs_in_process(self) -> None:
        """`task_always_eager` alone (stores configured, unreachable): the canvas runs in
        process and nothing reaches Redis or PostgreSQL."""
        s = Shop(dead_app(task_always_eager=True))
        run = durable(chain(s.add.s(1, 2), group(s.mul.s(2), s.mul.s(3)), s.pack.s())
                      ).apply_async()
        assert run.get() == [[6, 9], None]
        assert describe(stores_for(s.app), run.id).state is WorkflowState.SUCCEEDED
