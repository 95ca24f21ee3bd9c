"""Schedules on the /resilience page, in headless Chromium: an entry edited (an interval
turned into a cron expression in Paris, its catch-up policy changed) and paused from its
row, and the table showing it; its own page with its runs and next fires, resumed there;
and the actions' refusals in one line."""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from resilience.schedules import (
    Cron,
    Interval,
    ScheduleNotFound,
    add,
    describe,
    next_fires,
    remove,
)
from tests.jobs.observe.browser import Browser

TASK = "tests.observe.idle"
#: The schedule rows as the page shows them: name -> its data-* attributes.
ROWS = """Object.fromEntries([...document.querySelectorAll('#schedules tbody tr')]
  .map(tr => [tr.id, {...tr.dataset}]))"""


@pytest.fixture()
def name(stores: Any) -> Iterator[str]:
    """A fresh runtime schedule (every hour, paused off), removed after the test."""
    chosen = f"page-{uuid.uuid4().hex[:8]}"
    add(stores, chosen, task=TASK, every=Interval(3600), args=[1])
    yield chosen
    with contextlib.suppress(ScheduleNotFound):
        remove(stores, chosen)


class TestSchedulesPage:
    @pytest.mark.timeout(120)
    def test_edit_and_pause_an_entry_on_the_page(self, app: Any, stores: Any, flower: Any,
                                                 name: str) -> None:
        """The edit form turns the hourly entry into `*/10 * * * *` in Paris with catch-up
        once, and the row shows it; the row's Pause button pauses it (the row says so, its
        Resume button replaces Pause); its page lists the next five fires, and its Resume
        form resumes it. Each step is in the table (`describe`) too."""
        row = f"#schedule-{name}"
        with Browser() as browser:
            browser.open(f"{flower.url}/resilience?refresh=0")
            assert browser.evaluate(ROWS)[f"schedule-{name}"] == {
                "paused": "false", "every": "every 3600s", "catchUp": "skip",
                "overlap": "allow", "lastOutcome": ""}

            browser.submit("#schedule-edit-form", {
                "name": name, "every": "*/10 * * * *", "timezone": "Europe/Paris",
                "catch_up": "once"})
            assert "edited" in browser.text("#flash"), browser.text("#flash")
            assert browser.evaluate(f"document.querySelector('{row}').dataset.every") == \
                "*/10 * * * * (Europe/Paris)"
            assert browser.evaluate(f"document.querySelector('{row}').dataset.catchUp") == \
                "once"
            summary = describe(stores, name)
            assert (summary.every, summary.catch_up.value, summary.overlap.value) == (
                Cron("*/10 * * * *", timezone="Europe/Paris"), "once", "allow")

            browser.submit(row, button="button:has-text('Pause')")
            assert "paused" in browser.text("#flash"), browser.text("#flash")
            assert browser.evaluate(f"document.querySelector('{row}').dataset.paused") == "true"
            assert "paused" in browser.text(f"{row} td:nth-child(5)")
            assert browser.evaluate(
                f"[...document.querySelectorAll('{row} button')].map(b => b.textContent)"
            ) == ["Resume", "Run now"]
            assert describe(stores, name).paused is True

            with browser.page.expect_navigation(wait_until="load"):
                browser.page.locator(f"{row} a").first.click()
            assert browser.page.url.endswith(f"/resilience/schedules/{name}")
            assert "(paused)" in browser.text("#detail-heading")
            shown = browser.evaluate("[...document.querySelectorAll('#next_fires tbody tr')]"
                                     ".map(tr => tr.children[1].textContent)")
            first = dt.datetime.strptime(shown[0], "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.UTC)
            assert first.minute % 10 == 0 and len(shown) == 5
            assert shown[1:] == [moment.strftime("%Y-%m-%d %H:%M:%S")
                                 for moment in next_fires(summary.every, first, 4)]
            browser.submit("#detail-schedule-resume")
            assert "resumed" in browser.text("#flash"), browser.text("#flash")
            assert browser.page.url.endswith(f"/resilience/schedules/{name}")
        assert describe(stores, name).paused is False

    @pytest.mark.timeout(60)
    def test_actions_refuse_in_one_line(self, app: Any, flower: Any, name: str) -> None:
        """With the page's XSRF token: an unknown name 404, a bad cron or time zone 400,
        each with its line; an unknown schedule's page 404; without the token 403."""
        import requests

        actions = f"{flower.url}/resilience/actions"
        with requests.Session() as session:
            assert session.get(f"{flower.url}/resilience/schedules/no-such-schedule",
                               timeout=30).status_code == 404
            refused = session.post(f"{actions}/schedule-pause", data={"name": name},
                                   timeout=30, allow_redirects=False)
            assert refused.status_code == 403
            session.get(f"{flower.url}/resilience?refresh=0", timeout=30)
            token = {"X-XSRFToken": session.cookies["_xsrf"], "Accept": "application/json"}
            for action, form, status, text in (
                ("schedule-pause", {"name": "no-such-schedule"}, 404, "no schedule named"),
                ("schedule-run-now", {"name": "no-such-schedule"}, 404, "no schedule named"),
                ("schedule-edit", {"name": name, "every": "61 * * * *"}, 400,
                 "minute '61': 61 is out of range 0-59"),
                ("schedule-edit", {"name": name, "every": "0 9 * * *",
                                   "timezone": "Mars/Base"}, 400, "unknown time zone"),
                ("schedule-edit", {"name": name}, 400, "nothing to change"),
                ("schedule-add", {"name": name, "task": TASK, "every": "30"}, 400,
                 "already exists"),
            ):
                answer = session.post(f"{actions}/{action}", data=form, headers=token,
                                      timeout=30)
                assert answer.status_code == status, (action, answer.text)
                assert text in answer.json()["message"], (action, answer.text)

    @pytest.mark.timeout(60)
    def test_a_name_with_spaces_and_slashes_has_its_page(self, stores: Any, flower: Any) -> None:
        """A Celery-style entry name ("add every 10 seconds", a slash too) gets a row link
        the page quotes, and that address answers the schedule's own page."""
        import re
        from urllib.parse import unquote

        import requests

        chosen = f"page {uuid.uuid4().hex[:8]} add/every 10 seconds"
        add(stores, chosen, task=TASK, every=Interval(3600), paused=True)
        try:
            page = requests.get(f"{flower.url}/resilience?refresh=0", timeout=30).text
            links = [unquote(link) for link in
                     re.findall(r'href="[^"]*/resilience/(schedules/[^"]+)"', page)]
            assert f"schedules/{chosen}" in links
            quoted = next(link for link in re.findall(
                r'href="([^"]*/resilience/schedules/[^"]+)"', page)
                if unquote(link).endswith(chosen))
            answer = requests.get(f"{flower.url}{quoted}" if quoted.startswith("/")
                                  else quoted, timeout=30)
            assert answer.status_code == 200, answer.text[:300]
            assert chosen in answer.text
        finally:
            remove(stores, chosen)
