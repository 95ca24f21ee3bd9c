"""Producer cost of `.delay()`: plain Celery, the platform's defaults, `@unique`, `enqueue_in`
and peers; see docs/overload.md.

Rounds alternate the variants (the same machine load for each), publishing `--messages`
fresh keys into the optional tier queue (no worker runs), then purge it. Per variant: jobs/s
(median of rounds), the ratio to plain Celery (median of each round's ratio), Redis round
trips per job counted in this process (`enqueue_in` talks to PostgreSQL instead) and the
producer's CPU time per job: on a noisy machine the last two are the steady figures.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench.harness import RoundTrips, paired_ratio, parse, platform, purge, table


def run(argv: list[str]) -> dict[str, Any]:
    options = parse(argv, "enqueue", messages=(3000, "jobs per variant and round"), rounds=3)
    n = options.messages

    # The bench queue takes the optional tier's bulkhead: room for a whole round.
    with platform({"JOBS_OPTIONAL__MAX_QUEUE_DEPTH": str(10 * n + 1000)}) as services:
        from bench import tasks_enqueue as tasks
        from jobs import app

        app.conf.ONCE = {"backend": "celery_once.backends.Redis",
                         "settings": {"url": services.redis_url, "default_timeout": 3600}}
        app.conf.singleton_backend_url = services.redis_url
        from sqlalchemy.orm import Session

        from resilience.stores import stores_for

        engine = stores_for(app).engine()

        def enqueue_in(n: int) -> Any:
            # The caller's own transaction: one row, one commit (the relay publishes later).
            with Session(engine) as session, session.begin():
                return tasks.enqueue_platform.enqueue_in(session, n)

        variants = {"plain": tasks.enqueue_celery, "platform": tasks.enqueue_platform,
                    "unique": tasks.enqueue_unique, "celery_once": tasks.enqueue_celery_once,
                    "celery_singleton": tasks.enqueue_celery_singleton}
        senders = {**{variant: task.delay for variant, task in variants.items()
                      if task is not None}, "enqueue_in": enqueue_in}  # a peer may be missing
        rates, trips, cpu_us = ({variant: [] for variant in senders} for _ in range(3))
        purge([tasks.QUEUE])
        for variant in senders:  # warm: connections, scripts, declared queue
            for index in range(20):
                senders[variant](-1 - index)
        purge([tasks.QUEUE])
        offset = 0
        for _ in range(options.rounds):
            for variant, send in senders.items():
                with RoundTrips() as counter:
                    started, cpu = time.perf_counter(), time.process_time()
                    for index in range(offset, offset + n):
                        send(index)
                    seconds = time.perf_counter() - started
                    cpu = time.process_time() - cpu
                offset += n
                rates[variant].append(n / seconds)
                trips[variant].append(counter.count / n)
                cpu_us[variant].append(cpu / n * 1e6)
                purge([tasks.QUEUE])
            with engine.begin() as connection:  # nobody relays in this scenario
                connection.exec_driver_sql("DELETE FROM resilience_outbox")
        medians = {variant: statistics.median(rates[variant]) for variant in senders}
        paired = {variant: paired_ratio(rates, variant) for variant in senders}
        table(
            f"enqueue: {n} jobs per variant and round, {options.rounds} rounds (medians)",
            ("variant", "jobs/s", "ratio", "round trips/job", "CPU µs/job",
             "each round, jobs/s"),
            [(variant, f"{medians[variant]:,.0f}", f"{paired[variant]:.2f}",
              f"{statistics.median(trips[variant]):.2f}",
              f"{statistics.median(cpu_us[variant]):,.0f}",
              " ".join(f"{rate:,.0f}" for rate in rates[variant])) for variant in senders],
        )

    def ratio(variant: str) -> float | None:
        return round(paired[variant], 3) if variant in paired else None

    return {
        "messages": n,
        "rounds": options.rounds,
        "plain_per_s": round(medians["plain"]),
        "guarded_per_s": round(medians["platform"]),
        "guarded_ratio": ratio("platform"),
        "unique_ratio": ratio("unique"),
        "enqueue_in_per_s": round(medians["enqueue_in"]),
        "celery_once_ratio": ratio("celery_once"),
        "celery_singleton_ratio": ratio("celery_singleton"),
        "round_trips_per_job": {variant: statistics.median(trips[variant])
                                for variant in senders},
        "cpu_us_per_job": {variant: round(statistics.median(cpu_us[variant]))
                           for variant in senders},
    }
