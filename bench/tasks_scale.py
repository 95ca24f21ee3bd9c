"""Bench tasks of the scale scenario: `charge_payment`'s guard stack without the vendor call,
and the client-side PostgreSQL statement counter the scenario reads.

`scale_bench_payment` carries the decorators of `jobs.examples.charge_payment` with a rate
limit that never throttles, and writes the ledger row as the example does. Its result is
ignored: the result backend is Celery's, and would otherwise be counted in the guard Redis.

With `BENCH_PG_STATEMENTS_DIR` set in a worker's environment (other scenarios' workers are
untouched), every psycopg2 connection of the process counts the queries it sends (one query
string is one round trip, even `SET LOCAL ...; EXECUTE ...`): each execute, the `BEGIN`
psycopg2 sends itself, each `COMMIT`/`ROLLBACK` of an open transaction. After every task
the process writes its totals to `<dir>/<pid>.json`, which the scenario sums.
"""

from __future__ import annotations

import functools
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg2
from celery import signals
from psycopg2 import extensions
from sqlalchemy.orm import Session

from jobs import app
from jobs.examples import PAYMENTS_VENDOR
from jobs.models import LedgerEntry
from resilience.circuit import circuit_breaker
from resilience.idempotency import idempotent
from resilience.ratelimit import rate_limit
from resilience.retry import RetryBudget, retry_policy, wait_full_jitter

#: Where worker processes write their statement counts (unset: no counting).
STATEMENTS_DIR_ENV = "BENCH_PG_STATEMENTS_DIR"

IDLE = extensions.TRANSACTION_STATUS_IDLE

_statements: Counter[str] = Counter()
_bodies = 0


@app.task(tier="critical", bind=True, name="bench.scale.payment", ignore_result=True)
@idempotent(key="charge:{order_id}", transactional=True)
@circuit_breaker(PAYMENTS_VENDOR, failure_rate_threshold=0.5, slow_call_rate_threshold=0.5,
                 slow_call_seconds=1.5, window=20, minimum_calls=5, open_seconds=10,
                 half_open_probes=2)
@rate_limit(PAYMENTS_VENDOR, "1000000/second", burst=100_000)
@retry_policy(max_attempts=4, backoff=wait_full_jitter(base=0.5, cap=10),
              dependency=PAYMENTS_VENDOR, budget=RetryBudget(ratio=0.2))
def scale_bench_payment(
    self: Any,
    order_id: str,
    account: str,
    amount_cents: int,
    currency: str = "EUR",
    session: Session | None = None,
) -> dict[str, Any]:
    """`charge_payment` without the vendor: one ledger row in the record's transaction."""
    global _bodies
    if session is None:
        raise RuntimeError("scale_bench_payment runs under @idempotent(transactional=True)")
    entry = LedgerEntry(order_id=order_id, account=account, amount_cents=amount_cents,
                        currency=currency.upper(), task_id=self.request.id)
    session.add(entry)
    session.flush()
    _bodies += 1
    return {"entry_id": entry.id, "order_id": order_id, "amount_cents": amount_cents}


def _kind(sql: Any) -> str:
    """A query's label for the breakdown: the first words of each statement it holds
    (`INSERT INTO ledger_entries`, `SET LOCAL; EXECUTE resilience_idempotency_claim`)."""
    text = sql.decode(errors="replace") if isinstance(sql, bytes) else str(sql)
    labels = []
    for part in text.split(";"):
        words = part.replace("(", " ").split()
        if words:
            take = 3 if words[0].upper() in ("INSERT", "DELETE") else 2
            labels.append(" ".join([words[0].upper(), *words[1:take]]))
    return "; ".join(labels)[:80] or "?"


def _count(connection: Any, label: str) -> None:
    # psycopg2 sends BEGIN itself before a transaction's first statement.
    if not connection.autocommit and connection.info.transaction_status == IDLE:
        _statements["BEGIN (implicit)"] += 1
    _statements[label] += 1


@functools.cache
def _counting(base: type) -> type:
    """`base` (a cursor class) counting what it sends."""

    class Counting(base):  # type: ignore[valid-type, misc]
        def execute(self, query: Any, vars: Any = None) -> Any:
            _count(self.connection, _kind(query))
            return super().execute(query, vars)

        def executemany(self, query: Any, vars_list: Any) -> Any:
            _count(self.connection, _kind(query) + " (executemany)")
            return super().executemany(query, vars_list)

    return Counting


class CountingConnection(extensions.connection):
    """A connection whose cursors count their statements, and which counts its commits."""

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        base = kwargs.get("cursor_factory") or self.cursor_factory or extensions.cursor
        return super().cursor(*args, **{**kwargs, "cursor_factory": _counting(base)})

    def commit(self) -> None:
        if self.info.transaction_status != IDLE:
            _statements["COMMIT"] += 1
        super().commit()

    def rollback(self) -> None:
        if self.info.transaction_status != IDLE:
            _statements["ROLLBACK"] += 1
        super().rollback()


def _install_counter() -> None:
    """Wrap `psycopg2.connect` so every connection of this process counts its statements."""
    original = psycopg2.connect

    def connect(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("connection_factory", CountingConnection)
        _statements["(connections opened)"] += 1
        return original(*args, **kwargs)

    psycopg2.connect = connect


def _write_counts(**_: Any) -> None:
    directory = os.environ.get(STATEMENTS_DIR_ENV)
    if not directory:
        return
    path = Path(directory) / f"{os.getpid()}.json"
    scratch = path.with_suffix(".tmp")
    scratch.write_text(json.dumps({"pid": os.getpid(), "bodies": _bodies,
                                   "statements": dict(_statements)}))
    scratch.replace(path)


def _reset_after_fork(**_: Any) -> None:
    """A pool process starts from zero, not from its parent's counts."""
    global _bodies
    _statements.clear()
    _bodies = 0
    _write_counts()


if os.environ.get(STATEMENTS_DIR_ENV):
    _install_counter()
    signals.task_postrun.connect(_write_counts, weak=False)
    signals.worker_process_init.connect(_reset_after_fork, weak=False)
