"""`GuardedTask` keeps Celery's task API: argument types, `typing`, direct calls pushing a
request, and the arguments Celery's JSON serializer carries (UUID, datetime, Decimal)."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from typing import Any

import pytest
from celery import Celery
from kombu import Connection
from sqlalchemy.orm import Session

from resilience.errors import ArgumentsDoNotBind, InvalidTaskArguments, NonJsonArguments
from resilience.task import GuardedTask
from tests.support import wait_for


class TestArgumentTypes:
    def test_args_that_are_not_a_list_or_tuple_raise_type_error(self) -> None:
        """Celery raises TypeError for `apply_async("s", {})`; it must not publish `("s",)`."""
        from tests.resilience.pipeline.tasks_api import typed

        with pytest.raises(TypeError, match="list or tuple"):
            typed.apply_async("s", {})
        with pytest.raises(InvalidTaskArguments):
            typed.apply_async({"x": 1})

    def test_kwargs_that_are_not_a_mapping_raise_type_error(self) -> None:
        """A list of pairs is not kwargs (before: `dict(kwargs)` accepted it)."""
        from tests.resilience.pipeline.tasks_api import typed

        with pytest.raises(TypeError, match="mapping"):
            typed.apply_async((), [("x", 1)])

    def test_apply_async_in_checks_the_same_types(self, engine: Any) -> None:
        from tests.resilience.pipeline.tasks_api import typed

        with Session(engine) as session, session.begin():
            with pytest.raises(TypeError, match="list or tuple"):
                typed.apply_async_in(session, "s")
            with pytest.raises(TypeError, match="mapping"):
                typed.apply_async_in(session, (), [("x", 1)])


@pytest.mark.usefixtures("tier_workers")
class TestTyping:
    def test_typing_false_publishes_arguments_that_do_not_bind(self) -> None:
        """`@app.task(typing=False)`: no signature check in the producer nor in the worker,
        as in Celery: the result is the body's TypeError (before: dead-lettered)."""
        from tests.resilience.pipeline.tasks_api import typed, untyped

        with pytest.raises(ArgumentsDoNotBind):
            typed.delay(1, 2)
        result = untyped.delay(1, 2)
        with pytest.raises(TypeError, match="positional argument"):
            result.get(timeout=30)  # the body's own TypeError, as Celery promises
        assert result.state == "FAILURE"

    def test_typing_false_still_bounds_the_payload(self) -> None:
        """The serializer and size checks protect the broker whatever `typing` says."""
        from tests.resilience.pipeline.tasks_api import untyped

        with pytest.raises(NonJsonArguments):
            untyped.delay({1, 2})

    def test_pydantic_task_sends_its_models_dumped(self) -> None:
        """`pydantic=True`: the checks see what Celery sends, the model dumped to a dict
        (before: the model itself, refused with NonJsonArguments)."""
        from tests.resilience.pipeline.tasks_api import Parcel, weighed

        assert weighed.delay(Parcel(weight=7)).get(timeout=30) == 7
        assert weighed.delay(parcel=Parcel(weight=8)).get(timeout=30) == 8

    def test_non_json_arguments_is_kombus_encode_error(self) -> None:
        """Code written for Celery catches kombu's EncodeError for unserializable arguments."""
        from kombu.exceptions import EncodeError

        from tests.resilience.pipeline.tasks_api import untyped

        with pytest.raises(EncodeError):
            untyped.delay({1, 2})

    def test_strict_typing_false_on_the_app_is_respected(self, services: Any) -> None:
        """An app created with `strict_typing=False` publishes what Celery would publish."""
        queue = f"task-api-loose-{uuid.uuid4().hex[:8]}"
        loose = Celery("loose", broker=services.broker_url, task_cls=GuardedTask,
                       strict_typing=False, set_as_current=False)
        loose.conf.task_default_queue = queue

        @loose.task(name="tests.task_api.loose")
        def loose_task(x: int) -> int:  # pragma: no cover - never run
            return x

        assert loose_task.typing is False
        loose_task.delay(1, 2, 3)
        with Connection(services.broker_url) as connection:
            simple = connection.SimpleQueue(queue)
            try:
                message = simple.get(timeout=10)
                args, kwargs, _ = message.decode()
                message.ack()
            finally:
                simple.queue.delete()
                simple.close()
        assert (args, kwargs) == ([1, 2, 3], {})


class TestDirectCalls:
    def test_a_direct_call_pushes_its_own_request(self) -> None:
        """Called as a function, the task sees its arguments in `self.request`, and the
        guards see an inline call."""
        from tests.resilience.pipeline.tasks_api import recurse

        assert recurse(0) == {"args": [0], "called_directly": True, "inline": True}

    @pytest.mark.usefixtures("tier_workers")
    def test_a_task_calling_itself_directly_sees_its_own_arguments(self) -> None:
        """In a worker the message's call runs under the message's request (not inline);
        the task's direct call to itself gets a request with its own arguments and is
        inline (before: it saw the outer request, so its guards took it for the message)."""
        from tests.resilience.pipeline.tasks_api import recurse

        seen = recurse.delay(2).get(timeout=30)
        assert seen == {
            "args": [2], "called_directly": False, "inline": False,
            "inner": {
                "args": [1], "called_directly": True, "inline": True,
                "inner": {"args": [0], "called_directly": True, "inline": True},
            },
        }

    def test_current_task_is_the_directly_called_task(self) -> None:
        """The direct call pushes the task on Celery's stack, as `Task.__call__` does."""
        from celery import current_task

        from tests.resilience.pipeline.tasks_api import typed

        seen = []
        original = typed.run

        def run(x: int) -> int:
            seen.append(current_task.name)
            return x

        typed.run = run
        try:
            assert typed(3) == 3
        finally:
            typed.run = original
        assert seen == [typed.name]


@pytest.mark.usefixtures("tier_workers")
class TestKombuJsonTypes:
    KEY = uuid.UUID("6f1c3b5e-2a4d-4c8e-9b7a-1d2e3f405162")
    WHEN = dt.datetime(2026, 11, 26, 17, 0, 5, 123456, tzinfo=dt.UTC)
    AMOUNT = Decimal("10.50")

    def expected(self) -> list[str]:
        return ["UUID", self.KEY.hex, "datetime", self.WHEN.isoformat(), "Decimal", "10.50"]

    def test_an_unguarded_task_accepts_and_receives_them(self) -> None:
        from tests.resilience.pipeline.tasks_api import kombu_types_plain

        result = kombu_types_plain.delay(self.KEY, self.WHEN, self.AMOUNT)
        assert result.get(timeout=30) == self.expected()

    def test_a_guarded_task_keys_them_alike_in_producer_and_worker(self) -> None:
        """`@unique` builds its key in the producer and gives it back from the worker, and
        `@idempotent` keys on all arguments: both cope with kombu's types. A second call
        after the first finished is admitted (the worker released the producer's key)
        and replays the first call's result."""
        from tests.resilience.pipeline.tasks_api import kombu_types_guarded

        key = uuid.uuid4()
        first = kombu_types_guarded.delay(key, self.WHEN, self.AMOUNT)
        value = first.get(timeout=30)
        assert value == ["UUID", key.hex, *self.expected()[2:], first.id]
        second = kombu_types_guarded.delay(key, self.WHEN, self.AMOUNT)
        assert second.id != first.id
        replay = second.get(timeout=30)
        assert replay == value, replay  # the stored result, as the first call answered

    def test_what_the_serializer_refuses_is_still_refused(self) -> None:
        from tests.resilience.pipeline.tasks_api import kombu_types_plain

        with pytest.raises(NonJsonArguments):
            kombu_types_plain.delay({1, 2}, self.WHEN, self.AMOUNT)
        with pytest.raises(NonJsonArguments):
            kombu_types_plain.delay(self.KEY, self.WHEN, float("nan"))

    def test_enqueue_in_carries_them_through_the_outbox(self, app: Any, engine: Any) -> None:
        """The outbox row keeps kombu's tagged form, so the relay publishes the values the
        worker decodes back (before: a raw TypeError from the insert)."""
        from resilience.outbox.relay import Relay, RelayConfig
        from tests.resilience.pipeline.tasks_api import kombu_types_plain

        with Session(engine) as session, session.begin():
            result = kombu_types_plain.enqueue_in(session, self.KEY, self.WHEN, self.AMOUNT)
        relay = Relay(app, RelayConfig(backoff_initial_seconds=0.05, backoff_max_seconds=0.2))
        wait_for(lambda: (relay.relay_once(), result.ready())[1], timeout_seconds=30,
                 message="the outbox row's job")
        assert result.get(timeout=5) == self.expected()
