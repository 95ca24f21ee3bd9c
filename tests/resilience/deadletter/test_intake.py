"""The worker's intake: malformed messages published raw into a tier queue end as dead
letters with their reason; the worker's main process never exits; a good job still runs."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from resilience.deadletter.intake import UNKNOWN_TASK, MalformedBody, check_body
from resilience.deadletter.place import DeadLetterNotRunnable, list_entries, requeue
from tests.support import Worker, wait_for

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
def test_a_row_postgres_refuses_is_recorded_cut_down(
    app: Any, engine: Any, worker_factory: Any, purge_queues: None
) -> None:
    """A message naming an unregistered task with a NUL in its name: PostgreSQL cannot
    store that text, so the row is written cut down (printable names, the whole message in
    base64, not runnable) at once, instead of the message waiting unacknowledged forever."""
    import base64

    worker_factory(QUEUE, name="intake-refused", concurrency=1)
    tag = uuid.uuid4().hex
    _publish(app, json.dumps([[tag], {}, {}]),
             headers=_headers(f"no.such.task.{tag}\x00nul", tag))

    def ours() -> list[Any]:
        return [e for e in list_entries(engine, limit=200) if e.guard == "intake"
                and tag in e.task_name]

    entries = wait_for(ours, timeout_seconds=30, message="the refused row recorded cut down")
    assert len(entries) == 1
    entry = entries[0]
    assert entry.task_name == f"no.such.task.{tag}\\x00nul"
    assert "recorded cut down" in entry.reason
    assert entry.raw_message["runnable"] is False
    whole = json.loads(base64.b64decode(entry.raw_message["message_base64"]))
    assert whole["headers"]["test_tag"] == tag and tag in whole["body"]
    with pytest.raises(DeadLetterNotRunnable):
        requeue(engine, app, entry.id)


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


def _waiting(app: Any, queue: str) -> int:
    """Messages still in the tier queue's broker list (not yet taken by a worker)."""
    with app.connection_for_write() as connection:
        return int(connection.default_channel.client.llen(queue))


class PostgresOutage:
    """A `-c 2` standard worker of its own (the shared one stopped) reaching PostgreSQL
    through a TCP proxy the tests kill and restart (connections refused while it is down),
    parking an unrecordable message for 2 s before giving it back."""

    def __init__(self, services: Any, shared: Any, folder: Any) -> None:
        from sqlalchemy import make_url

        from jobs.embedded import free_port
        from tests.resilience.compose.proxy import Proxy
        from tests.resilience.deadletter.tasks import PARK_SECONDS_VARIABLE

        database = make_url(services.database_url)
        self.proxy = Proxy(free_port(), database.host or "127.0.0.1", database.port or 5432,
                           folder / "postgres-proxy.log")
        url = database.set(port=self.proxy.listen_port).render_as_string(hide_password=False)
        self.shared = shared
        self.worker = Worker(QUEUE, name="intake-outage", concurrency=2,
                             env={"DATABASE_URL": url, PARK_SECONDS_VARIABLE: "2"})

    def start(self) -> None:
        self.proxy.up()
        self.shared.stop()  # only this worker, behind the proxy, takes standard jobs
        self.worker.start()

    def stop(self) -> None:
        self.worker.stop()
        self.proxy.down()
        self.shared.start()


@pytest.fixture(scope="module")
def outage(services: Any, tier_workers: Any,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresOutage]:
    running = PostgresOutage(services, tier_workers[QUEUE], tmp_path_factory.mktemp("pg"))
    try:
        running.start()
        yield running
    finally:
        running.stop()


def _intake_rows(engine: Any, tag: str) -> list[Any]:
    return [e for e in list_entries(engine, limit=200) if e.guard == "intake"
            and tag in json.dumps(e.raw_message)]


@pytest.mark.chaos
@pytest.mark.timeout(240)
def test_bad_messages_during_a_postgres_outage_never_wedge_the_worker(
    app: Any, engine: Any, purge_queues: None, outage: PostgresOutage
) -> None:
    """A `-c 2` worker whose PostgreSQL is unreachable (its proxy killed) takes two
    malformed messages (a body that is not a call, a task nobody registers): their
    dead-letter rows cannot be written, so they are parked, not held in the two prefetch
    slots. PostgreSQL comes back; 10 good jobs all run within 30 s, and both bad messages
    end as dead-letter rows, each once: nothing lost, nothing doubled."""
    from tests.resilience.deadletter.tasks import failure_echo

    outage.proxy.down()
    tag = uuid.uuid4().hex
    _publish(app, json.dumps([[tag], [1], {}]), headers=_headers(failure_echo.name, tag))
    _publish(app, json.dumps([[tag], {}, {}]), headers=_headers(f"no.such.task.{tag}", tag))
    wait_for(lambda: _waiting(app, QUEUE) == 0, timeout_seconds=30,
             message="both bad messages taken by the worker")
    time.sleep(2.0)  # their first writes and a retry fail while PostgreSQL is away
    outage.proxy.up()
    started = time.monotonic()
    good = [failure_echo.delay(n) for n in range(10)]
    ran = [result.get(timeout=max(0.5, 30 - (time.monotonic() - started)))
           for result in good]
    assert sorted(ran) == list(range(10))
    print(f"10 good jobs ran {time.monotonic() - started:.1f} s after PostgreSQL came back")
    wait_for(lambda: len(_intake_rows(engine, tag)) >= 2, timeout_seconds=60,
             message="both parked messages dead-lettered")
    print(f"both bad messages dead-lettered {time.monotonic() - started:.1f} s after "
          "PostgreSQL came back")
    time.sleep(1.0)
    entries = _intake_rows(engine, tag)
    assert len(entries) == 2
    assert sorted("malformed" in e.reason for e in entries) == [False, True]
    assert any("not registered" in e.reason for e in entries)
    assert outage.worker.alive()
    assert _waiting(app, QUEUE) == 0


@pytest.mark.chaos
@pytest.mark.timeout(240)
def test_a_message_parked_too_long_goes_back_and_is_recorded_once(
    app: Any, engine: Any, redis_client: Any, purge_queues: None, outage: PostgresOutage
) -> None:
    """PostgreSQL stays unreachable longer than the park window (2 s here): the parked
    message (a pickle body, which the worker refuses) goes back to its queue and is parked
    again, round after round (each park counted DEFERRED), while good jobs keep running;
    once PostgreSQL is back it is dead-lettered exactly once."""
    from resilience.counters import read_all
    from tests.resilience.deadletter.tasks import failure_echo

    outage.proxy.down()
    tag = uuid.uuid4().hex
    # A content type the worker refuses (pickle): Celery's on_invalid_task path.
    _publish(app, json.dumps([[tag], {}, {}]), headers=_headers(failure_echo.name, tag),
             content_type="application/x-python-serialize")

    def parks() -> int:
        return sum(value for labels, value in read_all(redis_client)
                   if labels.get("outcome") == "DEFERRED" and labels.get("guard") == "intake")

    wait_for(lambda: parks() >= 2, timeout_seconds=40,
             message="the message parked, given back and parked again")
    assert [r.get(timeout=30) for r in [failure_echo.delay(n) for n in range(3)]] == [0, 1, 2]
    assert _intake_rows(engine, tag) == []
    outage.proxy.up()
    wait_for(lambda: _intake_rows(engine, tag), timeout_seconds=60,
             message="the parked message dead-lettered")
    time.sleep(2.0)  # a second copy, had there been one, would be recorded by now
    entries = _intake_rows(engine, tag)
    assert len(entries) == 1
    assert "ContentDisallowed" in entries[0].reason
    assert _waiting(app, QUEUE) == 0
