"""Chaos: transactional transfers with duplicates while worker processes are SIGKILLed.

Invariant: every transfer key's effect (one debit row, one credit row) appears exactly once,
the ledger balances, every account ends at its expected balance, and every key succeeded.
The ledger table has no unique constraint on the key, so a double effect would show.
"""

from __future__ import annotations

import collections
import json
import os
import random
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import text

from tests.chaos import chaos_loop, restore_unacked, supervise
from tests.resilience.idempotency import tasks

#: `make test` runs 1,500 (the chaos loop kills a worker child every few hundred ms, so the
#: backlog outlasts it); `python -m bench chaos` sets CHAOS_TRANSFERS=2000 (the soak).
TRANSFERS = int(os.environ.get("CHAOS_TRANSFERS", "1500"))
DUPLICATE_FRACTION = 0.35
ACCOUNTS = 10
#: Seconds of SIGKILLs (make test); `python -m bench chaos` sets CHAOS_SECONDS=45.
CHAOS_SECONDS = int(os.environ.get("CHAOS_SECONDS", "20"))
MAX_WHOLE_WORKER_KILLS = 2

#: Short limits so a whole-worker SIGKILL's unacked messages come back within the test:
#: visibility must be >= max(hard time limit, max countdown) + 30 (the Settings rule).
WORKER_ENV = {
    **{
        f"JOBS_{tier}__SOFT_TIME_LIMIT_SECONDS": "8"
        for tier in ("CRITICAL", "STANDARD", "OPTIONAL")
    },
    **{
        f"JOBS_{tier}__HARD_TIME_LIMIT_SECONDS": "10"
        for tier in ("CRITICAL", "STANDARD", "OPTIONAL")
    },
    "JOBS_MAX_COUNTDOWN_SECONDS": "5",
    "JOBS_VISIBILITY_TIMEOUT_SECONDS": "45",
}


def succeeded_keys(engine: Any, prefix: str) -> int:
    with engine.connect() as connection:
        return int(
            connection.execute(
                text(
                    "SELECT count(*) FROM resilience_idempotency_records WHERE task_name = :t "
                    "AND key LIKE :p AND state = 'succeeded'"
                ),
                {"t": tasks.idem_transfer.name, "p": prefix + "%"},
            ).scalar_one()
        )


def unfinished(engine: Any, prefix: str, transfers: dict[str, Any]) -> list[Any]:
    """The records (or missing keys) of transfers that did not succeed, for the message."""
    with engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT key, state, attempt, task_id, error FROM resilience_idempotency_records "
                "WHERE task_name = :t AND key LIKE :p"
            ),
            {"t": tasks.idem_transfer.name, "p": prefix + "%"},
        ).all()
    found = {row.key: tuple(row) for row in rows}
    missing = [(key, "no record") for key in transfers if key not in found]
    return [row for row in found.values() if row[1] != "succeeded"] + missing


def whereabouts(app: Any, engine: Any, lost: list[Any]) -> list[str]:
    """Where each lost transfer's messages are, for the failure message: its dead letters,
    the broker lists holding a copy, its copies in the unacknowledged hash, and the worker
    log lines of the task that claimed it (a lost job is a bug to find, not a count)."""
    from tests.harness import ARTIFACTS

    def text_of(item: Any) -> str:
        return item.decode(errors="replace") if isinstance(item, bytes) else str(item)

    lines = []
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        broker = channel.client
        # Every list, not only the tier queue's: a restore kombu cannot route goes to its
        # dead-letter list (`ae.undeliver`).
        queued = [(text_of(name), text_of(item)) for name in broker.scan_iter()
                  if text_of(broker.type(name)) == "list" for item in broker.lrange(name, 0, -1)]
        unacked = [text_of(value) for value in broker.hvals(channel.unacked_key)]
        # The restore sweep's lock: one a worker SIGKILLed mid-sweep left behind stops every
        # restore (the test's too) until it expires (jobs.platform.restore_sweep).
        mutex_ttl = broker.ttl(channel.unacked_mutex_key)
    for row in lost[:3]:
        key, claimer = row[0], row[3] if len(row) > 3 else None
        with engine.connect() as connection:
            letters = connection.execute(
                text("SELECT task_id, guard, reason, attempts FROM resilience_dead_letters "
                     "WHERE args->>0 = :k"), {"k": key}).all()
        logged = []
        if claimer:
            for path in sorted((ARTIFACTS / "workers").glob("chaos*.log")):
                logged += [f"{path.name}: {line.strip()[:300]}"
                           for line in path.read_text(errors="replace").splitlines()
                           if claimer in line]
        lines.append(
            f"{key}: dead letters {[tuple(letter) for letter in letters]}, "
            f"queued {[name for name, item in queued if key in item]}, "
            f"{sum(key in item for item in unacked)} unacked; "
            f"the claimer's log lines: {logged[-8:]}")
    lines.append(f"the unacked restore lock's TTL: {mutex_ttl} s")
    return lines


@pytest.mark.chaos
@pytest.mark.timeout(900)
def test_transfers_have_exactly_one_effect_under_sigkill(
    app: Any,
    worker_factory: Callable[..., Any],
    engine: Any,
    redis_client: Any,
    purge_queues: None,
) -> None:
    """1,500 transfers (2,000 in the soak), duplicates injected, SIGKILLs every few hundred ms:
    effect once each."""
    rng = random.Random(4)
    run = uuid.uuid4().hex[:8]
    prefix = f"chaos-{run}-"
    accounts = [f"acct-{run}-{index}" for index in range(ACCOUNTS)]
    transfers = {}
    for index in range(TRANSFERS):
        source, target = rng.sample(accounts, 2)
        transfers[f"{prefix}{index}"] = (source, target, rng.randint(1, 1000))
    messages = []
    for key, (source, target, amount) in transfers.items():
        copies = rng.choice((2, 3)) if rng.random() < DUPLICATE_FRACTION else 1
        messages.extend([(key, source, target, amount)] * copies)
    rng.shuffle(messages)

    # Enqueue everything before any worker runs, so the whole backlog is drained under chaos
    # (a fast machine would otherwise finish most of it while the producer is still sending).
    enqueue_started = time.monotonic()
    for key, source, target, amount in messages:
        tasks.idem_transfer.delay(key, source, target, amount, pause_seconds=0.01)
    print(f"enqueued {len(messages)} in {time.monotonic() - enqueue_started:.1f}s")
    workers = [
        worker_factory("critical", name=f"chaos{index}", concurrency=2, env=WORKER_ENV, wait=False)
        for index in range(2)
    ]
    for worker in workers:
        worker.wait_ready()

    started = time.monotonic()
    kills, last_worker_kill = chaos_loop(
        workers, rng, seconds=CHAOS_SECONDS, max_worker_kills=MAX_WHOLE_WORKER_KILLS,
        done=lambda: succeeded_keys(engine, prefix) == TRANSFERS)

    # No job lost: every key succeeds, including messages a killed worker held unacked
    # (back after the visibility timeout). No producer re-drives anything: the platform's
    # Redis transport takes a message and records it as unacked in one script
    # (jobs.broker, reliable fetch), so a SIGKILL at any instant leaves each message in the
    # queue or in the unacked hash.
    print(
        f"chaos ended at {time.monotonic() - started:.1f}s: "
        f"{succeeded_keys(engine, prefix)} done, kills={kills}"
    )
    visibility = int(WORKER_ENV["JOBS_VISIBILITY_TIMEOUT_SECONDS"])
    # Past the deadline, wait on only while keys keep succeeding: a loaded machine drains
    # slowly, and a slow drain is not a lost job (a lost one never succeeds).
    deadline = last_worker_kill + visibility + 80
    done, last_progress = succeeded_keys(engine, prefix), time.monotonic()
    while done < TRANSFERS:
        now = time.monotonic()
        if now >= deadline and now - last_progress > visibility:
            break
        kills["exited"] += supervise(workers)
        restore_unacked(app, int(WORKER_ENV["JOBS_VISIBILITY_TIMEOUT_SECONDS"]))
        time.sleep(0.5)
        latest = succeeded_keys(engine, prefix)
        if latest > done:
            done, last_progress = latest, time.monotonic()
    lost = unfinished(engine, prefix, transfers)

    with engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT transfer_key, account, amount_cents FROM idempotency_demo_entries "
                "WHERE transfer_key LIKE :p"
            ),
            {"p": prefix + "%"},
        ).all()
    effects: dict[str, list[tuple[str, int]]] = collections.defaultdict(list)
    for key, account, amount in rows:
        effects[key].append((account, int(amount)))
    doubled = {key: rows for key, rows in effects.items() if len(rows) != 2}
    # One line per run for `python -m bench chaos`, which runs this test many times.
    print("chaos-tally " + json.dumps({"transfers": TRANSFERS, "lost": len(lost),
                                        "doubled": len(doubled), **kills}))
    assert not lost, (f"{len(lost)} transfers never ran: {lost[:5]}; kills={kills}\n"
                      + "\n".join(whereabouts(app, engine, lost)))
    assert not doubled, f"{len(doubled)} keys without exactly one effect, e.g. {list(doubled)[:3]}"
    assert set(effects) == set(transfers)
    for key, (source, target, amount) in transfers.items():
        assert sorted(effects[key]) == sorted([(source, -amount), (target, amount)]), key
    assert sum(amount for _, _, amount in rows) == 0
    expected: dict[str, int] = collections.Counter()
    for source, target, amount in transfers.values():
        expected[source] -= amount
        expected[target] += amount
    balances: dict[str, int] = collections.Counter()
    for _, account, amount in rows:
        balances[account] += int(amount)
    assert balances == expected
    assert kills["child"] > 10, f"too little chaos: {kills}"
    print(
        f"chaos: {len(messages)} messages, {TRANSFERS} keys, kills={kills}, "
        f"{time.monotonic() - started:.1f}s"
    )
