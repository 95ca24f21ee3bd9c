"""Fixtures of the workflow tests: the ledger, a run id, and an outbox relay thread."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture()
def run(engine: Any) -> str:
    """A fresh run id; the test ledger exists."""
    from tests.resilience.workflows import tasks_workflows

    with engine.begin() as connection:
        connection.execute(tasks_workflows.CREATE_LEDGER)
        connection.execute(tasks_workflows.CREATE_SWITCHES)
    return uuid.uuid4().hex[:10]


@pytest.fixture()
def relay(app: Any) -> Iterator[Any]:
    """`jobs outbox relay`'s loop in a thread of the test process (operator actions and
    crash leftovers reach the broker through it), stopped after the test."""
    from resilience.outbox import Relay, RelayConfig

    relay = Relay(app, RelayConfig(poll_seconds=0.2, backoff_initial_seconds=0.05,
                                   backoff_max_seconds=0.5))
    stopping = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stopping.is_set,), daemon=True,
                              name="workflow-test-relay")
    thread.start()
    yield relay
    stopping.set()
    thread.join(10)
    relay.backend.close()
