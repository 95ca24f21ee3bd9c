"""Guard outcomes in a real Flower, the resilience page inside Flower's own app, and the
operator actions on it (pause, resume, cancel, requeue) behind Flower's auth and XSRF."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.jobs.observe.browser import CHROMIUM, CHROMIUM_FLAGS, Browser
from tests.support import ARTIFACTS, wait_for


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
        """GET /api/task/info/<id> of a replayed duplicate shows state REPLAYED and the first
        call's value, which its `.get()` answers; the result's metadata has the guard and
        the reason."""
        from resilience import Outcome, outcome_of
        from tests.jobs.observe.tasks import remember

        flower = start_server("flower")
        worker_factory("standard", name="observe-flower", concurrency=1)
        key = f"flower-{uuid.uuid4().hex[:8]}"
        first = remember.delay(key=key, value=3)
        assert first.get(timeout=60) == {"key": key, "value": 3}
        second = remember.delay(key=key, value=3)
        assert second.get(timeout=60) == {"key": key, "value": 3}

        def task_info() -> dict[str, Any] | None:
            status, body = flower.get(f"/api/task/info/{second.id}")
            if status != 200:
                return None
            info = json.loads(body)
            return info if info.get("state") == "REPLAYED" and info.get("result") else None

        info = wait_for(task_info, timeout_seconds=60, interval=0.25,
                        message="Flower to record the replayed task")
        assert info["name"] == "tests.observe.remember"
        assert f"'key': '{key}'" in info["result"] and "'value': 3" in info["result"]
        decision = outcome_of(second)
        assert decision is not None and decision.outcome is Outcome.REPLAYED
        assert decision.guard == "idempotency"
        # The reason names the original task, whose result was replayed.
        assert f"already succeeded in task {first.id}" in decision.reason


    @pytest.mark.timeout(240)
    def test_skipped_and_deferred_outcomes_show_in_flower(
        self, app: Any, stores: Any, worker_factory: Any, start_server: Any,
        redis_client: Any,
    ) -> None:
        """A singleton SKIPPED (its own state) names the holder task; a breaker deferral
        shows as RETRY."""
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
        # Held long enough that the second run starts while the first holds the lock on a
        # loaded box too (3 s was not: the second ran after the first and succeeded).
        first = hold.delay(slot=slot, seconds=12)
        wait_for(lambda: AsyncResult(first.id, app=app).state == "STARTED",
                 timeout_seconds=120, message="the first run to hold the lock")
        second = hold.delay(slot=slot)
        skipped = second.get(timeout=60)
        assert skipped["outcome"] == "SKIPPED"
        assert skipped["details"]["holder_task_id"] == first.id
        info = wait_for(lambda: info_of(second.id, "SKIPPED"), timeout_seconds=60,
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
        # Flower's own /metrics carries the tier depths too (Flower #1173).
        status, metrics = flower.get("/metrics")
        assert status == 200
        assert 'flower_queue_depth{queue="optional"} 6.0' in metrics.decode()

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


#: Flower's basic auth in the operator-action tests (a test value, not a secret).
OPERATOR = ("operator", "observe-actions")
AUTHORIZATION = "Basic " + base64.b64encode(":".join(OPERATOR).encode()).decode()


@pytest.fixture(scope="class")
def operator_flower(app: Any) -> Iterator[Any]:
    """One Flower behind basic auth for the class's tests, and a critical-tier worker
    booting meanwhile (each start costs seconds on a loaded machine)."""
    from jobs.embedded import free_port
    from tests.jobs.observe.conftest import Server
    from tests.support import Worker

    worker = Worker("critical", name="observe-actions", concurrency=1).start(wait=False)
    port = free_port()
    flower = Server(["flower"], port, {"JOBS_FLOWER_PORT": str(port),
                                       "FLOWER_BASIC_AUTH": ":".join(OPERATOR),
                                       "FLOWER_UNAUTHENTICATED_API": ""}, "flower-actions")
    try:
        flower.wait_ready("/healthcheck")
        yield flower
    finally:
        # Both shut down at once: each waits on its own process.
        with ThreadPoolExecutor(2) as pool:
            for stopped in [pool.submit(flower.stop), pool.submit(worker.stop)]:
                stopped.result()


def _dead_letter(engine: Any, run_id: str, n: int) -> int:
    """A pending dead letter of `counted(run_id, n)`, as the retry guard records one."""
    from resilience.deadletter import dead_letter
    from tests.jobs.observe.tasks_actions import counted

    return dead_letter(engine, task_name=counted.name, task_id=None, args=[run_id, n],
                       kwargs={}, guard="retry", reason="observe: vendor down", attempts=3,
                       tier="critical", queue="critical")


def _cancellation_rows(engine: Any, target: str) -> int:
    from sqlalchemy import text

    with engine.connect() as connection:
        return int(connection.execute(text(
            "SELECT count(*) FROM resilience_cancellations WHERE target = :target"),
            {"target": target}).scalar_one())


class TestOperatorActions:
    @pytest.mark.timeout(240)
    def test_an_operator_pauses_cancels_resumes_and_requeues_from_the_page(
        self, app: Any, engine: Any, redis_client: Any, operator_flower: Any,
    ) -> None:
        """Headless Chromium, behind Flower's basic auth, uses the page's forms: the tier
        pause is in Redis and a job sent meanwhile is deferred, not run; the job cancelled
        by id has its record and never runs (CANCELLED, stored before the `revoke` sent with
        it); after resume the deferred job runs once; the requeued dead letter is marked and
        its job runs once."""
        from celery.result import AsyncResult

        from jobs.platform import pause_backend
        from resilience.deadletter import get
        from resilience.pause import PauseSwitch, RedisPauseBackend
        from tests.jobs.observe.tasks_actions import counted

        run_id = uuid.uuid4().hex[:8]

        def runs(n: int) -> int:
            return int(redis_client.get(f"tests:observe:counted:{run_id}:{n}") or 0)

        letter = _dead_letter(engine, run_id, 3)
        switch = PauseSwitch(pause_backend(app))
        page = f"{operator_flower.url}/resilience?refresh=0"
        try:
            with Browser(headers={"Authorization": AUTHORIZATION}) as browser:
                browser.open(page)
                browser.submit("#pause-form", {"scope": "tier", "name": "critical",
                                               "reason": "observe: browser test"})
                assert "paused tier 'critical'" in browser.text("#flash")
                assert browser.evaluate("document.querySelector('#paused-tier-critical') !== null")
                assert redis_client.exists(RedisPauseBackend.key("tier", "critical"))
                assert [(p.scope, p.name, p.reason) for p in switch.describe()] == [
                    ("tier", "critical", "observe: browser test")]
                ARTIFACTS.mkdir(exist_ok=True)
                screenshot = ARTIFACTS / "resilience-actions.png"
                browser.screenshot(screenshot)
                assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

                # No worker process has read this task's switches yet (each reads them with
                # its first job of the task), so none holds a copy from before the pause.
                deferred = counted.delay(run_id, 1)
                cancelled = counted.delay(run_id, 2)
                browser.submit("#cancel-form", {"task_id": cancelled.id})
                assert browser.evaluate(
                    f"document.querySelector('[data-target=\"id:{cancelled.id}\"]') !== null")
                assert f"cancelled job {cancelled.id}" in browser.text("#flash")
                assert _cancellation_rows(engine, f"id:{cancelled.id}") == 1

                wait_for(lambda: deferred.state == "RETRY", timeout_seconds=60,
                         message="the paused tier's job deferred by the worker")
                assert runs(1) == 0 and runs(2) == 0

                browser.submit("#paused-tier-critical form")
                assert browser.evaluate("document.querySelector('#paused-none') !== null")
                assert "resumed tier 'critical'" in browser.text("#flash")
                assert switch.describe() == []

                browser.submit(f"#dead-letter-{letter} form")
                assert browser.evaluate(f"document.querySelector('#dead-letter-{letter}') === null")
                assert f"dead letter {letter} requeued as task" in browser.text("#flash")
        finally:
            switch.resume("tier", "critical")
        entry = get(engine, letter)
        assert entry.requeued_at is not None and entry.requeued_task_id
        assert AsyncResult(entry.requeued_task_id, app=app).get(timeout=60) == 3
        assert deferred.get(timeout=60) == 1
        # Deferred by the pause (RETRY, held with its countdown) when the page cancelled
        # it: its CANCELLED result is stored before Celery's revoke, which cannot replace a
        # final state (resilience.cancel.store_cancelled), so .get() never raises REVOKED.
        assert cancelled.get(timeout=60)["outcome"] == "CANCELLED"
        assert (runs(1), runs(2), runs(3)) == (1, 0, 1)

    @pytest.mark.timeout(120)
    def test_a_post_without_the_xsrf_token_is_refused_and_changes_nothing(
        self, app: Any, engine: Any, redis_client: Any, operator_flower: Any,
    ) -> None:
        """With the right basic auth but no (or a forged) XSRF token, every action answers
        403 and nothing changes; GET never acts; with the token, bad input is one line, a
        cancel by key is recorded, and /api/resilience lists it (and no pause)."""
        import requests

        from jobs.platform import pause_backend
        from resilience.deadletter import get
        from resilience.pause import PauseSwitch
        from tests.jobs.observe.tasks_actions import counted

        run_id = uuid.uuid4().hex[:8]
        letter = _dead_letter(engine, run_id, 4)
        task_id = str(uuid.uuid4())
        actions = f"{operator_flower.url}/resilience/actions"
        attempts = {"pause": {"scope": "tier", "name": "standard"},
                    "cancel": {"task_id": task_id}, "requeue": {"id": str(letter)}}
        with requests.Session() as session:
            session.auth = OPERATOR
            for action, form in attempts.items():
                refused = session.post(f"{actions}/{action}", data=form, timeout=30,
                                       allow_redirects=False)
                assert refused.status_code == 403, (action, refused.text[:300])
                forged = session.post(f"{actions}/{action}", data={**form, "_xsrf": "2|0|0|0"},
                                      cookies={"_xsrf": "2|1|1|1"}, timeout=30,
                                      allow_redirects=False)
                assert forged.status_code == 403, (action, forged.text[:300])
                assert session.get(f"{actions}/{action}", timeout=30).status_code == 405
            assert PauseSwitch(pause_backend(app)).describe() == []
            assert _cancellation_rows(engine, f"id:{task_id}") == 0
            assert get(engine, letter).requeued_at is None

            assert session.get(f"{operator_flower.url}/resilience?refresh=0",
                               timeout=30).status_code == 200
            token = {"X-XSRFToken": session.cookies["_xsrf"], "Accept": "application/json"}
            answers = {
                "pause": ({"scope": "tier", "name": "nope"}, 400,
                          "unknown tier 'nope'; tiers are critical, standard, optional"),
                "requeue": ({"id": "987654321"}, 404, "no dead letter with id 987654321"),
                "cancel": ({"task": counted.name, "key": f"{run_id}-7"}, 200,
                           f"cancelled the jobs of {counted.name} with key '{run_id}-7'"),
            }
            for action, (form, status, message) in answers.items():
                answer = session.post(f"{actions}/{action}", data=form, headers=token,
                                      timeout=30)
                assert answer.status_code == status, (action, answer.text[:300])
                assert message in answer.json()["message"], answer.json()
            assert requests.post(f"{actions}/pause", data={"name": "standard"}, headers=token,
                                 cookies=session.cookies, timeout=30).status_code == 401
            snapshot = session.get(f"{operator_flower.url}/api/resilience", timeout=30).json()
        assert "paused" not in snapshot["errors"] and "cancellations" not in snapshot["errors"]
        assert snapshot["paused"] == []
        assert f"key:{counted.name}:{run_id}-7" in [c["target"] for c in snapshot["cancellations"]]
        assert _cancellation_rows(engine, f"key:{counted.name}:{run_id}-7") == 1
        assert PauseSwitch(pause_backend(app)).describe() == []
