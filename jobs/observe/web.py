"""The resilience view inside Flower's own web app: `/resilience` (the page), its row pages
(`View.detail`), `POST /resilience/actions/<action>` (the views' `Action`s, XSRF token
required whatever the auth) and `/api/resilience` (JSON). See docs/observe.md (The web view).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from flower.api import BaseApiHandler
from flower.views import BaseHandler
from prometheus_client.core import REGISTRY, GaugeMetricFamily
from tornado import web
from tornado.ioloop import IOLoop

from jobs.observe.snapshot import VIEWS, collect, one_line, queue_depths
from jobs.tiers import TIERS
from resilience.errors import AdmissionError, ResilienceError, StorageError
from resilience.views import Action, ActionRefused, Detail, Row, Source, View, missing

if TYPE_CHECKING:
    from celery import Celery

#: Absolute, so Flower's template loader finds it while `{% extends "base.html" %}` still
#: resolves inside Flower's template folder.
PAGE_TEMPLATE = str(Path(__file__).parent / "templates" / "resilience.html")
#: One row's page (`View.detail`): a workflow and its graph.
DETAIL_TEMPLATE = str(Path(__file__).parent / "templates" / "resilience_detail.html")
#: Seconds the workers get to answer `inspect active` from the web view.
INSPECT_TIMEOUT_SECONDS = 0.5
#: Signed cookie carrying an action's one-line result to the page it redirects to.
FLASH_COOKIE = "resilience_flash"

logger = logging.getLogger("jobs.observe.web")


async def snapshot_of(app: Celery) -> dict[str, Any]:
    """The snapshot, collected on Flower's executor (the stores are blocking clients)."""
    return await IOLoop.current().run_in_executor(
        None, lambda: collect(app, inspect_timeout_seconds=INSPECT_TIMEOUT_SECONDS))


#: Rich markup the views put in cells (a red state, a yellow name): plain text on the page.
_MARKUP = re.compile(r"\[/?(?:bold )?(?:red|yellow|bold)\]")


def page_section(view: View, section: Any) -> dict[str, Any]:
    """A view's section as the page shows it: plain cells, row ids, `data-*`, the alert
    badge, the link to a row's own page and the row's action buttons (the template knows
    no guard)."""
    reason = missing(section)
    columns = () if reason else view.columns_of(section)
    row_actions = [action for action in view.actions if action.fields]
    return {"view": view, "unavailable": reason,
            "headers": [column.header for column in columns],
            "actions": row_actions, "rows": [
        {"id": view.row_id(row) if view.row_id else None,
         "data": view.row_data(row) if view.row_data else {},
         "alert": view.alert(row) if view.alert else None,
         "link": row_page(view, view.detail.key(row)) if view.detail else None,
         "cells": [_MARKUP.sub("", column.cell(row)) for column in columns],
         "actions": [(action, action.fields(row)) for action in row_actions
                     if action.fields and (action.applies is None or action.applies(row))]}
        for row in ([] if reason else view.rows(section))]}


class ResiliencePage(BaseHandler):
    """`/resilience`: every view's section, and the forms of the operator actions."""
    @web.authenticated
    async def get(self) -> None:
        snapshot = await snapshot_of(self.capp)
        # What the action forms suggest (`Input.suggest`): the guarded tasks (Flower.__init__
        # loaded the app's task modules), and tiers and tasks.
        tasks = sorted(name for name, task in self.capp.tasks.items() if hasattr(task, "pipelines"))
        self.render(PAGE_TEMPLATE, snapshot=snapshot,
                    suggestions={"tasks": tasks, "names": [*TIERS, *tasks]},
                    cards=page_forms(),
                    sections=[page_section(view, snapshot[view.name]) for view in VIEWS],
                    refresh_seconds=_refresh_seconds(self),
                    flash=_take_flash(self))


DETAILS: dict[str, View] = {view.name: view for view in VIEWS if view.detail}
#: A row page's address under /resilience, as an action form's `back` names it: the key is
#: percent-quoted (`row_page`), so any key (a schedule named "add every 10") has a page.
_ROW_PAGE = re.compile(r"([a-z_]+)/([A-Za-z0-9_.%~-]{1,1000})")


def row_page(view: View, key: str) -> str:
    """A row page's address under /resilience: `<view>/<quoted key>`."""
    return f"{view.name}/{quote(key, safe='')}"


def detail_forms(detail: Detail, document: Row) -> list[dict[str, Any]]:
    """The actions of a row's page (`Detail.actions`) that apply to its document, as
    forms: the fields naming the row hidden, the other inputs of the action's first form
    shown (`retry` from step N)."""
    hidden = detail.fields(document) if detail.fields else {}
    return [{"action": action, "hidden": hidden, "id": f"detail-{action.web}",
             "inputs": [field for form in action.forms[:1] for field in form.inputs
                        if field.name not in hidden]}
            for action in detail.actions
            if action.applies is None or action.applies(document)]


class ResilienceDetail(BaseHandler):
    """`/resilience/<view>/<key>`: one row's page (a workflow drawn as its graph), with the
    row's actions; an unknown key answers the view's declared status (404). A live row's
    page reloads itself (`?refresh=N`, 5 s by default, 0 never)."""
    @web.authenticated
    async def get(self, name: str, key: str) -> None:
        view = DETAILS.get(name)
        if view is None or view.detail is None:
            raise web.HTTPError(404, f"no page of {name!r}")
        detail = view.detail
        source = Source(app=self.capp, tiers=TIERS)
        try:
            document = await IOLoop.current().run_in_executor(None, detail.read, source, key)
        except Exception as exc:  # noqa: BLE001 - every failure is one line and a status
            status, error = failure(detail.statuses, exc, f"page {name}/{key}")
            self.set_status(status)
            page = {"error": error, "refresh_seconds": 0}  # the template reads no more then
        else:
            live = detail.live is not None and detail.live(document)
            page = {"error": None, "refresh_seconds": _refresh_seconds(self) if live else 0,
                    "heading": detail.heading(document),
                    "figure": detail.figure(document) if detail.figure else "",
                    "tables": [page_section(table, document) for table in detail.tables],
                    "forms": detail_forms(detail, document)}
        self.render(DETAIL_TEMPLATE, view=view, key=key, back=row_page(view, key),
                    flash=_take_flash(self), **page)


class ResilienceJson(BaseApiHandler):
    """The same snapshot as JSON (what `jobs status --json` prints)."""
    @web.authenticated
    async def get(self) -> None:
        snapshot = await snapshot_of(self.capp)
        self.set_header("Content-Type", "application/json; charset=UTF-8")
        self.write(json.dumps(snapshot, default=str))


# -- operator actions ------------------------------------------------------------------------
#: POST name -> action: what the views offer (`View.actions`).
ACTIONS: dict[str, Action] = {action.web: action for view in VIEWS for action in view.actions}


def page_forms() -> list[list[dict[str, Any]]]:
    """The action forms, one card per view that has any: each form with the action it
    submits, the actions that join it (a second button) and its button's width."""
    cards = []
    for view in VIEWS:
        forms = [{"form": form, "action": action,
                  "joined": [other for other in view.actions if other.joins == form.id],
                  "button_width": 12 - sum(i.width for i in form.inputs) % 12}
                 for action in view.actions for form in action.forms]
        if forms:
            cards.append(forms)
    return cards


def failure(statuses: dict[type[Exception], int], exc: Exception, what: str) -> tuple[int, str]:
    """The HTTP status an error of a row page or an action answers with (`statuses` first),
    and its one line, logged (with the traceback when it is a 500)."""
    declared = [*statuses.items(), (AdmissionError, 409), (StorageError, 503),
                (ResilienceError, 400)]
    status = next((status for kind, status in declared if isinstance(exc, kind)), 500)
    message = one_line(exc, 500)
    if isinstance(exc, ActionRefused):
        status, message = exc.status, str(exc)
    (logger.exception if status == 500 else logger.warning)("resilience %s: %s", what, message)
    return status, message


class ResilienceAction(BaseHandler):
    """`POST /resilience/actions/<action>`: one operator action, then back to the page with
    a one-line result (or that line as JSON for an `Accept: application/json` client)."""
    def check_xsrf_cookie(self) -> None:
        """Flower's cross-site refusals, then tornado's token check, whatever the auth (tornado
        calls this before every POST: Flower's settings set `xsrf_cookies`)."""
        super().check_xsrf_cookie()
        web.RequestHandler.check_xsrf_cookie(self)

    @web.authenticated
    async def post(self, name: str) -> None:
        action = ACTIONS.get(name)
        if action is None:
            raise web.HTTPError(404, f"no action {name!r}; actions are {', '.join(ACTIONS)}")
        form = {key: self.get_body_argument(key, "") for key in self.request.body_arguments
                if key != "_xsrf"}
        try:
            # Bulk requeue and cancel-by-key look tasks up by name: Flower loaded them.
            message = await IOLoop.current().run_in_executor(
                None, action.run, Source(app=self.capp, tiers=TIERS), form)
            status = 200
        except Exception as exc:  # noqa: BLE001 - every failure becomes one line, not a trace
            status, message = failure(action.statuses, exc, f"action {name} refused")
        else:
            logger.info("resilience action %s: %s", name, message)
        if "application/json" in self.request.headers.get("Accept", ""):
            self.set_status(status)
            self.finish({"ok": status == 200, "action": name, "message": message})  # as JSON
            return
        self.set_signed_cookie(FLASH_COOKIE, json.dumps({"ok": status == 200, "message": message}),
                               expires_days=None, path="/", httponly=True, samesite="Strict")
        self.redirect(self._page_url(form.get("refresh"), form.get("back", "")), status=303)

    def _page_url(self, refresh: str | None, back: str = "") -> str:
        """The page to go back to: /resilience, or the row page a form came from (`back`:
        only a row page of a view that has them, never another address)."""
        prefix = (self.application.options.url_prefix or "").strip("/")
        page = f"/{prefix}/resilience" if prefix else "/resilience"
        row_page = _ROW_PAGE.fullmatch(back)
        if row_page and row_page.group(1) in DETAILS:
            return f"{page}/{back}"
        return f"{page}?refresh={refresh}" if refresh and refresh.isdigit() else page


def _take_flash(handler: BaseHandler) -> dict[str, Any] | None:
    """The last action's result, shown once (the cookie is cleared, not platform state)."""
    raw = handler.get_signed_cookie(FLASH_COOKIE, max_age_days=1)
    if raw is None:  # none, or not signed with this Flower's secret: not ours
        return None
    handler.clear_cookie(FLASH_COOKIE, path="/")
    return json.loads(raw)  # as ResilienceAction.post wrote it


def _refresh_seconds(handler: BaseHandler) -> int:
    try:
        return max(0, int(handler.get_argument("refresh", "5")))
    except ValueError:
        return 5


class QueueDepthCollector:
    """`flower_queue_depth{queue}` in Flower's own `/metrics` (Flower counts events, never
    the broker's queues: Flower #1173), read at each scrape; empty when the broker is not."""
    def __init__(self, app: Celery) -> None:
        self.app = app

    def collect(self) -> Iterator[Any]:
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
    """Run Flower for `app` with the resilience view: Flower's own command body with its
    options (`argv`: `--address=...`; FLOWER_* variables apply too), handlers added."""
    from flower import command
    from flower.app import Flower, rewrite_handler
    from flower.urls import settings
    from tornado.options import options

    command.apply_env_options()
    command.apply_options(sys.argv[0], argv)
    command.extract_settings()
    command.setup_logging()
    flower_app = Flower(capp=app, options=options, **settings)
    # The resilience handlers, under Flower's url_prefix as its own, before its catch-all 404.
    rules = [(r"/resilience/?", ResiliencePage),
             (r"/resilience/actions/([a-z-]+)", ResilienceAction),
             (rf"/resilience/(?!actions/){_ROW_PAGE.pattern}/?", ResilienceDetail),
             (r"/api/resilience/?", ResilienceJson)]
    if options.url_prefix:
        rules = [rewrite_handler(rule, options.url_prefix) for rule in rules]
    flower_app.add_handlers(r".*", rules)
    REGISTRY.register(QueueDepthCollector(app))
    atexit.register(flower_app.stop)
    signal.signal(signal.SIGTERM, command.sigterm_handler)
    port = flower_app.start_http_server()
    command.print_banner(app, "ssl_options" in settings, port)
    command.logger.info("Resilience view: /resilience (JSON: /api/resilience; actions: "
                        "POST /resilience/actions/<action>)")
    with contextlib.suppress(KeyboardInterrupt, SystemExit):
        flower_app.start()
