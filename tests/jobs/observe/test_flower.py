"""Guard outcomes in a real Flower, and the resilience page inside Flower's own app."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support import ARTIFACTS, wait_for

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync")


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    """Run Debian's Chromium headless with a throw-away profile."""
    assert Path(CHROMIUM).exists(), (
        f"{CHROMIUM} is missing: run scripts/ensure-chromium (make test does)")
    profile = tempfile.mkdtemp(prefix="observe-chromium-")
    try:
        return subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=90)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


class TestOutcomesInFlower:
    @pytest.mark.timeout(240)
    def test_a_replayed_task_shows_its_outcome_and_reason_in_flower(
        self, app: Any, worker_factory: Any, start_server: Any, redis_client: Any
    ) -> None:
        """GET /api/task/info/<id> of a REPLAYED call shows the outcome, guard and reason."""
        from tests.jobs.observe.tasks import remember

        flower = start_server("flower")
        worker_factory("standard", name="observe-flower", concurrency=1)
        key = f"flower-{uuid.uuid4().hex[:8]}"
        first = remember.delay(key=key, value=3)
        assert first.get(timeout=60) == {"key": key, "value": 3}
        second = remember.delay(key=key, value=3)
        result = second.get(timeout=60)
        assert result["outcome"] == "REPLAYED"

        def task_info() -> dict[str, Any] | None:
            status, body = flower.get(f"/api/task/info/{second.id}")
            if status != 200:
                return None
            info = json.loads(body)
            return info if info.get("state") == "SUCCESS" and info.get("result") else None

        info = wait_for(task_info, timeout_seconds=60, interval=0.25,
                        message="Flower to record the replayed task")
        assert info["name"] == "tests.observe.remember"
        assert "REPLAYED" in info["result"]
        assert "idempotency" in info["result"]
        # The reason names the original task, whose result was replayed.
        assert first.id in result["reason"]
        assert f"already succeeded in task {first.id}" in info["result"]


    @pytest.mark.timeout(240)
    def test_skipped_and_deferred_outcomes_show_in_flower(
        self, app: Any, stores: Any, worker_factory: Any, start_server: Any,
        redis_client: Any,
    ) -> None:
        """A singleton SKIPPED names the holder task; a breaker deferral shows as RETRY."""
        from celery.result import AsyncResult

        from resilience.circuit.backends.redis import RedisBreakerBackend
        from resilience.circuit.breaker import CircuitBreaker
        from resilience.circuit.config import BreakerConfig
        from tests.jobs.observe.tasks import gated, hold

        flower = start_server("flower")
        worker_factory("standard", name="observe-flower-2", concurrency=2)

        def info_of(task_id: str, state: str) -> dict[str, Any] | None:
            status, body = flower.get(f"/api/task/info/{task_id}")
            info = json.loads(body) if status == 200 else {}
            return info if info.get("state") == state else None

        slot = uuid.uuid4().hex
        first = hold.delay(slot=slot, seconds=3)
        wait_for(lambda: AsyncResult(first.id, app=app).state == "STARTED",
                 timeout_seconds=120, message="the first run to hold the lock")
        second = hold.delay(slot=slot)
        skipped = second.get(timeout=60)
        assert skipped["outcome"] == "SKIPPED"
        assert skipped["details"]["holder_task_id"] == first.id
        info = wait_for(lambda: info_of(second.id, "SUCCESS"), timeout_seconds=60,
                        message="Flower to record the skipped run")
        assert "SKIPPED" in info["result"] and first.id in info["result"]
        assert first.get(timeout=60)["slot"] == slot

        breaker = CircuitBreaker(BreakerConfig(name="observe-flower-dep"),
                                 RedisBreakerBackend(stores.redis))
        breaker.force("forced_open")
        deferred = gated.delay(5)
        # The RETRY state lasts only until the republished message is received; the
        # task-retried event's exception stays on Flower's task.
        def deferral() -> dict[str, Any] | None:
            status, body = flower.get(f"/api/task/info/{deferred.id}")
            info = json.loads(body) if status == 200 else {}
            return info if "DEFERRED by breaker" in str(info.get("exception")) else None

        wait_for(deferral, timeout_seconds=60, message="Flower to show the deferral (RETRY)")
        breaker.force("closed")
        assert deferred.get(timeout=60) == 5
        wait_for(lambda: info_of(deferred.id, "SUCCESS"), timeout_seconds=60,
                 message="Flower to show the deferred call done once the breaker closed")

    @pytest.mark.timeout(180)
    def test_a_deferral_shows_its_guard_and_reason_in_flower(
        self, app: Any, stores: Any, worker_factory: Any, start_server: Any,
        redis_client: Any,
    ) -> None:
        """DEFERRED by breaker B: Flower's RETRY entry names the guard and the reason."""
        from resilience.circuit.backends.redis import RedisBreakerBackend
        from resilience.circuit.breaker import CircuitBreaker
        from resilience.circuit.config import BreakerConfig
        from tests.jobs.observe.tasks import gated

        flower = start_server("flower")
        worker_factory("standard", name="observe-flower-3", concurrency=1)
        breaker = CircuitBreaker(BreakerConfig(name="observe-flower-dep"),
                                 RedisBreakerBackend(stores.redis))
        breaker.force("forced_open")
        deferred = gated.delay(6)
        try:
            # The RETRY state itself lasts only until the republished message is received
            # (milliseconds); the task-retried event's exception stays on Flower's task.
            def retried() -> dict[str, Any] | None:
                status, body = flower.get(f"/api/task/info/{deferred.id}")
                info = json.loads(body) if status == 200 else {}
                return info if info.get("exception") else None

            info = wait_for(retried, timeout_seconds=60, message="the deferral in Flower")
            assert "DEFERRED by breaker" in str(info.get("exception"))
            assert "observe-flower-dep is forced_open" in str(info.get("exception"))
        finally:
            breaker.force("closed")
            deferred.get(timeout=60)


class TestResiliencePage:
    @pytest.mark.timeout(240)
    def test_browser_shows_the_open_breaker_and_the_full_optional_tier(
        self, app: Any, stores: Any, services: Any, redis_client: Any, start_server: Any
    ) -> None:
        """Headless Chromium renders /resilience: the forced-open breaker and optional FULL.

        Flower gets a broker database of its own (db 3) that no worker consumes, so the
        optional queue it watches stays as full as the test made it; breaker state lives in
        the shared guard-state Redis as usual.
        """
        from kombu import Connection

        from resilience.circuit.backends.redis import RedisBreakerBackend
        from resilience.circuit.breaker import CircuitBreaker
        from resilience.circuit.config import BreakerConfig
        from tests.jobs.observe.tasks import idle

        broker = f"{services.redis_base}/3"
        CircuitBreaker(BreakerConfig(name="observe-payments-api"),
                       RedisBreakerBackend(stores.redis)).force("forced_open")
        with Connection(broker) as connection:
            connection.default_channel.client.flushdb()
            for n in range(6):
                # A plain Celery publish to the tier queue (the producer-side bulkhead is
                # not under test here: it would refuse the sixth message).
                app.send_task(idle.name, args=(n,), queue="optional", connection=connection)
        flower = start_server("flower", env={"BROKER_URL": broker,
                                             "JOBS_OPTIONAL__MAX_QUEUE_DEPTH": "5"})
        snapshot = flower.get_json("/api/resilience")
        assert snapshot["tiers"]["optional"]["depth"] == 6
        assert snapshot["tiers"]["optional"]["full"] is True

        url = f"{flower.url}/resilience?refresh=0"
        dom = chromium("--dump-dom", url)
        assert dom.returncode == 0, dom.stderr[-2000:]
        html = dom.stdout
        assert 'id="tier-optional" data-full="true"' in html
        optional_row = html.split('id="tier-optional"', 1)[1].split("</tr>", 1)[0]
        assert "FULL" in optional_row
        critical_row = html.split('id="tier-critical"', 1)[1].split("</tr>", 1)[0]
        assert "FULL" not in critical_row
        breaker_row = html.split('id="breaker-observe-payments-api"', 1)[1].split("</tr>", 1)[0]
        assert 'data-state="forced_open"' in html
        assert "OPEN" in breaker_row

        ARTIFACTS.mkdir(exist_ok=True)
        screenshot = ARTIFACTS / "resilience-page.png"
        screenshot.unlink(missing_ok=True)
        shot = chromium(f"--screenshot={screenshot}", "--window-size=1280,900", url)
        assert shot.returncode == 0, shot.stderr[-2000:]
        assert screenshot.stat().st_size > 10_000
        assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        (ARTIFACTS / "resilience-page.html").write_text(html)
        with Connection(broker) as connection:
            connection.default_channel.client.flushdb()

    @pytest.mark.timeout(180)
    def test_the_page_and_api_honour_flowers_basic_auth(self, start_server: Any) -> None:
        """With FLOWER_BASIC_AUTH set, both answer 401 without credentials, 200 with them."""
        flower = start_server("flower", env={"FLOWER_BASIC_AUTH": "admin:s3cret",
                                             "FLOWER_UNAUTHENTICATED_API": ""})
        for path in ("/resilience", "/api/resilience"):
            assert flower.get(path)[0] == 401, path
            request = urllib.request.Request(flower.url + path, headers={
                "Authorization": "Basic " + base64.b64encode(b"admin:s3cret").decode()})
            with urllib.request.urlopen(request, timeout=30) as response:
                assert response.status == 200, path
