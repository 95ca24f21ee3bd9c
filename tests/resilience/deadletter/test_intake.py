"""The worker's intake: malformed messages published raw into a tier queue end as dead
letters with their reason; the worker's main process never exits; a good job still runs."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from resilience.deadletter.intake import UNKNOWN_TASK, MalformedBody, check_body
from resilience.deadletter.place import DeadLetterNotRunnable, list_entries, requeue
from tests.support import wait_for

QUEUE = "standard"


def _publish(app: Any, body: Any, *, headers: dict[str, Any] | None,
             content_type: str = "application/json") -> None:
    """Put one message into the tier queue exactly as given, bypassing every producer check."""
    with app.connection_for_write() as connection:
        producer = connection.Producer(serializer=None)
        producer.publish(
            body, exchange="jobs", routing_key=QUEUE, headers=headers or {},
            content_type=content_type, content_encoding="utf-8" if isinstance(body, str)
            else "binary", declare=[],
        )


def _headers(task: str, tag: str, **extra: Any) -> dict[str, Any]:
    """Celery's protocol 2 headers, plus `tag` so the test finds its own rows."""
    return {"lang": "py", "task": task, "id": str(uuid.uuid4()), "root_id": None,
            "parent_id": None, "group": None, "test_tag": tag, **extra}


class TestCheckBody:
    @pytest.mark.parametrize("payload", [[], [1, 2], [[1], {}, {}, 4], {"a": 1}, "x",
                                         [1, {}, {}], [[], [], {}], [[], {}, 5]])
    def test_refused(self, payload: Any) -> None:
        """Anything but [list, dict, dict|None] is refused with a reason."""
        with pytest.raises(MalformedBody):
            check_body(payload)

    def test_accepted(self) -> None:
        """A well-formed body gives its args and kwargs."""
        assert check_body([[1], {"a": 2}, None]) == ([1], {"a": 2})


@pytest.mark.timeout(180)
class TestIntake:
    def test_every_malformed_message_is_dead_lettered(
        self, app: Any, engine: Any, worker_factory: Any, purge_queues: None
    ) -> None:
        """Garbage bytes, no headers, pickle, an unregistered task, a body that is not
        [args, kwargs, embed], a missing id: one dead-letter row each, with its reason; the
        worker survives them all and a good job sent after them runs."""
        from tests.resilience.deadletter.tasks import failure_echo

        worker = worker_factory(QUEUE, name="intake", concurrency=1)
        tag = uuid.uuid4().hex
        known = failure_echo.name
        call = json.dumps([[tag], {}, {}])
        json_type, pickle_type = "application/json", "application/x-python-serialize"
        cases = {
            "garbage": (b"\x00\xffnot json", _headers(known, tag), json_type),
            "no headers": (call, None, json_type),
            "pickle": (b"\x80\x04K\x01.", _headers(known, tag), pickle_type),
            "unregistered": (call, _headers(f"no.such.task.{tag}", tag), json_type),
            "bad body": (json.dumps([[tag], {}, {}, "extra"]), _headers(known, tag), json_type),
            "bad kwargs": (json.dumps([[tag], [1], {}]), _headers(known, tag), json_type),
            "no id": (call, {"task": known, "lang": "py", "test_tag": tag}, json_type),
        }
        for body, headers, content_type in cases.values():
            _publish(app, body, headers=headers, content_type=content_type)
        good = failure_echo.delay(tag)
        assert good.get(timeout=60) == tag

        def ours() -> list[Any]:
            return [e for e in list_entries(engine, limit=200) if e.guard == "intake"
                    and tag in json.dumps(e.raw_message)]

        wait_for(lambda: len(ours()) >= len(cases), timeout_seconds=60,
                 message="every malformed message dead-lettered")
        entries = ours()
        assert len(entries) == len(cases)
        assert worker.alive()
        reasons = " | ".join(sorted(e.reason for e in entries))
        assert "cannot be decoded" in reasons
        assert "not registered" in reasons
        assert "not a task message" in reasons or "header" in reasons
        assert "malformed" in reasons
        for entry in entries:
            assert entry.raw_message is not None and entry.reason
        unregistered = next(e for e in entries if e.task_name.startswith("no.such.task."))
        assert unregistered.args == [tag] and unregistered.raw_message["runnable"] is True
        garbage = next(e for e in entries if "cannot be decoded" in e.reason)
        assert garbage.raw_message["runnable"] is False
        with pytest.raises(DeadLetterNotRunnable):
            requeue(engine, app, garbage.id)
        assert UNKNOWN_TASK in {e.task_name for e in entries}  # the message without headers


@pytest.mark.timeout(120)
def test_arguments_that_do_not_bind_are_dead_lettered(
    app: Any, engine: Any, worker_factory: Any, purge_queues: None
) -> None:
    """A message whose arguments do not fit the task's signature (sent by another producer,
    bypassing enqueue validation) fails once and is dead-lettered, not retried."""
    from tests.resilience.deadletter.tasks import failure_echo

    worker_factory(QUEUE, name="intake-args", concurrency=1)
    tag = uuid.uuid4().hex
    result = app.send_task(failure_echo.name, args=[tag, "extra", "more"], queue=QUEUE)
    wait_for(result.ready, timeout_seconds=60, message="bad-arguments job finished")
    entries = [e for e in list_entries(engine, task_name=failure_echo.name)
               if e.task_id == result.id]
    assert result.state == "FAILURE"
    assert len(entries) == 1
    assert entries[0].guard == "intake" and "do not fit" in entries[0].reason
    assert entries[0].args == [tag, "extra", "more"]
