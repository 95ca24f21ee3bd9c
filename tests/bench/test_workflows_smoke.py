"""`python -m bench workflows` runs end to end at tiny sizes and reports every figure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT, Services


def test_workflows_bench_runs_end_to_end(services: Services, tmp_path: Path) -> None:
    from jobs.embedded import embedded_redis, free_port

    # A broker of its own: the session's tier workers consume the same queue names.
    broker = embedded_redis(free_port(), tmp_path / "broker").start()
    try:
        completed = subprocess.run(
            [sys.executable, "-m", "bench", "workflows", "--chains", "6", "--chords", "2",
             "--rounds", "1", "--statement-workflows", "5"],
            cwd=ROOT, env={**os.environ, "REDIS_URL": broker.url}, capture_output=True,
            text=True, timeout=120, check=False,
        )
    finally:
        broker.stop()
    assert completed.returncode == 0, completed.stderr[-3000:] + completed.stdout[-3000:]
    figures = json.loads(completed.stdout.strip().splitlines()[-1])

    assert figures["scenario"] == "workflows"
    assert (figures["chains"], figures["chords"], figures["rounds"]) == (6, 2, 1)
    for variant in ("plain", "durable"):
        for shape in ("chain", "chord"):
            assert figures[f"{variant}_{shape}_steps_per_s"] > 0
    assert figures["durable_chain_ratio"] > 0
    assert figures["durable_chord_ratio"] > 0
    # A durable step talks to PostgreSQL: at least its record and its commit.
    assert figures["pg_statements_per_step"]["chain"] >= 2
    assert figures["pg_statements_per_step"]["chord"] >= 2
    # The worker's CPU holds its main process's share (the consumer).
    for shape in ("chain", "chord"):
        for variant in ("plain", "durable"):
            found = figures["cpu_us_per_step"][shape][variant]
            assert 0 < found["worker_main"] < found["worker"], found
