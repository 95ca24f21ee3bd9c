"""Example jobs written as a user of the platform should write them; copy these. The README
lists them ("Adding a job"); `jobs demo` shows each guard acting on them ("See it work").
"""

from __future__ import annotations

import datetime as dt
import json
import time
import urllib.error
import urllib.request
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from jobs import app
from jobs.models import DailyReport, LedgerEntry
from resilience.circuit import circuit_breaker
from resilience.idempotency import idempotent, unique
from resilience.locks import FencingTokens, exclusive, singleton
from resilience.ratelimit import rate_limit
from resilience.retry import NonRetryable, Retryable, RetryBudget, retry_policy, wait_full_jitter
from resilience.stores import stores_for

#: The payment vendor: the breaker, the rate limit and the retry budget share this name.
PAYMENTS_VENDOR = "payments-vendor"
#: A charge that has not answered by then has failed (and counts against the breaker).
VENDOR_TIMEOUT_SECONDS = 3.0
#: Rendering and uploading a report takes a while; a second trigger meanwhile is SKIPPED.
REPORT_RENDER_SECONDS = 2.0
#: A balance warmed later than this after the request is worthless: the page has rendered.
WARM_CACHE_DEADLINE_SECONDS = 2.0
#: A warm-up's expensive part (in real life a remote call or a rendering).
WARM_CACHE_WORK_SECONDS = 0.05
CACHE_TTL_SECONDS = 300


def session() -> Session:
    """A SQLAlchemy session on the platform's database."""
    return Session(stores_for(app).engine(), expire_on_commit=False)


def balance_of(db: Session, account: str) -> int:
    """`account`'s balance: the sum of its ledger rows."""
    total = select(func.coalesce(func.sum(LedgerEntry.amount_cents), 0))
    return int(db.execute(total.where(LedgerEntry.account == account)).scalar_one())


def charge_at_vendor(order_id: str, account: str, amount_cents: int, currency: str) -> dict:
    """POST the charge to the vendor, keyed by the order id (the vendor dedupes on it too).

    Raises:
        Retryable: the vendor is down, overloaded or too slow (5xx, 429, timeout).
        NonRetryable: the vendor refused the charge itself (other 4xx): retrying repeats it.
    """
    request = urllib.request.Request(
        f"{app.settings.effective_vendor_url}/charges",
        method="POST",
        data=json.dumps({"account": account, "amount_cents": amount_cents,
                         "currency": currency}).encode(),
        headers={"Content-Type": "application/json", "Idempotency-Key": order_id},
    )
    try:
        with urllib.request.urlopen(request, timeout=VENDOR_TIMEOUT_SECONDS) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        message = f"payment vendor answered HTTP {exc.code} for order {order_id}"
        if exc.code == 429 or exc.code >= 500:
            raise Retryable(message, status=exc.code,
                            retry_after_seconds=_seconds(exc.headers.get("Retry-After"))) from exc
        raise NonRetryable(message, status=exc.code) from exc
    except OSError as exc:  # refused, reset, timed out (URLError and TimeoutError are OSErrors)
        raise Retryable(f"payment vendor unreachable for order {order_id}: {exc}") from exc


@app.task(tier="critical", bind=True)
@idempotent(key="charge:{order_id}", transactional=True)
@circuit_breaker(PAYMENTS_VENDOR, failure_rate_threshold=0.5, slow_call_rate_threshold=0.5,
                 slow_call_seconds=1.5, window=20, minimum_calls=5, open_seconds=10,
                 half_open_probes=2)
@rate_limit(PAYMENTS_VENDOR, "20/second", burst=5)
@retry_policy(max_attempts=4, backoff=wait_full_jitter(base=0.5, cap=10),
              dependency=PAYMENTS_VENDOR, budget=RetryBudget(ratio=0.2))
def charge_payment(self: Any, order_id: str, account: str, amount_cents: int,
                   currency: str = "EUR", session: Session | None = None) -> dict[str, Any]:
    """Charge `amount_cents` to `account` for `order_id`: one vendor charge, one ledger row.

    `@idempotent` makes a duplicate or redelivered order REPLAYED with the first result;
    the ledger row commits in the same transaction as its idempotency record (`session`).
    The breaker defers charges while the vendor is failing, without spending retries; the
    rate limit keeps the fleet within the vendor's contract; failed calls are retried with
    backoff within a fleet-wide budget, and a charge that can never succeed is dead-lettered.
    """
    if session is None:
        raise RuntimeError("charge_payment runs under @idempotent(transactional=True)")
    if amount_cents <= 0:
        raise NonRetryable(f"amount_cents must be positive, got {amount_cents}")
    charge = charge_at_vendor(order_id, account, amount_cents, currency.upper())
    entry = LedgerEntry(order_id=order_id, account=account, amount_cents=amount_cents,
                        currency=currency.upper(), task_id=self.request.id)
    session.add(entry)
    session.flush()
    return {"entry_id": entry.id, "order_id": order_id, "amount_cents": amount_cents,
            "vendor_charge_id": charge.get("charge_id")}


@app.task(tier="standard")
@singleton(key="report:{day}", policy="skip")
def build_daily_report(day: str) -> dict[str, Any]:
    """Rebuild the totals of one UTC day (ISO date) from the ledger.

    `@singleton` holds a PostgreSQL advisory lock per day while the report builds: beat and
    an operator triggering the same day together get one build, the other run is SKIPPED
    and names the holder's task id.
    """
    start = dt.datetime.combine(dt.date.fromisoformat(day), dt.time(), tzinfo=dt.timezone.utc)
    end = start + dt.timedelta(days=1)
    with session() as db, db.begin():
        entries, total = db.execute(
            select(func.count(LedgerEntry.id), func.coalesce(func.sum(LedgerEntry.amount_cents), 0))
            .where(LedgerEntry.created_at >= start, LedgerEntry.created_at < end)
        ).one()
        statement = insert(DailyReport).values(day=start.date(), entries=entries, total_cents=total)
        db.execute(
            statement.on_conflict_do_update(
                index_elements=[DailyReport.day],
                set_={"entries": entries, "total_cents": total, "built_at": func.now()},
            ))
    time.sleep(REPORT_RENDER_SECONDS)  # stands in for rendering and uploading the report
    return {"day": day, "entries": int(entries), "total_cents": int(total)}


@app.task(tier="standard")
@exclusive(key="settlement:{account}", ttl_seconds=30)
def settle_account(account: str, fencing_token: int | None = None) -> dict[str, Any]:
    """Pay `account`'s positive balance out: one settlement row that zeroes it.

    `@exclusive` lets one holder per account settle (Redlock, with a lease heartbeat) and
    hands it a fencing token; the write goes through `FencingTokens.guard_write`, so a
    holder that paused past its lease and lost the lock is refused by the database rather
    than paying the balance out a second time.
    """
    with session() as db, db.begin():
        FencingTokens.guard_write(db.connection(), f"settlement:{account}", fencing_token)
        balance = balance_of(db, account)
        if balance > 0:
            db.add(LedgerEntry(order_id=f"settlement:{account}:{fencing_token}",
                               account=account, amount_cents=-balance, currency="EUR"))
    return {"account": account, "settled_cents": max(0, balance),
            "fencing_token": fencing_token}


@app.task(tier="optional", deadline_seconds=WARM_CACHE_DEADLINE_SECONDS)
@unique(key="{account}", ttl_seconds=60)
def warm_cache(account: str) -> dict[str, Any]:
    """Compute `account`'s balance and cache it in Redis; losing this job costs nothing.

    `@unique` keeps one warm-up per account in the queue (a second `.delay()` returns the
    queued job); the deadline sheds a warm-up that waited too long (outcome SHED), so a
    flood drains to fresh work instead of computing balances nobody waits for.
    """
    with session() as db:
        balance = balance_of(db, account)
    time.sleep(WARM_CACHE_WORK_SECONDS)  # stands in for the expensive part of a warm-up
    stores_for(app).redis().set(f"cache:balance:{account}", balance, ex=CACHE_TTL_SECONDS)
    return {"account": account, "balance_cents": balance}


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None  # an HTTP-date Retry-After: the backoff decides
