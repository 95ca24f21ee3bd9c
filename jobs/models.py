"""Tables of the example jobs, on the platform's own metadata (`jobs/migrations` creates
them; the library's `resilience_*` tables are `resilience.schema`'s)."""

from __future__ import annotations

from datetime import date, datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Date,
    DateTime,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    func,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from resilience.schema import metadata as library_metadata

#: The platform's tables, named by the library's convention.
metadata = MetaData(naming_convention=dict(library_metadata.naming_convention))


class Base(DeclarativeBase):
    metadata = metadata


class LedgerEntry(Base):
    """One money movement; a payment charge writes one row."""

    __tablename__ = "ledger_entries"
    __table_args__ = (CheckConstraint("currency ~ '^[A-Z]{3}$'", name="currency_iso"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    order_id: Mapped[str] = mapped_column(Text, index=True)
    account: Mapped[str] = mapped_column(Text, index=True)
    amount_cents: Mapped[int] = mapped_column(BigInteger)
    currency: Mapped[str] = mapped_column(String(3))
    task_id: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), index=True)


class DailyReport(Base):
    """Totals of one day's ledger, rebuilt by the standard-tier report job."""

    __tablename__ = "daily_reports"

    day: Mapped[date] = mapped_column(Date, primary_key=True)
    entries: Mapped[int] = mapped_column(Integer)
    total_cents: Mapped[int] = mapped_column(BigInteger)
    built_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class IdempotencyDemoEntry(Base):
    """One transfer of the idempotency demo and chaos test: deliberately WITHOUT a unique
    constraint on the transfer key, so a double effect shows as a second row."""

    __tablename__ = "idempotency_demo_entries"
    __table_args__ = (Index("ix_idempotency_demo_entries_transfer_key", "transfer_key"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    transfer_key: Mapped[str] = mapped_column(Text)
    account: Mapped[str] = mapped_column(Text)
    amount_cents: Mapped[int] = mapped_column(BigInteger)
    task_id: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
