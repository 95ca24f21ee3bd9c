"""`jobs up` (what `make run` runs) and `jobs demo` on a machine with no services configured.

Brings up embedded Redis, Redlock nodes and PostgreSQL, the simulated vendor, one worker per
tier, beat and Flower; runs the demo's story (`--fast`) and checks its outcomes where they
land: the ledger in PostgreSQL and Flower's API, with a screenshot of `/resilience` while the
breaker is open; then Ctrl-C (SIGINT) must leave no process behind. One platform serves
both checks: starting it is most of the cost.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
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
CHROMIUM = "/usr/bin/chromium"
#: The committed screenshot the README links; rewritten only with UPDATE_SCREENSHOTS=1.
SCREENSHOT = ROOT / "docs" / "resilience-breaker.png"


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
            "JOBS_VENDOR_PORT": str(free_port()),
            "JOBS_CRITICAL__CONCURRENCY": "1",
            # Two report builds must meet for the demo's double trigger to be SKIPPED.
            "JOBS_STANDARD__CONCURRENCY": "2",
            "JOBS_OPTIONAL__CONCURRENCY": "1",
        }
    )
    return env


def _get(url: str) -> Any:
    """GET JSON from Flower, with the basic auth the platform configures when it has one."""
    request = urllib.request.Request(url)
    credentials = os.environ.get("FLOWER_BASIC_AUTH")
    if credentials:
        token = base64.b64encode(credentials.split(",")[0].encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _screenshot(url: str, path: Path) -> None:
    """Headless Chromium's picture of `url` (throw-away profile)."""
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: run scripts/ensure-chromium"
    profile = tempfile.mkdtemp(prefix="demo-chromium-")
    try:
        shot = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", f"--screenshot={path}", "--window-size=1280,900",
             url],
            capture_output=True, text=True, timeout=90)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert shot.returncode == 0, shot.stderr[-2000:]
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def _breaker(flower: str) -> dict[str, Any]:
    rows = _get(f"{flower}/api/resilience")["breakers"]
    return next((row for row in rows if row["name"] == "payments-vendor"), {})


def _outcomes(tasks: dict[str, Any]) -> Counter[str]:
    """What Flower shows of the guards' decisions, counted."""
    seen: Counter[str] = Counter()
    for task in tasks.values():
        result, error = str(task.get("result")), str(task.get("exception"))
        name = str(task.get("name"))
        if name.endswith("charge_payment") and task.get("state") == "REPLAYED":
            seen["REPLAYED"] += 1
        if "DEFERRED by breaker" in error:
            seen["DEFERRED by breaker"] += 1
        if name.endswith("build_daily_report") and "'outcome': 'SKIPPED'" in result:
            seen["SKIPPED"] += 1
        if name.endswith("warm_cache") and "'outcome': 'SHED'" in result:
            seen["SHED"] += 1
        if task.get("state") == "FAILURE" and "DEAD-LETTERED" in error:
            seen["DEAD-LETTERED"] += 1
    return seen


@pytest.mark.chaos
@pytest.mark.timeout(330)
def test_jobs_up_runs_the_platform_and_the_demo_story(tmp_path: Path) -> None:
    """Flower answers within 60 s and lists the tier workers; `jobs demo --fast` charges
    every order exactly once although duplicates were sent, and Flower shows a REPLAYED,
    a DEFERRED-by-breaker, a SKIPPED, a SHED and a DEAD-LETTERED job; the breaker closed
    again once the vendor recovered; Ctrl-C stops every process."""
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
        demo_log = ARTIFACTS / "jobs-demo.log"
        with demo_log.open("w") as output:
            demo = subprocess.Popen(
                [sys.executable, "-m", "jobs", "demo", "--fast"], cwd=ROOT,
                env={**env, "COLUMNS": "120"}, stdout=output, stderr=subprocess.STDOUT,
            )
        try:
            def breaker_open() -> bool:
                assert demo.poll() is None, demo_log.read_text()[-3000:]
                return _breaker(flower).get("state") == "open"

            wait_for(breaker_open, timeout_seconds=120, interval=0.25,
                     message="the demo's breaker phase")
            # The breaker stays open 10 s: long enough for Chromium to load the page.
            shot = ARTIFACTS / "resilience-breaker.png"
            _screenshot(f"{flower}/resilience?refresh=0", shot)
            if os.environ.get("UPDATE_SCREENSHOTS") == "1":
                shutil.copyfile(shot, SCREENSHOT)
            demo.wait(180)
        finally:
            if demo.poll() is None:
                demo.kill()
        story = demo_log.read_text()
        assert demo.returncode == 0, story[-3000:]
        assert "exactly one per order" in story, story[-3000:]

        def every_outcome() -> dict[str, Any] | None:
            tasks = _get(f"{flower}/api/tasks")
            seen = _outcomes(tasks)
            wanted = ("REPLAYED", "DEFERRED by breaker", "SKIPPED", "SHED", "DEAD-LETTERED")
            return tasks if all(seen[outcome] for outcome in wanted) else None

        tasks = wait_for(every_outcome, timeout_seconds=60, interval=1,
                         message="every guard's outcome in Flower's API")
        done = Counter(task["worker"].split("@")[0] for task in tasks.values()
                       if task.get("state") == "SUCCESS" and task.get("worker"))
        assert set(done) == {"critical", "standard", "optional"}, done

        # The ledger holds each order's charge exactly once, duplicates and retries notwithstanding.
        sent = Counter(re.search(r"'order_id': '([^']+)'", task.get("kwargs") or "").group(1)
                       for task in tasks.values() if task["name"].endswith("charge_payment"))
        orders = {order for order in sent if not order.endswith("-poison")}
        assert sum(sent.values()) > len(sent), "the demo sent no duplicates"
        from sqlalchemy import create_engine, text

        database = create_engine(
            f"postgresql+psycopg2://postgres@127.0.0.1:{env['JOBS_EMBEDDED_POSTGRES_PORT']}/jobs")
        try:
            with database.connect() as connection:
                charged = dict(connection.execute(text(
                    "SELECT order_id, count(*) FROM ledger_entries WHERE order_id LIKE 'o-%' "
                    "GROUP BY order_id")).all())
        finally:
            database.dispose()
        assert charged == dict.fromkeys(orders, 1)

        breaker = _breaker(flower)
        assert breaker["state"] == "closed" and breaker["times_opened"] >= 1, breaker
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
                "JOBS_METRICS_PORT", "JOBS_VENDOR_PORT"):
        assert not port_in_use(int(env[key])), key
