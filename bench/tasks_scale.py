"""Bench tasks of the scale scenario: `charge_payment`'s guard stack without the vendor call,
and the client-side PostgreSQL statement counter the scenario reads.

`scale_bench_payment` carries the decorators of `jobs.examples.charge_payment` (idempotent
transactional + circuit breaker + rate limit + retry policy with a budget, critical tier so
the tier bulkhead admits it at enqueue), with a rate limit high enough never to throttle.
The body writes the ledger row as the example does; it calls no vendor. Its result is
ignored (`ignore_result`): the result backend is Celery's, not a guard's, and would
otherwise be counted in the guard Redis.

Statement counting (only when `BENCH_PG_STATEMENTS_DIR` is set in a worker's environment,
so other scenarios' workers are untouched): `psycopg2.connect` is wrapped so every
connection of the process (SQLAlchemy's engines and the lock backend's own sessions alike)
counts the queries it sends to the server (one query string is one round trip, even when it
holds two statements like `SET LOCAL ...; EXECUTE ...`): each `cursor.execute`/`executemany`,
the `BEGIN`
psycopg2 sends by itself before the first statement of a transaction, and each `COMMIT` /
`ROLLBACK` of an open transaction. After every task the process writes its totals to
`<dir>/<pid>.json`, which the scenario sums.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from celery import signals
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
            head = words[0].upper()
            take = 3 if head in ("INSERT", "DELETE") else 2
            labels.append(" ".join([head, *words[1:take]]))
    return "; ".join(labels)[:80] or "?"


def _install_counter() -> None:
    """Wrap `psycopg2.connect` so every connection of this process counts its statements."""
    import psycopg2
    import psycopg2.extensions as ext

    if getattr(psycopg2.connect, "_bench_counting", False):
        return
    original = psycopg2.connect
    cursor_classes: dict[type, type] = {}

    def counting_cursor(base: type) -> type:
        counted = cursor_classes.get(base)
        if counted is None:
            def execute(self: Any, query: Any, vars: Any = None) -> Any:
                _begin(self.connection)
                _statements[_kind(query)] += 1
                return base.execute(self, query, vars)

            def executemany(self: Any, query: Any, vars_list: Any) -> Any:
                _begin(self.connection)
                _statements[_kind(query) + " (executemany)"] += 1
                return base.executemany(self, query, vars_list)

            counted = type(f"Counting{base.__name__}", (base,),
                           {"execute": execute, "executemany": executemany})
            cursor_classes[base] = counted
        return counted

    def _begin(connection: Any) -> None:
        # psycopg2 sends BEGIN itself before a transaction's first statement.
        if (not connection.autocommit
                and connection.info.transaction_status == ext.TRANSACTION_STATUS_IDLE):
            _statements["BEGIN (implicit)"] += 1

    class CountingConnection(ext.connection):
        def cursor(self, *args: Any, **kwargs: Any) -> Any:
            base = kwargs.get("cursor_factory") or self.cursor_factory or ext.cursor
            kwargs["cursor_factory"] = counting_cursor(base)
            return super().cursor(*args, **kwargs)

        def commit(self) -> None:
            if self.info.transaction_status != ext.TRANSACTION_STATUS_IDLE:
                _statements["COMMIT"] += 1
            super().commit()

        def rollback(self) -> None:
            if self.info.transaction_status != ext.TRANSACTION_STATUS_IDLE:
                _statements["ROLLBACK"] += 1
            super().rollback()

    def connect(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("connection_factory", CountingConnection)
        _statements["(connections opened)"] += 1
        return original(*args, **kwargs)

    connect._bench_counting = True  # type: ignore[attr-defined]
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
