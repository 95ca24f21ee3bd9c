"""`jobs pipeline TASK`: a task's effective pipelines, in the order they run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support import ROOT


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "jobs", "pipeline", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)


class TestPipelineCommand:
    def test_prints_the_payment_stack_in_stage_order(self) -> None:
        done = _run("tests.pipeline.charge", "--json")
        assert done.returncode == 0, done.stderr
        view = json.loads(done.stdout)
        assert [row["stage"] for row in view["execution"]] == [
            "SCHEDULE", "WORKFLOW", "CANCEL", "POISON", "DEADLINE", "PAUSE", "IDEMPOTENCY",
            "WORKFLOW_RECORD", "SCHEDULE_OVERLAP", "EXCLUSIVITY", "BREAKER", "CONCURRENCY",
            "RATE", "RETRY"]
        assert [row["stage"] for row in view["enqueue"]] == [
            "VALIDATE", "VALIDATE", "ADMIT", "STAMP"]
        idempotency = view["execution"][6]["options"]
        assert idempotency["transactional"] is True
        assert idempotency["on_store_down"] == "fail_closed"

    def test_table_output_names_every_guard(self) -> None:
        done = _run("tests.pipeline.charge")
        assert done.returncode == 0, done.stderr
        for guard in ("idempotency", "singleton", "breaker", "concurrency", "rate-limit",
                      "retry", "bulkhead"):
            assert guard in done.stdout

    def test_an_unknown_task_is_one_line(self) -> None:
        done = _run("tests.pipeline.chrage")
        assert done.returncode == 2
        assert "no task named 'tests.pipeline.chrage'" in done.stderr + done.stdout
        assert "Traceback" not in done.stderr
