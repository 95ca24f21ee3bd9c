"""`jobs cancel` and `jobs cancellations`, run as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

from tests.support import ROOT


def _jobs(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "jobs", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


class TestCancelCommand:
    def test_cancel_list_withdraw(self) -> None:
        """A cancelled id is listed with its reason; withdrawing removes it."""
        task_id = str(uuid.uuid4())
        done = _jobs("cancel", task_id, "--reason", "duplicate order")
        assert done.returncode == 0, done.stderr
        assert task_id in done.stdout
        listed = _jobs("cancellations", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        rows = {row["target"]: row for row in json.loads(listed.stdout)}
        assert rows[f"id:{task_id}"]["reason"] == "duplicate order"
        withdrawn = _jobs("cancellations", "withdraw", f"id:{task_id}")
        assert withdrawn.returncode == 0 and "withdrawn" in withdrawn.stdout
        listed = json.loads(_jobs("cancellations", "list", "--json").stdout)
        assert f"id:{task_id}" not in {row["target"] for row in listed}

    def test_bad_usage_is_one_line(self) -> None:
        """Neither an id nor --task/--key, or a key for a task without cancel_key: exit 2 with
        one line saying what to give."""
        done = _jobs("cancel")
        assert done.returncode == 2 and "task id" in done.stderr
        done = _jobs("cancel", "--task", "jobs.examples.warm_cache", "--key", "k")
        assert done.returncode == 2 and "cancel_key" in done.stderr
        assert "Traceback" not in done.stderr
