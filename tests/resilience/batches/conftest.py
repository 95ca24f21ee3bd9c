"""Fixtures of the batch tests: the ledgers, a run id, and an outbox relay thread."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture()
def run(engine: Any) -> str:
    """A fresh run id; the test ledgers exist."""
    from tests.resilience.batches import tasks

    with engine.begin() as connection:
        for statement in tasks.CREATE_LEDGERS:
            connection.execute(statement)
    return uuid.uuid4().hex[:10]


@pytest.fixture()
def relay(app: Any) -> Iterator[Any]:
    """`jobs outbox relay`'s loop in a thread of the test process (members and callbacks
    reach the broker through it), stopped after the test."""
    from resilience.outbox import Relay, RelayConfig

    relay = Relay(app, RelayConfig(poll_seconds=0.2, backoff_initial_seconds=0.05,
                                   backoff_max_seconds=0.5))
    stopping = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stopping.is_set,), daemon=True,
                              name="batch-test-relay")
    thread.start()
    yield relay
    stopping.set()
    thread.join(10)
    relay.backend.close()
