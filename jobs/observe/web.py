"""The resilience view inside Flower's own web app: `/resilience` (page) and `/api/resilience`.

No second web framework: the handlers subclass Flower's `BaseHandler` / `BaseApiHandler`,
so Flower's basic auth / OAuth apply (`tornado.web.authenticated`, as Flower's own views
use), the JSON endpoint follows Flower's API rule (open without auth only with
`FLOWER_UNAUTHENTICATED_API=true`), and the page extends Flower's `base.html` and navbar.
`run_flower()` is Flower's own command body (same options, environment variables and
banner) with the handlers added to the application before it starts serving.

Operator actions (`POST /resilience/actions/<action>`: pause, resume, cancel, requeue,
requeue-bulk) call the library functions the `jobs` CLI commands call; each adapter below
is a few lines, so it can be re-pointed when the library moves. Every POST needs tornado's
XSRF token (the `_xsrf` cookie echoed in the form field `_xsrf` or the `X-XSRFToken`
header), whatever Flower's auth: Flower's own check skips the token under basic auth, and
a browser sends cached basic credentials on a cross-site POST too. GET never changes state.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import re
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flower.api import BaseApiHandler
from flower.views import BaseHandler
from tornado import web
from tornado.ioloop import IOLoop

from jobs.admin.cancel import cancel_job
from jobs.observe.snapshot import VIEWS, collect, queue_depths
from jobs.platform import cancellations, pause_backend
from jobs.tiers import TIERS
from resilience.deadletter import Selection, requeue_many
from resilience.deadletter.bulk import parse_since
from resilience.deadletter.place import (  # `requeue` of place: the package shadows it
    DeadLetterNotFound,
    DeadLetterNotRunnable,
    requeue,
)
from resilience.errors import AdmissionError, ResilienceError, StorageError
from resilience.pause import PauseSwitch
from resilience.redact import redact
from resilience.stores import stores_for
from resilience.views import missing

if TYPE_CHECKING:
    from celery import Celery
    from flower.app import Flower

#: Absolute, so Flower's template loader finds it while `{% extends "base.html" %}` still
#: resolves inside Flower's template folder.
PAGE_TEMPLATE = str(Path(__file__).parent / "templates" / "resilience.html")
#: Seconds the workers get to answer `inspect active` from the web view.
INSPECT_TIMEOUT_SECONDS = 0.5
#: Signed cookie carrying an action's one-line result to the page it redirects to.
FLASH_COOKIE = "resilience_flash"
#: The reason recorded when the operator gives none (as the CLI's default).
DEFAULT_REASON = "by an operator on /resilience"

logger = logging.getLogger("jobs.observe.web")


async def snapshot_of(app: Celery) -> dict[str, Any]:
    """The snapshot, collected on Flower's executor (the stores are blocking clients)."""
    return await IOLoop.current().run_in_executor(
        None, lambda: collect(app, inspect_timeout_seconds=INSPECT_TIMEOUT_SECONDS))


def page_extras(app: Celery) -> dict[str, Any]:
    """What only the page needs beyond the snapshot: the action forms' choices."""
    _load_tasks(app)
    tasks = sorted(name for name, task in app.tasks.items() if hasattr(task, "pipelines"))
    return {"tiers": list(TIERS), "tasks": tasks}


#: Rich markup the views put in cells (a red state, a yellow name): plain text on the page.
_MARKUP = re.compile(r"\[/?(?:bold )?(?:red|yellow|bold)\]")


def page_sections(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    """Each view's section as the page shows it: plain cells, row ids, `data-*`, the
    alert badge and the row's action buttons (the template knows no guard)."""
    sections = []
    for view in VIEWS:
        section = snapshot[view.name]
        reason = missing(section)
        columns = () if reason else view.columns_of(section)
        row_actions = [action for action in view.actions if action.fields]
        sections.append({"view": view, "unavailable": reason,
                         "headers": [column.header for column in columns],
                         "actions": row_actions, "rows": [
            {"id": view.row_id(row) if view.row_id else None,
             "data": view.row_data(row) if view.row_data else {},
             "alert": view.alert(row) if view.alert else None,
             "cells": [_MARKUP.sub("", column.cell(row)) for column in columns],
             "actions": [(action, action.fields(row)) for action in row_actions
                         if action.fields]}
            for row in ([] if reason else view.rows(section))]})
    return sections


class ResiliencePage(BaseHandler):
    """Tiers (FULL at the limit), pauses, cancellations, breakers, budgets, limits, locks,
    idempotency, beat leader, pending dead letters; and the forms of the operator actions."""
    @web.authenticated
    async def get(self) -> None:
        snapshot = await snapshot_of(self.capp)
        extras = await IOLoop.current().run_in_executor(None, page_extras, self.capp)
        self.render(PAGE_TEMPLATE, snapshot=snapshot, extras=extras,
                    sections=page_sections(snapshot),
                    refresh_seconds=_refresh_seconds(self),
                    flash=self._take_flash())

    def _take_flash(self) -> dict[str, Any] | None:
        """The last action's result, shown once (the cookie is cleared, not platform state)."""
        raw = self.get_signed_cookie(FLASH_COOKIE, max_age_days=1)
        if raw is None:
            return None
        self.clear_cookie(FLASH_COOKIE, path="/")
        try:
            flash = json.loads(raw)
            return {"ok": bool(flash["ok"]), "message": str(flash["message"])}
        except (ValueError, KeyError, TypeError):
            return None


class ResilienceJson(BaseApiHandler):
    """The same snapshot as JSON (what `jobs status --json` prints)."""
    @web.authenticated
    async def get(self) -> None:
        snapshot = await snapshot_of(self.capp)
        self.set_header("Content-Type", "application/json; charset=UTF-8")
        self.write(json.dumps(snapshot, default=str))


# -- operator actions ------------------------------------------------------------------------
class BadAction(Exception):
    """Raised by an action adapter for input it refuses: a one-line message and an HTTP status."""
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


Form = dict[str, str]


def _load_tasks(app: Celery) -> None:
    """Register the app's task modules in this process once, as the CLI does before acting
    (bulk requeue and cancel-by-key look tasks up by name)."""
    if not getattr(app, "_resilience_web_loaded", False):
        app.loader.import_default_modules()
        app._resilience_web_loaded = True  # type: ignore[attr-defined]


def _pause_target(app: Celery, form: Form, *, pausing: bool) -> tuple[str, str]:
    """(scope, name) of a pause form, checked as `jobs pause` checks it; an unknown task is
    refused too when pausing (a typo would pause nothing), never when resuming."""
    scope, name = form.get("scope") or "tier", form.get("name", "")
    if scope not in ("tier", "task") or not name:
        raise BadAction("name a tier (critical) or a task (scope task, its registered name)")
    if scope == "tier" and name not in TIERS:
        raise BadAction(f"unknown tier {name!r}; tiers are {', '.join(TIERS)}")
    if scope == "task" and pausing:
        _load_tasks(app)
        if name not in app.tasks:
            raise BadAction(f"unknown task {name!r}: no task of that name is registered")
    return scope, name


def pause_action(app: Celery, form: Form) -> str:
    """`jobs pause TIER` / `jobs pause --task NAME`."""
    scope, name = _pause_target(app, form, pausing=True)
    PauseSwitch(pause_backend(app)).pause(scope, name,
                                          reason=form.get("reason") or DEFAULT_REASON)
    return f"paused {scope} {name!r}: its jobs wait (within 1 s on every worker)"


def resume_action(app: Celery, form: Form) -> str:
    """`jobs resume TIER` / `jobs resume --task NAME`."""
    scope, name = _pause_target(app, form, pausing=False)
    was = PauseSwitch(pause_backend(app)).resume(scope, name)
    return f"resumed {scope} {name!r}" if was else f"{scope} {name!r} was not paused"


def cancel_action(app: Celery, form: Form) -> str:
    """`jobs cancel ID` / `jobs cancel --task NAME --key KEY` (record, mark, and `revoke`)."""
    task_id, task, key = form.get("task_id", ""), form.get("task", ""), form.get("key", "")
    reason = form.get("reason") or f"cancelled {DEFAULT_REASON}"
    if task_id and not (task or key):

        cancel_job(app, task_id, reason=reason)  # record, mark, CANCELLED result, revoke
        return f"cancelled job {task_id}: it will not start on any worker"
    if not task_id and task and key:
        _load_tasks(app)
        known = app.tasks.get(task)
        if known is not None and not getattr(known, "cancel_key", None):
            raise BadAction(f"task {task!r} declares no cancel_key, so no job of it has a "
                            "key; cancel by task id")
        cancellations(app).cancel_key(task, key, reason=reason)
        return f"cancelled the jobs of {task} with key {key!r}"
    raise BadAction("give a task id, or both a task name and a key")


def requeue_action(app: Celery, form: Form) -> str:
    """`jobs dead-letters requeue ID`."""
    text = form.get("id", "")
    if not text.isdigit():
        raise BadAction(f"a dead-letter id is a number, got {text!r}")
    _load_tasks(app)
    task_id = requeue(stores_for(app).engine(), app, int(text))
    return f"dead letter {text} requeued as task {task_id}"


def requeue_bulk_action(app: Celery, form: Form) -> str:
    """`jobs dead-letters requeue --task NAME --reason TEXT [--since WHEN]`: once per row."""
    since = form.get("since")
    selection = Selection(task_name=form.get("task") or None,
                          reason=form.get("reason") or None,
                          since=parse_since(since) if since else None)
    if selection.empty:
        raise BadAction("name the dead letters to requeue: a task, a reason text or a since")
    _load_tasks(app)
    report = requeue_many(stores_for(app).engine(), app, selection)
    message = (f"requeued {len(report.requeued)} dead letters (written to the outbox; the "
               "relay publishes them)")
    if report.skipped:
        reasons = "; ".join(f"{len(ids)} {why}" for why, ids in sorted(report.skipped.items()))
        message += f"; skipped {report.skipped_count}, left pending: {reasons}"
    return message


#: URL name -> adapter: the actions the page offers.
ACTIONS: dict[str, Callable[[Celery, Form], str]] = {
    "pause": pause_action,
    "resume": resume_action,
    "cancel": cancel_action,
    "requeue": requeue_action,
    "requeue-bulk": requeue_bulk_action,
}


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    text = redact(lines[0]) if lines else ""
    return f"{type(exc).__name__}: {text}"[:500] if text else type(exc).__name__


def _status_of(exc: BaseException) -> int:
    """The HTTP status an action's error answers with."""
    if isinstance(exc, BadAction):
        return exc.status
    if isinstance(exc, DeadLetterNotFound):
        return 404
    if isinstance(exc, DeadLetterNotRunnable | AdmissionError):
        return 409
    if isinstance(exc, StorageError):
        return 503
    return 400 if isinstance(exc, ResilienceError) else 500


class ResilienceAction(BaseHandler):
    """`POST /resilience/actions/<action>`: one operator action, then back to the page with
    a one-line result (or that line as JSON for an `Accept: application/json` client)."""
    def check_xsrf_cookie(self) -> None:
        """Flower's cross-site refusals, then tornado's token check, whatever the auth."""
        super().check_xsrf_cookie()
        web.RequestHandler.check_xsrf_cookie(self)

    def prepare(self) -> None:
        # Tornado checks the token before prepare() when the app sets `xsrf_cookies` (Flower
        # does); an app that does not still gets it checked here.
        if self.request.method == "POST" and not self.settings.get("xsrf_cookies"):
            self.check_xsrf_cookie()

    @web.authenticated
    async def post(self, name: str) -> None:
        action = ACTIONS.get(name)
        if action is None:
            raise web.HTTPError(404, f"no action {name!r}; actions are {', '.join(ACTIONS)}")
        form = {key: self.get_body_argument(key, "") for key in self.request.body_arguments
                if key != "_xsrf"}
        try:
            message = await IOLoop.current().run_in_executor(None, action, self.capp, form)
            ok, status = True, 200
        except Exception as exc:  # noqa: BLE001 - every failure becomes one line, not a trace
            ok, status, message = False, _status_of(exc), (
                str(exc) if isinstance(exc, BadAction) else _one_line(exc))
            log = logger.exception if status == 500 else logger.warning
            log("resilience action %s refused: %s", name, message)
        else:
            logger.info("resilience action %s: %s", name, message)
        if "application/json" in self.request.headers.get("Accept", ""):
            self.set_status(status)
            self.set_header("Content-Type", "application/json; charset=UTF-8")
            self.finish(json.dumps({"ok": ok, "action": name, "message": message}))
            return
        self.set_signed_cookie(FLASH_COOKIE, json.dumps({"ok": ok, "message": message}),
                               expires_days=None, path="/", httponly=True, samesite="Strict")
        self.redirect(self._page_url(form.get("refresh")), status=303)

    def _page_url(self, refresh: str | None) -> str:
        prefix = (self.application.options.url_prefix or "").strip("/")
        page = f"/{prefix}/resilience" if prefix else "/resilience"
        return f"{page}?refresh={refresh}" if refresh and refresh.isdigit() else page


def _refresh_seconds(handler: BaseHandler) -> int:
    try:
        return max(0, int(handler.get_argument("refresh", "5")))
    except ValueError:
        return 5


def handlers() -> list[tuple[str, type]]:
    """The URL rules this module adds to Flower."""
    return [(r"/resilience/?", ResiliencePage),
            (r"/resilience/actions/([a-z-]+)", ResilienceAction),
            (r"/api/resilience/?", ResilienceJson)]


def add_resilience_handlers(flower_app: Flower) -> None:
    """Add the resilience page, its actions and the API to a Flower application (before its
    catch-all 404)."""
    from flower.app import rewrite_handler

    rules = handlers()
    prefix = getattr(flower_app.options, "url_prefix", None)
    if prefix:
        rules = [rewrite_handler(rule, prefix) for rule in rules]
    flower_app.add_handlers(r".*", rules)


class QueueDepthCollector:
    """`flower_queue_depth{queue}` in Flower's own `/metrics` (Flower #1173: Flower counts
    events, never the broker's queues): messages waiting per tier queue, read from the
    broker at each scrape (`jobs.observe.snapshot.queue_depths`: one pipelined LLEN on
    Redis). A broker that cannot be read leaves the family empty for that scrape."""
    def __init__(self, app: Celery) -> None:
        self.app = app

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily


        family = GaugeMetricFamily("flower_queue_depth", "Messages waiting in the queue",
                                   labels=["queue"])
        try:
            depths = queue_depths(self.app, TIERS)
        except Exception as exc:  # noqa: BLE001 - a scrape never fails on the broker
            logger.warning("flower_queue_depth: broker not readable: %s", exc)
            depths = {}
        for queue, depth in depths.items():
            family.add_metric([queue], depth)
        yield family


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
    from prometheus_client import REGISTRY

    REGISTRY.register(QueueDepthCollector(app))
    atexit.register(flower_app.stop)
    signal.signal(signal.SIGTERM, command.sigterm_handler)
    port = flower_app.start_http_server()
    command.print_banner(app, "ssl_options" in settings, port)
    command.logger.info("Resilience view: /resilience (JSON: /api/resilience; actions: "
                        "POST /resilience/actions/<action>)")
    with contextlib.suppress(KeyboardInterrupt, SystemExit):
        flower_app.start()
