"""`jobs up` (what `make run` runs) on a machine with no services configured.

Brings up embedded Redis, Redlock nodes and PostgreSQL, one worker per tier, beat and
Flower; checks Flower lists the three tier workers and shows demo tasks on each; then
Ctrl-C (SIGINT) must leave no process behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest

from jobs.embedded import free_port, port_in_use
from tests.support import ARTIFACTS, ROOT, wait_for

CONFIGURED = ("REDIS_URL", "DATABASE_URL", "BROKER_URL", "REDLOCK_URLS")


def _platform_env(tmp_path: Path) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in CONFIGURED and not key.startswith(("JOBS_", "FLOWER_", "PROMETHEUS_"))
    }
    env.update(
        {
            "JOBS_DATA_DIR": str(tmp_path / "data"),
            "JOBS_EMBEDDED_REDIS_PORT": str(free_port()),
            "JOBS_EMBEDDED_POSTGRES_PORT": str(free_port()),
            "JOBS_EMBEDDED_REDLOCK_PORTS": ",".join(str(free_port()) for _ in range(3)),
            "JOBS_FLOWER_PORT": str(free_port()),
            "JOBS_METRICS_PORT": str(free_port()),
            "JOBS_CRITICAL__CONCURRENCY": "1",
            "JOBS_STANDARD__CONCURRENCY": "1",
            "JOBS_OPTIONAL__CONCURRENCY": "1",
        }
    )
    return env


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


@pytest.mark.chaos
@pytest.mark.timeout(240)
def test_jobs_up_runs_the_platform_and_ctrl_c_stops_everything(tmp_path: Path) -> None:
    """Flower answers within 60 s, lists the tier workers, shows demo tasks on all three."""
    env = _platform_env(tmp_path)
    flower = f"http://127.0.0.1:{env['JOBS_FLOWER_PORT']}"
    log_path = ARTIFACTS / "jobs-up.log"
    log_path.parent.mkdir(exist_ok=True)
    with log_path.open("wb") as log:
        honcho = subprocess.Popen(
            [sys.executable, "-m", "jobs", "up"], cwd=ROOT, env=env, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
    descendants: set[int] = set()
    try:
        started = time.monotonic()

        def flower_answers() -> bool:
            descendants.update(p.pid for p in psutil.Process(honcho.pid).children(recursive=True))
            assert honcho.poll() is None, log_path.read_text()[-3000:]
            try:
                _get(f"{flower}/api/workers")
            except OSError:
                return False
            return True

        wait_for(flower_answers, timeout_seconds=60, interval=0.5, message="Flower")
        assert time.monotonic() - started < 60

        def tier_workers() -> set[str]:
            workers = _get(f"{flower}/api/workers?refresh=1")
            return {name.split("@")[0] for name in workers} >= {"critical", "standard", "optional"}

        wait_for(tier_workers, timeout_seconds=60, interval=1, message="three tier workers")
        demo = subprocess.run(
            [sys.executable, "-m", "jobs", "demo", "--rate", "30", "--seconds", "4"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
        )
        assert demo.returncode == 0, demo.stderr

        def tasks_on_every_tier() -> Counter[str]:
            tasks = _get(f"{flower}/api/tasks?limit=1000")
            done = Counter(
                task["worker"].split("@")[0]
                for task in tasks.values()
                if task.get("state") == "SUCCESS" and task.get("worker")
            )
            return done if set(done) == {"critical", "standard", "optional"} else Counter()

        done = wait_for(tasks_on_every_tier, timeout_seconds=60, interval=1,
                        message="demo tasks succeeded on all three tier workers")
        assert all(count > 0 for count in done.values())
        with urllib.request.urlopen(
            f"http://127.0.0.1:{env['JOBS_METRICS_PORT']}/metrics", timeout=10
        ) as response:
            assert b"jobs_queue_depth" in response.read()
        descendants.update(p.pid for p in psutil.Process(honcho.pid).children(recursive=True))
    finally:
        honcho.send_signal(signal.SIGINT)
        try:
            honcho.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(honcho.pid, signal.SIGKILL)
            raise

    def all_gone() -> bool:
        return not [pid for pid in descendants if psutil.pid_exists(pid)
                    and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]

    wait_for(all_gone, timeout_seconds=15, message="every platform process to exit")
    assert len(descendants) >= 8
    for key in ("JOBS_EMBEDDED_REDIS_PORT", "JOBS_EMBEDDED_POSTGRES_PORT", "JOBS_FLOWER_PORT",
                "JOBS_METRICS_PORT"):
        assert not port_in_use(int(env[key])), key
