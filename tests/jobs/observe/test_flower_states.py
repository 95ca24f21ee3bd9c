"""Stopped jobs in Flower's task list: a REPLAYED and a SHED job show their own labels, not
SUCCESS, read by Debian's headless Chromium from the page an operator opens."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest

from tests.jobs.observe.browser import Browser
from tests.support import ARTIFACTS, wait_for

#: The state badge in the row of one task id on Flower's /tasks page, or null.
BADGE_OF = """(() => {{
    const link = document.querySelector('#tasks-table a[href$="/task/{task_id}"]');
    const badge = link && link.closest('tr').querySelector('span.badge');
    return badge ? badge.textContent.trim() : null;
}})()"""


class TestStoppedJobsInFlower:
    @pytest.mark.timeout(240)
    def test_replayed_and_shed_jobs_show_their_own_labels(
        self, app: Any, worker_factory: Any, start_server: Any
    ) -> None:
        """Flower's task list labels a replayed duplicate REPLAYED and an expired job SHED
        (Celery's event state makes `task-replayed` / `task-shed` custom states), while
        their `.get()` answers at once: the first call's value, the SHED outcome dict."""
        from tests.jobs.observe.tasks import remember

        flower = start_server("flower")
        worker_factory("standard", name="observe-states", concurrency=1)
        key = f"states-{uuid.uuid4().hex[:8]}"
        ran = remember.delay(key=key, value=4)
        assert ran.get(timeout=60) == {"key": key, "value": 4}
        replayed = remember.delay(key=key, value=4)
        assert replayed.get(timeout=60) == {"key": key, "value": 4}
        shed = remember.apply_async(kwargs={"key": f"{key}-late", "value": 1},
                                    headers={"deadline": time.time() - 1})
        assert shed.get(timeout=60)["outcome"] == "SHED"

        def state_of(task_id: str, wanted: str) -> dict[str, Any] | None:
            status, body = flower.get(f"/api/task/info/{task_id}")
            info = json.loads(body) if status == 200 else {}
            return info if info.get("state") == wanted else None

        info = wait_for(lambda: state_of(replayed.id, "REPLAYED"), timeout_seconds=60,
                        message="Flower to record the REPLAYED state")
        assert "'value': 4" in info["result"]  # the replayed value, as Flower shows results
        assert info["runtime"] is not None and info["runtime"] >= 0
        info = wait_for(lambda: state_of(shed.id, "SHED"), timeout_seconds=60,
                        message="Flower to record the SHED state")
        assert "deadline" in info["result"]
        assert wait_for(lambda: state_of(ran.id, "SUCCESS"), timeout_seconds=60,
                        message="Flower to record the run as SUCCESS")

        with Browser() as browser:
            def labels() -> dict[str, str] | None:
                browser.open(f"{flower.url}/tasks")
                found = {name: browser.wait_until(BADGE_OF.format(task_id=result.id),
                                                  timeout_seconds=15)
                         for name, result in (("ran", ran), ("replayed", replayed),
                                              ("shed", shed))}
                return found if all(found.values()) else None

            shown = wait_for(labels, timeout_seconds=90, interval=1,
                             message="the three jobs in Flower's task list")
            ARTIFACTS.mkdir(exist_ok=True)
            browser.screenshot(ARTIFACTS / "flower-stopped-states.png")
        assert shown == {"ran": "SUCCESS", "replayed": "REPLAYED", "shed": "SHED"}
