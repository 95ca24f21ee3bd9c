"""Idempotency: drain rate of an idempotent no-op against the same task plain, against
hand-rolled idempotency, and of replays; see docs/idempotency.md "Benchmark".

Rounds alternate the variants on one running worker (consumers paused, N enqueued, resumed,
timed to the last run or replay), so `ratio` (the median of per-round idempotent/plain
ratios) compares variants under the same load. The hand-rolled variant is the least a
careful user writes: an `INSERT ... ON CONFLICT DO NOTHING RETURNING` claim, an `UPDATE`
after, one autocommit psycopg2 connection per process, `synchronous_commit=off` (the
guard's default). `--breakdown` adds the guard's steps done by hand (`LABELS`).
"""

from __future__ import annotations

import statistics
import uuid
from typing import Any

from bench.harness import (
    drain_paused,
    drain_rate,
    paired_ratio,
    parse,
    platform,
    purge,
    table,
    warm_up,
    workers,
)

QUEUE = "standard"
#: The steps of the guard's happy path, cumulatively, for `--breakdown`: step -> label.
LABELS = {"cache": "cache read", "ping": "cache read + SELECT 1",
          "claim": "cache read + claim"}


def run(argv: list[str]) -> dict[str, Any]:
    options = parse(argv, "idempotency", messages=(1000, "messages per round"),
                    rounds=(6, "rounds of each variant"), concurrency=2,
                    breakdown=(False, "also run the guard's steps one by one: Redis cache "
                                      "read, + a PostgreSQL SELECT 1, + the claim"))
    n = options.messages

    with platform():
        from bench.tasks_idempotency import (
            HANDROLLED_DDL,
            idem_bench_guarded,
            idem_bench_handrolled,
            idem_bench_plain,
            idem_bench_steps,
        )
        from jobs import app
        from resilience.counters import COUNTERS_KEY, field_for
        from resilience.stores import stores_for

        redis = stores_for(app).redis()
        with stores_for(app).engine().begin() as connection:
            connection.exec_driver_sql(HANDROLLED_DDL)
        replay_field = field_for(outcome="REPLAYED", tier="standard", guard="idempotency",
                                 name=idem_bench_guarded.name)
        purge([QUEUE])
        steps = tuple(LABELS) if options.breakdown else ()
        senders = {"plain": idem_bench_plain.delay, "idempotent": idem_bench_guarded.delay,
                   "handrolled": idem_bench_handrolled.delay,
                   **{step: lambda c, i, s=step: idem_bench_steps.delay(c, i, s)
                      for step in steps}}
        rates: dict[str, list[float]] = {variant: [] for variant in [*senders, "replay"]}
        replayed = ""
        with workers(QUEUE, concurrency=options.concurrency) as started:
            names = [worker.nodename for worker in started]
            warm_up(redis, (idem_bench_plain, idem_bench_guarded, idem_bench_handrolled))
            for _ in range(options.rounds):
                for variant, send in senders.items():
                    counter = f"bench:idem:{variant}:{uuid.uuid4().hex}"
                    rates[variant].append(drain_rate(QUEUE, redis, send, n, names,
                                                     counter=counter))
                    replayed = counter if variant == "idempotent" else replayed
                # The idempotent round's n keys again: every one is a duplicate, replayed.
                counter = replayed
                before = int(redis.hget(COUNTERS_KEY, replay_field) or 0)
                seconds = drain_paused(
                    QUEUE,
                    lambda c=counter: [idem_bench_guarded.delay(c, i) for i in range(n)],
                    lambda b=before: int(redis.hget(COUNTERS_KEY, replay_field) or 0) >= b + n,
                    names,
                )
                rates["replay"].append(n / seconds)
                assert int(redis.get(counter) or 0) == n, "a duplicate ran its body"

    median = {variant: statistics.median(values) for variant, values in rates.items()}
    ratio_to_handrolled = paired_ratio(rates, "idempotent", "handrolled")

    def each(variant: str) -> str:
        return ", ".join(f"{r:.0f}" for r in rates[variant])

    table(
        f"idempotency: {options.rounds} rounds x {n} messages, 1 worker x{options.concurrency}",
        ["variant", "median per second", "rounds"],
        [
            ("plain no-op", median["plain"], each("plain")),
            ("idempotent no-op", median["idempotent"], each("idempotent")),
            (f"hand-rolled claim + update (idempotent / it: {ratio_to_handrolled:.3f})",
             median["handrolled"], each("handrolled")),
            ("duplicates replayed", median["replay"], each("replay")),
            *[(f"steps: {LABELS[step]} (ratio {paired_ratio(rates, step):.3f})",
               median[step], each(step)) for step in steps],
        ],
    )
    return {
        "plain_per_s": round(median["plain"], 1),
        "idempotent_per_s": round(median["idempotent"], 1),
        "ratio": round(paired_ratio(rates, "idempotent"), 3),
        "ratio_of_medians": round(median["idempotent"] / median["plain"], 3),
        "replay_per_s": round(median["replay"], 1),
        "handrolled_per_s": round(median["handrolled"], 1),
        "ratio_to_handrolled": round(ratio_to_handrolled, 3),
        "messages": n,
        "rounds": options.rounds,
        **({"breakdown": {step: round(paired_ratio(rates, step), 3) for step in steps}}
           if steps else {}),
    }
