"""Chaos: jobs enqueued in transactions (a third rolled back) while the relay is SIGKILLed.

Invariant: exactly the jobs of committed transactions take effect, each once. The relay is
killed every 0.1-0.3 s, often between publishing a batch and committing its marks, so rows
are published twice; `@idempotent` (keyed on the outbox row) absorbs the second copies. The
ledger has no unique constraint, so a double effect would show.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from resilience.counters import read_all
from resilience.outbox import Relay, RelayConfig, describe
from tests.resilience.outbox import tasks
from tests.resilience.outbox.relays import effects, outbox_rows
from tests.support import ARTIFACTS, ROOT, wait_for

PER_TRANSACTION = 4
ROLLBACK_FRACTION = 1 / 3
#: (jobs, seconds the producer spreads them over): `make test` runs the small one, `make
#: stress` (the soak marker) the issue's 1,000.
SIZES = [pytest.param(400, 6.0, id="400"),
         pytest.param(1000, 15.0, id="1000", marks=pytest.mark.soak)]


def outcomes(redis_client: Any, task_name: str) -> Counter[str]:
    found: Counter[str] = Counter()
    for labels, value in read_all(redis_client):
        if labels.get("name") == task_name and labels.get("guard") == "idempotency":
            found[labels["outcome"]] += value
    return found


@pytest.mark.chaos
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("jobs", "producer_seconds"), SIZES)
def test_committed_jobs_take_effect_once_while_the_relay_is_killed(
    app: Any, engine: Any, stores: Any, worker_factory: Callable[..., Any], redis_client: Any,
    tmp_path: Path, jobs: int, producer_seconds: float,
) -> None:
    """Jobs in transactions (400 in make test, 1,000 in make stress), a third rolled back,
    relay SIGKILLed every ~200 ms: the committed jobs take effect exactly once each, the
    rolled-back ones never."""
    started = time.monotonic()
    run = uuid.uuid4().hex[:10]
    with engine.begin() as connection:
        connection.execute(tasks.CREATE_LEDGER)
        connection.execute(text("DELETE FROM resilience_outbox"))
    worker = worker_factory("critical", name="outboxchaos", concurrency=2, wait=False)
    stop_file = tmp_path / "stop"
    log_path = ARTIFACTS / "outbox" / f"chaos-relays-{run}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        supervisor = subprocess.Popen(
            [sys.executable, "-m", "tests.resilience.outbox.chaos_relay",
             "--stop-file", str(stop_file)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True,
        )
    committed: list[str] = []
    rolled_back: list[str] = []
    rng = random.Random(11)

    def produce() -> None:
        pause = producer_seconds / (jobs / PER_TRANSACTION)
        for batch in range(jobs // PER_TRANSACTION):
            with Session(engine) as session:
                session.begin()
                ids = [tasks.outbox_effect.enqueue_in(session, run,
                                                      batch * PER_TRANSACTION + i).id
                       for i in range(PER_TRANSACTION)]
                if rng.random() < ROLLBACK_FRACTION:
                    session.rollback()
                    rolled_back.extend(ids)
                else:
                    session.commit()
                    committed.extend(ids)
            time.sleep(pause)

    try:
        worker.wait_ready()
        producer = threading.Thread(target=produce)
        producer.start()
        producer.join(timeout=60)
        assert not producer.is_alive()
        # Chaos goes on until the relays (killed as they go) have published everything.
        wait_for(lambda: describe(stores).pending == 0, timeout_seconds=40, interval=0.2,
                 message="the killed relays to publish every committed row")
    finally:
        stop_file.touch()
        output, _ = supervisor.communicate(timeout=30)
    kills = json.loads(output.strip().splitlines()[-1])["kills"]
    # Whatever the last kill left (rows published but not marked) a final relay publishes.
    relay = Relay(app, RelayConfig())
    while describe(stores).pending:
        relay.relay_once()
    wait_for(lambda: len(effects(engine, run)) >= len(committed), timeout_seconds=60,
             message=f"{len(committed)} effects")
    time.sleep(2.0)  # duplicates still in flight would land now

    found = effects(engine, run)
    per_job = Counter(row.task_id for row in found)
    doubled = {task_id: n for task_id, n in per_job.items() if n > 1}
    counted = outcomes(redis_client, tasks.outbox_effect.name)
    print(f"outbox chaos: {len(committed)} committed, {len(rolled_back)} rolled back, "
          f"{kills} relay kills, idempotency outcomes {dict(counted)}, "
          f"{time.monotonic() - started:.1f}s")
    assert not doubled, f"{len(doubled)} jobs took effect more than once"
    assert per_job == Counter(committed)
    assert not set(rolled_back) & set(per_job)
    assert outbox_rows(engine, rolled_back) == []
    assert len(rolled_back) >= jobs / 5 and kills >= 2 * producer_seconds, (len(rolled_back),
                                                                             kills)
