"""The transfer chaos test (`tests/resilience/idempotency/test_chaos.py`), run many times in a
row, its `chaos-tally` lines (jobs lost, effects doubled, kills) tallied; `make stress` runs
50. See docs/idempotency.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness import parse, table

ROOT = Path(__file__).resolve().parents[2]
TEST = "tests/resilience/idempotency/test_chaos.py"
#: A run's tally: lost, doubled, pool and worker kills, workers restarted after they exited.
COUNTS = ("lost", "doubled", "child", "worker", "exited")


def run(argv: list[str]) -> dict[str, Any]:
    options = parse(argv, "chaos", runs=50, transfers=(2000, "transfers per run"))
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
        tally = next((json.loads(line.split(" ", 1)[1]) for line in done.stdout.splitlines()
                      if line.startswith("chaos-tally ")), None)
        failed += done.returncode != 0
        tallies += [tally] if tally is not None else []
        rows.append((index, "pass" if done.returncode == 0 else "FAIL",
                     *([tally.get(k, 0) for k in COUNTS] if tally else [None] * len(COUNTS)),
                     f"{time.monotonic() - started:.0f}s"))
        print(f"run {index}/{options.runs}: {rows[-1][1]} {tally}", flush=True)
        if done.returncode != 0 and tally is None:
            print(done.stdout[-3000:], flush=True)
    table(f"chaos: {options.runs} runs of {TEST}",
          ("run", "result", "lost", "doubled", "pool kills", "worker kills",
           "restarted after exit", "time"), rows)
    total = {k: sum(t.get(k, 0) for t in tallies) for k in (*COUNTS, "transfers")}
    return {
        "runs": options.runs,
        "failed_runs": failed,
        "lost": total["lost"],
        "doubled": total["doubled"],
        "transfers": total["transfers"],
        "pool_kills": total["child"],
        "worker_kills": total["worker"],
        # Workers Celery stopped itself (a pool process killed before the pool started),
        # started again by the test as a supervisor would.
        "worker_exits": total["exited"],
        "runs_without_tally": options.runs - len(tallies),
    }
