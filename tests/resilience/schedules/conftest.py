"""Fixtures of the schedules tests: the executions table, a tag per test, the schedules a
test adds (removed after it), an outbox relay thread and real `celery beat` processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from tests.harness import ARTIFACTS, ROOT

SCHEDULER = "resilience.schedules.scheduler:Scheduler"


@pytest.fixture()
def schedule_tables(stores: Any) -> None:
    # Imported here: this conftest loads before the session's services exist.
    from tests.resilience.schedules.tasks_schedules import CREATE_TABLE

    with stores.engine().begin() as connection:
        connection.execute(text(CREATE_TABLE))


@pytest.fixture()
def tag(stores: Any, schedule_tables: None) -> Iterator[str]:
    """A fresh prefix per test; the schedules named with it are removed after the test."""
    value = f"t{uuid.uuid4().hex[:10]}"
    yield value
    with stores.engine().begin() as connection:
        connection.execute(text("DELETE FROM resilience_schedules WHERE name LIKE :prefix"),
                           {"prefix": f"{value}%"})


@pytest.fixture()
def relay(app: Any) -> Iterator[Any]:
    """`jobs outbox relay`'s loop in a thread: it publishes what a killed beat committed
    but did not publish itself."""
    from resilience.outbox import Relay, RelayConfig

    relay = Relay(app, RelayConfig(poll_seconds=0.2, backoff_initial_seconds=0.05,
                                   backoff_max_seconds=0.5))
    stopping = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stopping.is_set,), daemon=True,
                              name="schedules-test-relay")
    thread.start()
    yield relay
    stopping.set()
    thread.join(10)
    relay.backend.close()


class Beat:
    """One `celery -A jobs beat -S resilience.schedules.scheduler:Scheduler` process."""

    def __init__(self, name: str, env: dict[str, str]) -> None:
        self.name = name
        self.log_path = ARTIFACTS / "beat" / f"{name}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "celery", "-A", "jobs", "beat", "-S", SCHEDULER,
                   "--loglevel", "INFO"]
        environment = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
        environment.pop("PYTEST_CURRENT_TEST", None)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)

    @property
    def pid(self) -> int:
        return self.process.pid

    def signal(self, signum: int) -> None:
        os.killpg(self.process.pid, signum)

    def kill(self) -> None:
        """SIGKILL, and wait for it to be gone."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)


@pytest.fixture()
def beats(tmp_path: Path) -> Iterator[Any]:
    """Start beat processes (`beats("name")`); all are killed after the test."""
    started: list[Beat] = []
    env = {"RESILIENCE_BEAT_SCHEDULE": "tests.resilience.schedules.beat_schedule_fixture",
           "RESILIENCE_BEAT_POLL_SECONDS": "0.2"}

    def start(name: str) -> Beat:
        beat = Beat(f"{name}-{uuid.uuid4().hex[:6]}", env)
        started.append(beat)
        return beat

    yield start
    for beat in started:
        beat.kill()
