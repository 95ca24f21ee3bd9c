"""One small, realistic job per tier, written as a user of the platform would."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from jobs import app
from jobs.models import DailyReport, LedgerEntry
from resilience.stores import stores_for

CACHE_TTL_SECONDS = 300


def session() -> Session:
    """A SQLAlchemy session on the platform's database."""
    return Session(stores_for(app).engine(), expire_on_commit=False)


@app.task(tier="critical", bind=True)
def charge_payment(
    self: Any, order_id: str, account: str, amount_cents: int, currency: str = "EUR"
) -> dict[str, Any]:
    """Charge `amount_cents` to `account` for `order_id`: one ledger row."""
    if amount_cents <= 0:
        raise ValueError(f"amount_cents must be positive, got {amount_cents}")
    with session() as db, db.begin():
        entry = LedgerEntry(
            order_id=order_id,
            account=account,
            amount_cents=amount_cents,
            currency=currency.upper(),
            task_id=self.request.id,
        )
        db.add(entry)
        db.flush()
        return {"entry_id": entry.id, "order_id": order_id, "amount_cents": amount_cents}


@app.task(tier="standard")
def build_daily_report(day: str) -> dict[str, Any]:
    """Rebuild the totals of one UTC day (ISO date) from the ledger."""
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
            )
        )
    return {"day": day, "entries": int(entries), "total_cents": int(total)}


@app.task(tier="optional")
def warm_cache(account: str) -> dict[str, Any]:
    """Compute `account`'s balance and cache it in Redis; losing this job costs nothing."""
    with session() as db:
        balance = db.execute(
            select(func.coalesce(func.sum(LedgerEntry.amount_cents), 0)).where(
                LedgerEntry.account == account
            )
        ).scalar_one()
    stores_for(app).redis().set(f"cache:balance:{account}", int(balance), ex=CACHE_TTL_SECONDS)
    return {"account": account, "balance_cents": int(balance)}
