"""Debian's headless Chromium, driven as an operator would, through Playwright (its Python
package speaks the DevTools protocol; no browser download: it launches /usr/bin/chromium).

    with Browser(headers={"Authorization": ...}) as browser:
        browser.open(url)
        browser.submit("#pause-form", {"scope": "tier", "name": "critical"})
        assert "paused" in browser.text("#flash")
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import sync_playwright

from tests.support import wait_for

CHROMIUM = "/usr/bin/chromium"
#: Flags of a headless run (also used by tests that run Chromium's own CLI modes).
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync")


class BrowserError(Exception):
    """Raised when the page cannot be driven (a script throws, an element is missing)."""


class Browser:
    """One headless Chromium with one page.

    Args:
        headers: sent with every request the page makes (e.g. Flower's basic auth).
        window: viewport width and height in pixels.
        timeout_seconds: longest wait for a navigation or an element.
    """

    def __init__(self, *, headers: dict[str, str] | None = None,
                 window: tuple[int, int] = (1280, 1400), timeout_seconds: float = 60) -> None:
        assert Path(CHROMIUM).exists(), (
            f"{CHROMIUM} is missing: run scripts/ensure-chromium (make test does)")
        self.timeout_seconds = timeout_seconds
        self._playwright = sync_playwright().start()
        try:
            self._browser = self._playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True,
                args=[flag for flag in CHROMIUM_FLAGS if flag != "--headless"])
            context = self._browser.new_context(
                viewport={"width": window[0], "height": window[1]},
                extra_http_headers=headers or {})
            context.set_default_timeout(timeout_seconds * 1000)
            self.page = context.new_page()
        except BaseException:
            self._playwright.stop()
            raise

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        try:
            return self.page.evaluate(expression)
        except PlaywrightError as exc:
            raise BrowserError(f"{expression}: {exc}") from exc

    def wait_until(self, expression: str, *, timeout_seconds: float = 60) -> Any:
        """Poll `expression` until it is truthy; return its value."""
        return wait_for(lambda: self.evaluate(expression), timeout_seconds=timeout_seconds,
                        interval=0.1, message=f"the page: {expression}")

    def open(self, url: str) -> None:
        """Navigate and wait until the document has loaded."""
        self.page.goto(url, wait_until="load")

    def submit(self, form: str, fields: dict[str, str] | None = None,
               button: str = "button[type=submit]") -> None:
        """Fill a form's fields and click its button, as an operator would; return once the
        page the submission leads to has loaded."""
        scope = self.page.locator(form).first
        for name, value in (fields or {}).items():
            field = scope.locator(f"[name={json.dumps(name)}]").first
            if field.evaluate("e => e.tagName") == "SELECT":
                field.select_option(value)
            else:
                field.fill(value)
        with self.page.expect_navigation(wait_until="load"):
            scope.locator(button).first.click()

    def text(self, selector: str) -> str:
        """The text of the first element matching `selector` ('' when there is none)."""
        found = self.page.locator(selector)
        return (found.first.text_content() or "") if found.count() else ""

    def screenshot(self, path: Path) -> None:
        """Save the whole page (not only the viewport) as a PNG."""
        self.page.screenshot(path=str(path), full_page=True)

    def close(self) -> None:
        try:
            self._browser.close()
        finally:
            self._playwright.stop()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
