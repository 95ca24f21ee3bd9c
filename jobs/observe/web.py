"""The resilience view inside Flower's own web app: `/resilience` (page) and `/api/resilience`.

No second web framework: the handlers subclass Flower's `BaseHandler` / `BaseApiHandler`,
so Flower's basic auth / OAuth apply (`tornado.web.authenticated`, as Flower's own views
use), the JSON endpoint follows Flower's API rule (open without auth only with
`FLOWER_UNAUTHENTICATED_API=true`), and the page extends Flower's `base.html` and navbar.
`run_flower()` is Flower's own command body (same options, environment variables and
banner) with the two handlers added to the application before it starts serving.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flower.api import BaseApiHandler
from flower.views import BaseHandler
from tornado import web
from tornado.ioloop import IOLoop

from jobs.observe.snapshot import collect

if TYPE_CHECKING:
    from celery import Celery
    from flower.app import Flower

#: Absolute, so Flower's template loader finds it while `{% extends "base.html" %}` still
#: resolves inside Flower's template folder.
PAGE_TEMPLATE = str(Path(__file__).parent / "templates" / "resilience.html")
#: Seconds the workers get to answer `inspect active` from the web view.
INSPECT_TIMEOUT_SECONDS = 0.5


async def snapshot_of(app: Celery) -> dict[str, Any]:
    """The snapshot, collected on Flower's executor (the stores are blocking clients)."""
    return await IOLoop.current().run_in_executor(
        None, lambda: collect(app, inspect_timeout_seconds=INSPECT_TIMEOUT_SECONDS))


class ResiliencePage(BaseHandler):
    """Tiers (FULL at the limit), breakers, budgets, limits, locks, idempotency, beat leader."""

    @web.authenticated
    async def get(self) -> None:
        snapshot = await snapshot_of(self.capp)
        self.render(PAGE_TEMPLATE, snapshot=snapshot, is_unavailable=_is_unavailable,
                    refresh_seconds=_refresh_seconds(self))


class ResilienceJson(BaseApiHandler):
    """The same snapshot as JSON (what `jobs status --json` prints)."""

    @web.authenticated
    async def get(self) -> None:
        snapshot = await snapshot_of(self.capp)
        self.set_header("Content-Type", "application/json; charset=UTF-8")
        self.write(json.dumps(snapshot, default=str))


def _is_unavailable(section: Any) -> str | None:
    if isinstance(section, dict) and "unavailable" in section:
        return str(section["unavailable"])
    return None


def _refresh_seconds(handler: BaseHandler) -> int:
    try:
        return max(0, int(handler.get_argument("refresh", "5")))
    except ValueError:
        return 5


def handlers() -> list[tuple[str, type]]:
    """The URL rules this module adds to Flower."""
    return [(r"/resilience/?", ResiliencePage), (r"/api/resilience/?", ResilienceJson)]


def add_resilience_handlers(flower_app: Flower) -> None:
    """Add the resilience page and API to a Flower application (before its catch-all 404)."""
    from flower.app import rewrite_handler

    rules = handlers()
    prefix = getattr(flower_app.options, "url_prefix", None)
    if prefix:
        rules = [rewrite_handler(rule, prefix) for rule in rules]
    flower_app.add_handlers(r".*", rules)


def run_flower(app: Celery, argv: list[str]) -> None:
    """Run Flower for `app` with the resilience view: Flower's own command, handlers added.

    Args:
        app: the Celery app Flower watches.
        argv: Flower's options (`--address=...`, `--port=...`); FLOWER_* variables apply too.
    """
    from flower import command
    from flower.app import Flower
    from flower.urls import settings
    from tornado.options import options

    command.apply_env_options()
    command.apply_options(sys.argv[0], argv)
    command.extract_settings()
    command.setup_logging()
    flower_app = Flower(capp=app, options=options, **settings)
    add_resilience_handlers(flower_app)
    atexit.register(flower_app.stop)
    signal.signal(signal.SIGTERM, command.sigterm_handler)
    port = flower_app.start_http_server()
    command.print_banner(app, "ssl_options" in settings, port)
    command.logger.info("Resilience view: /resilience (JSON: /api/resilience)")
    with contextlib.suppress(KeyboardInterrupt, SystemExit):
        flower_app.start()
