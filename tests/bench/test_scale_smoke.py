"""`python -m bench scale` runs end to end at tiny sizes and reports every figure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT, Services


def test_scale_bench_runs_end_to_end(services: Services, tmp_path: Path) -> None:
    from jobs.embedded import embedded_redis, free_port

    # A broker of its own: the session's tier workers consume the same queue names.
    broker = embedded_redis(free_port(), tmp_path / "broker").start()
    try:
        completed = subprocess.run(
            [sys.executable, "-m", "bench", "scale", "--jobs", "30", "--warmup", "10",
             "--stats-wait", "0", "--seconds", "2.5", "--interval", "1",
             "--insert-rate", "2000", "--insert-batch", "200", "--ttl", "0.5"],
            cwd=ROOT, env={**os.environ, "REDIS_URL": broker.url}, capture_output=True,
            text=True, timeout=120, check=False,
        )
    finally:
        broker.stop()
    assert completed.returncode == 0, completed.stderr[-3000:] + completed.stdout[-3000:]
    figures = json.loads(completed.stdout.strip().splitlines()[-1])

    assert figures["scenario"] == "scale"
    assert figures["jobs"] == 30
    # Every job reached the guard Redis and the database: claim, ledger row, completion.
    assert figures["redis_us_per_job"] > 0
    assert figures["redis_calls_per_job"] >= 1
    assert figures["pg_statements_per_job"] >= 3
    assert figures["pg_connections_per_process"] > 0
    # The inserter ran and cleanup deleted what expired meanwhile.
    assert figures["insert_rows_per_s"] > 0
    assert figures["cleanup_rows_per_s"] > 0
    assert {"table_growth_rows", "cleanup_runs"} <= figures.keys()
