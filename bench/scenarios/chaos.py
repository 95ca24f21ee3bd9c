"""The transfer chaos test, run many times in a row: jobs lost and effects doubled, tallied.

Each run is one pytest session of `tests/resilience/idempotency/test_chaos.py` (its own
embedded services unless REDIS_URL / DATABASE_URL are set): 2,000 idempotent transfers
(`--transfers`; `make test` runs 1,000) with duplicates, worker pool processes and whole
workers SIGKILLed at random, then every key must have succeeded with exactly one effect.
The test prints one `chaos-tally` line per run; this scenario collects them.
`make stress` runs 50.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness import table

ROOT = Path(__file__).resolve().parents[2]
TEST = "tests/resilience/idempotency/test_chaos.py"


def run(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench chaos")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--transfers", type=int, default=2000, help="transfers per run")
    options = parser.parse_args(argv)
    rows: list[tuple[Any, ...]] = []
    tallies: list[dict[str, Any]] = []
    failed = 0
    for index in range(1, options.runs + 1):
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", TEST],
            cwd=ROOT, capture_output=True, text=True, check=False,
            env={**os.environ, "CHAOS_TRANSFERS": str(options.transfers), "CHAOS_SECONDS": "45"},
        )
        seconds = time.monotonic() - started
        tally = next((json.loads(line.split(" ", 1)[1]) for line in done.stdout.splitlines()
                      if line.startswith("chaos-tally ")), None)
        if done.returncode != 0:
            failed += 1
        if tally is not None:
            tallies.append(tally)
        rows.append((index, "pass" if done.returncode == 0 else "FAIL",
                     tally and tally["lost"], tally and tally["doubled"],
                     tally and tally["child"], tally and tally["worker"],
                     tally and tally.get("exited", 0), f"{seconds:.0f}s"))
        print(f"run {index}/{options.runs}: {rows[-1][1]} {tally}", flush=True)
        if done.returncode != 0 and tally is None:
            print(done.stdout[-3000:], flush=True)
    table(f"chaos: {options.runs} runs of {TEST}",
          ("run", "result", "lost", "doubled", "pool kills", "worker kills",
           "restarted after exit", "time"), rows)
    return {
        "runs": options.runs,
        "failed_runs": failed,
        "lost": sum(t["lost"] for t in tallies),
        "doubled": sum(t["doubled"] for t in tallies),
        "transfers": sum(t["transfers"] for t in tallies),
        "pool_kills": sum(t["child"] for t in tallies),
        "worker_kills": sum(t["worker"] for t in tallies),
        # Workers Celery stopped itself (a pool process killed before the pool started),
        # started again by the test as a supervisor would.
        "worker_exits": sum(t.get("exited", 0) for t in tallies),
        "runs_without_tally": options.runs - len(tallies),
    }
