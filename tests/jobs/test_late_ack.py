"""A late acknowledgement from a stalled worker must not remove the hold of the worker that
took the message over (issue 25, "nothing lost").

kombu's Redis transport puts an expired unacknowledged message back in its queue with the
same delivery tag. Worker `a` takes message M (tag T) and stalls past the visibility
timeout; M goes back to the queue and worker `b` takes it. If `b`'s hold were recorded under
T again, `a`'s acknowledgement on resuming (HDEL/ZREM T) would remove `b`'s hold, and `b`
killed before its own acknowledgement would leave M nowhere: not queued, not held.

Two real workers on a broker of their own (a private Redis, so the suite's tier workers
never take M). The platform accepts no visibility timeout below the hard time limit plus
30 s, so the test stands in for the transport's periodic sweep: it runs kombu's own
`restore_visible` with a zero timeout at the two moments a sweep would find the hold
expired (while `a` is stopped, and after `b` is killed). What is asserted is the job's body
runs, recorded in the guard Redis.
"""

from __future__ import annotations

import base64
import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import Worker, wait_for
from tests.jobs.tasks_late_ack import release_key, runs_key

TASK = "tests.jobs.tasks_late_ack.held_job"


class Broker:
    """The workers' own broker: a database of a private Redis."""

    def __init__(self, app: Any, url: str) -> None:
        import redis

        self.app = app
        self.url = url
        self.client = redis.Redis.from_url(url)

    def connection(self) -> Any:
        return self.app.connection_for_write(self.url)

    def publish(self, run_id: str) -> None:
        with self.connection() as connection:
            self.app.send_task(TASK, args=[run_id], queue="critical", routing_key="critical",
                               connection=connection)

    def sweep(self) -> None:
        """kombu's visibility restore with a zero timeout: every held message goes back to
        its queue, as the workers' own sweep does once a hold is older than the timeout."""
        with self.connection() as connection:
            channel = connection.default_channel
            channel.visibility_timeout = 0
            channel.qos.restore_visible(num=10_000, interval=1)

    def holds(self) -> dict[str, Any]:
        """The unacknowledged messages: delivery tag -> hold."""
        return {tag.decode(): value for tag, value in self.client.hgetall("unacked").items()}

    def state(self) -> str:
        queued = sum(self.client.llen(key) for key in self.client.keys("critical*"))
        return f"queued={queued} held={sorted(self.holds())}"

    def waiting(self) -> int:
        """How many connections wait on a queue list (an idle worker keeps one per list it
        watches: 4 for the critical queue's priority steps)."""
        return sum(1 for client in self.client.client_list() if client.get("cmd") == "blmove")

    @contextlib.contextmanager
    def events(self) -> Iterator[Any]:
        """Subscribe to the workers' task events (kombu's fanout: Redis pub/sub); yields a
        function returning the events received so far."""
        received: list[dict[str, Any]] = []
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        pubsub.psubscribe("*celeryev*")

        def poll() -> list[dict[str, Any]]:
            while (message := pubsub.get_message(timeout=0.01)) is not None:
                payload = json.loads(message["data"])
                body = payload["body"]
                if payload["properties"].get("body_encoding") == "base64":
                    body = base64.b64decode(body)
                event = json.loads(body)  # one event, or a list of buffered ones
                received.extend(event if isinstance(event, list) else [event])
            return received

        try:
            yield poll
        finally:
            pubsub.close()


@pytest.fixture()
def late_ack_pair(app: Any, tmp_path: Path) -> Iterator[tuple[Broker, list[Worker]]]:
    """Two one-process workers of the critical tier on a private broker, both consuming."""
    from jobs.embedded import embedded_redis, free_port

    server = embedded_redis(free_port(), tmp_path / "redis")
    server.start()
    broker = Broker(app, f"{server.url.rsplit('/', 1)[0]}/0")
    workers = [Worker("critical", name=f"late-ack-{label}", concurrency=1,
                      env={"BROKER_URL": broker.url}) for label in ("one", "two")]
    try:
        for worker in workers:
            worker.start(wait=False)
        wait_for(lambda: _consuming(broker, workers), timeout_seconds=60, interval=0.2,
                 message="both workers waiting on the critical queue")
        yield broker, workers
    finally:
        for worker in workers:  # a held job would make a warm shutdown wait for it
            worker.sigkill()
            worker.stop()
        server.stop()


def _consuming(broker: Broker, workers: list[Worker]) -> bool:
    for worker in workers:
        if not worker.alive():
            raise RuntimeError(f"worker {worker.nodename} exited:\n{worker.log_tail()}")
    return broker.waiting() >= 4 * len(workers)


class TestLateAcknowledgement:
    def test_a_stalled_workers_late_ack_leaves_the_new_holders_hold(
        self, late_ack_pair: tuple[Broker, list[Worker]], redis_client: Any
    ) -> None:
        """`a` holds M, is stopped, M is restored and `b` takes it; `a` resumes, finishes
        and acknowledges; `b` is SIGKILLed still holding M. M is still held (by `b`'s dead
        delivery), so the next sweep puts it back and `a` runs it a third time."""
        broker, workers = late_ack_pair
        run_id = uuid.uuid4().hex

        def runs(event: str | None = None) -> list[dict[str, Any]]:
            found = [json.loads(item) for item in redis_client.lrange(runs_key(run_id), 0, -1)]
            return [run for run in found if event is None or run["event"] == event]

        broker.publish(run_id)
        wait_for(lambda: runs("start"), timeout_seconds=15, message="the first run")
        by_name = {worker.nodename: worker for worker in workers}
        a = by_name[runs("start")[0]["hostname"]]
        (b,) = (worker for worker in workers if worker is not a)
        (first_tag,) = broker.holds()

        a.sigstop()
        broker.sweep()  # a's hold has expired
        wait_for(lambda: len(runs("start")) == 2, timeout_seconds=15,
                 message=f"b taking the restored message ({broker.state()})")
        assert runs("start")[1]["hostname"] == b.nodename
        assert runs("start")[1]["redelivered"] is True

        with broker.events() as events:
            a.sigcont()
            redis_client.set(release_key(run_id, a.nodename), 1)
            # Celery acknowledges (acks_late) in the call that then sends task-succeeded.
            wait_for(lambda: [event for event in events() if event["type"] == "task-succeeded"
                              and event["hostname"] == a.nodename],
                     timeout_seconds=15, message="a finishing and acknowledging")
        assert first_tag not in broker.holds(), "a's own hold outlived its acknowledgement"

        b.sigkill()
        assert broker.holds(), f"b's hold was removed by a's late acknowledgement: M is lost " \
                               f"({broker.state()})"
        broker.sweep()  # b's hold has expired
        wait_for(lambda: len(runs("done")) == 2, timeout_seconds=15,
                 message=f"M delivered again after b was killed ({broker.state()})")
        starts = [run["hostname"] for run in runs("start")]
        assert starts == [a.nodename, b.nodename, a.nodename]
        wait_for(lambda: not broker.holds(), timeout_seconds=10, message="the last run acked")
