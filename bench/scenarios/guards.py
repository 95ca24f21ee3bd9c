"""Full guard stack overhead: breaker + retry budget + idempotency + singleton vs plain.

Three variants of one task drain from a prefilled queue on the same running worker, in
alternating rounds so each sees the same machine load: plain Celery, a platform task with
only the platform defaults, and the fully guarded task. The task's own work is a wait of
`work_ms` on a remote dependency (a sleep: the dependency's CPU is not on this machine);
the scenario runs each `--work-ms` value. `ratio` is guarded / plain Celery at the
reference work (`--reference-work-ms`), the median of the per-round ratios; every work value's
ratio is reported too, and `overhead_ms` is the worker time the guards add per job (from the
no-op rounds: concurrency x (1/guarded - 1/plain)).

Round trips on the guarded happy path (a first delivery of a new key), counted from the code:
- Redis 2: one read batch before the body (idempotency cache GET + breaker state), one write
  batch after it (cache SET + breaker outcome + budget request count); see resilience.batch.
  The poison check costs nothing on a first delivery (it counts redeliveries only).
- PostgreSQL 3, all on the worker thread's own connection (prepared statements): the
  idempotency claim, the singleton acquire, and the completion with the singleton's release
  riding on it (one query string; the lock is freed at the completion's commit). `python -m
  bench calls` counts them.
"""

from __future__ import annotations

import statistics
from typing import Any

from bench.harness import drain_rate, paired_ratio, parse, platform, purge, table, warm_up, workers

QUEUE = "standard"
VARIANTS = ("plain", "platform", "guarded")


def run(argv: list[str]) -> dict[str, Any]:
    options = parse(argv, "guards", messages=(1000, "messages per round"),
                    rounds=(5, "rounds of each variant"), concurrency=2,
                    work_ms=("0,5,20", "comma-separated waits on the dependency per job, in ms"),
                    reference_work_ms=(20.0, "the work whose ratio is the headline `ratio`"))
    n = options.messages
    works = sorted({float(value) for value in options.work_ms.split(",") if value.strip()}
                   | {options.reference_work_ms})

    with platform():
        from bench.tasks_guards import (
            guards_bench_celery,
            guards_bench_guarded,
            guards_bench_platform,
        )
        from jobs import app
        from resilience.stores import stores_for

        tasks = {"plain": guards_bench_celery, "platform": guards_bench_platform,
                 "guarded": guards_bench_guarded}
        redis = stores_for(app).redis()
        purge([QUEUE])
        # rates[work][variant]: one rate per round
        rates = {work: {variant: [] for variant in VARIANTS} for work in works}
        with workers(QUEUE, concurrency=options.concurrency) as started:
            names = [worker.nodename for worker in started]
            warm_up(redis, tasks.values())
            for work in works:
                for _ in range(options.rounds):
                    for variant, task in tasks.items():
                        rates[work][variant].append(drain_rate(
                            QUEUE, redis, lambda c, i, t=task, w=work: t.delay(c, i, w),
                            n, names))

    def median(work: float, variant: str) -> float:
        return statistics.median(rates[work][variant])

    table(
        f"guards: {n} messages x {options.rounds} rounds, 1 worker x{options.concurrency}",
        ["work ms", "variant", "median per second", "min", "max", "ratio to plain"],
        [(f"{work:g}", variant, median(work, variant), min(rates[work][variant]),
          max(rates[work][variant]), paired_ratio(rates[work], variant))
         for work in works for variant in VARIANTS],
    )
    reference = options.reference_work_ms
    figures: dict[str, Any] = {
        "plain_per_s": round(median(reference, "plain"), 1),
        "guarded_per_s": round(median(reference, "guarded"), 1),
        "ratio": round(paired_ratio(rates[reference], "guarded"), 3),
        "work_ms": reference,
        "platform_ratio": round(paired_ratio(rates[reference], "platform"), 3),
        "ratio_by_work_ms": {f"{work:g}": round(paired_ratio(rates[work], "guarded"), 3)
                             for work in works},
    }
    if 0.0 in works:
        figures["overhead_ms"] = round(options.concurrency * 1000 * (
            1 / median(0.0, "guarded") - 1 / median(0.0, "plain")), 3)
    # The guards' own store round trips on a first delivery, as `python -m bench calls` and
    # tests/resilience/batch/test_batch.py count them: a closed breaker's state comes from
    # the process's copy, successes and budget requests are sent once per 0.1 s, and
    # `cache="auto"` reads no cache without duplicates (2 Redis round trips before that).
    figures["round_trips"] = {"redis": 0, "postgresql": 3}
    return figures
