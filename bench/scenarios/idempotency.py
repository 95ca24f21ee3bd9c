"""Idempotency: drain rate of an idempotent no-op against the same task plain, and replays.

Rounds alternate plain / idempotent / hand-rolled / replay on the same running worker, so
every variant sees the same machine load; `ratio` is the median of the per-round
idempotent/plain ratios, `ratio_to_handrolled` that of idempotent/hand-rolled. The
hand-rolled variant is the minimum a careful user writes without the platform: an
`INSERT ... ON CONFLICT DO NOTHING RETURNING` claim in its own table before the body, an
`UPDATE` after, on one autocommit psycopg2 connection per worker process (no prepared
statements; `synchronous_commit=off`, the guard's default).
Each round: consumers paused, N messages enqueued, consumers resumed, time until the last
one ran (a Redis counter) or was replayed (the guard's REPLAYED counter).

`--breakdown` adds three variants that do part of the guard's work by hand, with its own
cache and store: the Redis cache read alone; that plus one PostgreSQL round trip (`SELECT 1`);
that plus the real claim. Their ratios to plain (JSON `breakdown`) show where the guard's cost
goes on a given machine.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Any

from bench.harness import drain_paused, platform, purge, table, workers

QUEUE = "standard"
LABELS = {"cache": "cache read", "ping": "cache read + SELECT 1",
          "claim": "cache read + claim"}


def run(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench idempotency")
    parser.add_argument("--messages", type=int, default=1000, help="messages per round")
    parser.add_argument("--rounds", type=int, default=6, help="rounds of each variant")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--breakdown", action="store_true",
                        help="also run the guard's steps one by one: Redis cache read, + a "
                             "PostgreSQL SELECT 1, + the claim (no completion)")
    options = parser.parse_args(argv)
    n = options.messages

    with platform():
        from bench.tasks_idempotency import (
            HANDROLLED_DDL,
            STEPS,
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
        steps = STEPS if options.breakdown else ()
        rates: dict[str, list[float]] = {"plain": [], "idempotent": [], "handrolled": [],
                                         "replay": [],
                                         **{step: [] for step in steps}}
        with workers(QUEUE, concurrency=options.concurrency) as started:
            names = [worker.nodename for worker in started]
            # Warm-up: connections, imports, script registration.
            warm = f"bench:idem:warm:{uuid.uuid4().hex}"
            for index in range(50):
                idem_bench_plain.delay(warm, index)
                idem_bench_guarded.delay(warm, index)
                idem_bench_handrolled.delay(warm, index)
            while int(redis.get(warm) or 0) < 150:
                time.sleep(0.01)

            for _ in range(options.rounds):
                counter = f"bench:idem:plain:{uuid.uuid4().hex}"
                seconds = drain_paused(
                    QUEUE,
                    lambda c=counter: [idem_bench_plain.delay(c, i) for i in range(n)],
                    lambda c=counter: int(redis.get(c) or 0) >= n,
                    names,
                )
                rates["plain"].append(n / seconds)

                counter = f"bench:idem:guarded:{uuid.uuid4().hex}"
                seconds = drain_paused(
                    QUEUE,
                    lambda c=counter: [idem_bench_guarded.delay(c, i) for i in range(n)],
                    lambda c=counter: int(redis.get(c) or 0) >= n,
                    names,
                )
                rates["idempotent"].append(n / seconds)

                hand_counter = f"bench:idem:handrolled:{uuid.uuid4().hex}"
                seconds = drain_paused(
                    QUEUE,
                    lambda c=hand_counter: [idem_bench_handrolled.delay(c, i) for i in range(n)],
                    lambda c=hand_counter: int(redis.get(c) or 0) >= n,
                    names,
                )
                rates["handrolled"].append(n / seconds)

                for step in steps:
                    step_counter = f"bench:idem:{step}:{uuid.uuid4().hex}"
                    seconds = drain_paused(
                        QUEUE,
                        lambda c=step_counter, s=step: [idem_bench_steps.delay(c, i, s)
                                                        for i in range(n)],
                        lambda c=step_counter: int(redis.get(c) or 0) >= n,
                        names,
                    )
                    rates[step].append(n / seconds)

                # The same n keys again: every one is a duplicate, replayed from Redis.
                before = int(redis.hget(COUNTERS_KEY, replay_field) or 0)
                seconds = drain_paused(
                    QUEUE,
                    lambda c=counter: [idem_bench_guarded.delay(c, i) for i in range(n)],
                    lambda b=before: int(redis.hget(COUNTERS_KEY, replay_field) or 0) >= b + n,
                    names,
                )
                rates["replay"].append(n / seconds)
                assert int(redis.get(counter) or 0) == n, "a duplicate ran its body"

    plain = statistics.median(rates["plain"])
    guarded = statistics.median(rates["idempotent"])
    replay = statistics.median(rates["replay"])
    # Each idempotent round ran right after a plain one, under the same machine load: the
    # median of those pairwise ratios is steadier on a shared machine than a ratio of medians.
    def paired(variant: str, base: str = "plain") -> float:
        return statistics.median(
            v / p for p, v in zip(rates[base], rates[variant], strict=True)
        )

    ratio = paired("idempotent")
    handrolled = statistics.median(rates["handrolled"])
    ratio_to_handrolled = paired("idempotent", "handrolled")
    table(
        f"idempotency: {options.rounds} rounds x {n} messages, 1 worker x{options.concurrency}",
        ["variant", "median per second", "rounds"],
        [
            ("plain no-op", plain, ", ".join(f"{r:.0f}" for r in rates["plain"])),
            ("idempotent no-op", guarded, ", ".join(f"{r:.0f}" for r in rates["idempotent"])),
            (f"hand-rolled claim + update (idempotent / it: {ratio_to_handrolled:.3f})",
             handrolled, ", ".join(f"{r:.0f}" for r in rates["handrolled"])),
            ("duplicates replayed", replay, ", ".join(f"{r:.0f}" for r in rates["replay"])),
            *[(f"steps: {LABELS[step]} (ratio {paired(step):.3f})",
               statistics.median(rates[step]), ", ".join(f"{r:.0f}" for r in rates[step]))
              for step in steps],
        ],
    )
    return {
        "plain_per_s": round(plain, 1),
        "idempotent_per_s": round(guarded, 1),
        "ratio": round(ratio, 3),
        "ratio_of_medians": round(guarded / plain, 3),
        "replay_per_s": round(replay, 1),
        "handrolled_per_s": round(handrolled, 1),
        "ratio_to_handrolled": round(ratio_to_handrolled, 3),
        "messages": n,
        "rounds": options.rounds,
        **({"breakdown": {step: round(paired(step), 3) for step in steps}} if steps else {}),
    }
