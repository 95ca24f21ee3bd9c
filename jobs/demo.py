"""`jobs demo`: a steady mixed workload so Flower shows all three tiers working."""

from __future__ import annotations

import datetime as dt
import random
import time
import uuid

from rich.console import Console

from resilience.errors import ResilienceError

ACCOUNTS = [f"acct-{n:03d}" for n in range(20)]


def run_demo(*, rate: float, seconds: float, console: Console) -> None:
    """Enqueue about `rate` jobs per second (70% critical, 20% standard, 10% optional)."""
    from jobs.examples import build_daily_report, charge_payment, warm_cache

    interval = 1.0 / max(rate, 0.1)
    started = time.monotonic()
    counts = {"critical": 0, "standard": 0, "optional": 0, "refused": 0}
    console.print(f"demo: {rate:g} jobs/s; Ctrl-C to stop")
    try:
        while not seconds or time.monotonic() - started < seconds:
            roll = random.random()
            try:
                if roll < 0.7:
                    charge_payment.delay(
                        order_id=f"ord-{uuid.uuid4().hex[:12]}",
                        account=random.choice(ACCOUNTS),
                        amount_cents=random.randint(100, 50_000),
                    )
                    counts["critical"] += 1
                elif roll < 0.9:
                    day = dt.date.today() - dt.timedelta(days=random.randint(0, 6))
                    build_daily_report.delay(day=day.isoformat())
                    counts["standard"] += 1
                else:
                    warm_cache.delay(account=random.choice(ACCOUNTS))
                    counts["optional"] += 1
            except ResilienceError as exc:
                counts["refused"] += 1
                console.print(f"[yellow]refused: {type(exc).__name__}: {exc}[/yellow]")
            total = sum(counts.values())
            if total % 50 == 0:
                console.print(f"enqueued {counts}")
            time.sleep(interval)
    except KeyboardInterrupt:
        pass
    console.print(f"demo finished: {counts}")
