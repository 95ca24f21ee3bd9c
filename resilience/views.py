"""Typed views of the guards' live state: what a status screen, a metrics scrape, a page or
a CLI renders, declared once by each package.

A `View` names a section (`breakers`), says which store it reads, how to read its rows
(`read(source)`: JSON-able, the `/api/resilience` document's section), how a table shows
them (`columns`), which metric families they export (`metrics`) and which operator actions
act on them (`actions`: each with its page forms, its row button and what it runs), and
optionally the page of one row (`detail`: its document, a figure, tables, the row actions).
Renderers (the platform's `jobs status`, `/metrics`, page and CLI)
walk a list of views and know no guard: adding a guard adds its view to that list.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

from resilience.redact import redact
from resilience.stores import Stores, stores_for

if TYPE_CHECKING:
    import redis
    from celery import Celery

logger = logging.getLogger("resilience.views")

Row = dict[str, Any]


def missing(section: Any) -> str | None:
    """Why `section` could not be read (its `unavailable` reason), or None when it was."""
    if isinstance(section, dict) and "unavailable" in section:
        return str(section["unavailable"])
    return None


def counted(counters: Any, guards: Iterable[str]) -> list[Row]:
    """The outcome counters of `guards` (none when the counters could not be read)."""
    wanted = set(guards)
    return ([c for c in counters if c.get("guard") in wanted]
            if isinstance(counters, list) else [])


def number(value: Any) -> str:
    """A cell for a count that may be unknown (`?`)."""
    return "?" if value is None else str(value)


def seconds(value: Any, suffix: str = "s") -> str:
    """A cell for a duration that may be absent (empty)."""
    return "" if value is None else f"{value}{suffix}"


def per_row(
    field: str, label: str = "name", rows: str = ""
) -> Callable[[Any, dict[str, Any]], Iterator[tuple[list[str], float]]]:
    """`Family.samples` of `field`, one per row (of `section[rows]`, or the section itself)
    labelled by its `label`; a row without a value exports none."""
    return lambda section, _: (([row[label]], row[field]) for row in
                               (section[rows] if rows else section) if row.get(field) is not None)


def marked(text: str, style: str, when: bool) -> str:
    """`text` in rich markup `style` when `when` (an open breaker, a full tier)."""
    return f"[{style}]{text}[/{style}]" if when else text


@dataclass(frozen=True, kw_only=True)
class Column:
    """One column of a view's table: its header and how a row reads in it."""

    header: str
    #: The cell text of a row (rich markup allowed); by default `number(row[key])`.
    text: Callable[[Row], str] | None = None
    key: str = ""
    justify: Literal["left", "right"] = "left"
    no_wrap: bool = False  #: a key or a time: never broken over lines

    def cell(self, row: Row) -> str:
        """The text of `row` in this column."""
        return self.text(row) if self.text else number(row.get(self.key or self.header))


@dataclass(frozen=True, kw_only=True)
class Family:
    """A Prometheus metric family a view exports, with its samples read from the section."""

    name: str
    help: str
    kind: Literal["gauge", "counter"] = "gauge"
    labels: tuple[str, ...] = ()
    #: (label values, value) pairs from the section and the whole snapshot.
    samples: Callable[[Any, dict[str, Any]], Iterable[tuple[Sequence[str], float]]]
    #: False: read from the snapshot's counters alone, exported even when the section is not.
    needs_section: bool = True


#: The reason an action records when the operator gives none.
PAGE_REASON = "by an operator on /resilience"
#: An action's submitted fields: name -> value ('' when left empty).
Submitted = dict[str, str]


class ActionRefused(Exception):
    """Raised by an action for input it refuses: a one-line message and an HTTP status."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, kw_only=True)
class Input:
    """One field of an action's form on the page."""

    name: str  #: the form field's name (what the action reads)
    hint: str = ""  #: the placeholder
    width: int = 4  #: of the form row's 12 columns
    choices: tuple[str, ...] = ()  #: a select of these (the first selected)
    required: bool = False
    numeric: bool = False
    #: The suggestions offered: `tasks` (registered tasks) or `names` (tiers and tasks).
    suggest: str = ""


@dataclass(frozen=True, kw_only=True)
class Form:
    """A form on the page that submits one action (its button says `button`)."""

    id: str  #: the form's element id
    button: str
    inputs: tuple[Input, ...]
    title: str = ""  #: a heading above the form, if any


@dataclass(frozen=True, kw_only=True)
class Action:
    """An operator action on a view's state: the page's POST action, its forms and a button
    on each row it applies to; the CLI command it mirrors calls the same library function."""

    name: str  #: the row button's label
    web: str  #: the page's POST action: `/resilience/actions/<web>`
    #: Performs the action for a submitted form; returns its one-line result.
    #: Raises ActionRefused for input it refuses.
    run: Callable[[Source, Submitted], str]
    forms: tuple[Form, ...] = ()
    #: The form fields that name a row's target (a button on each row), None for none.
    fields: Callable[[Row], dict[str, str]] | None = None
    #: The rows (and row pages) it applies to (a retry: failed runs), None for all.
    applies: Callable[[Row], bool] | None = None
    #: Bootstrap's colour of its buttons.
    style: str = "primary"
    #: Another action's form this action adds its button to (`formaction`), if any.
    joins: str = ""
    #: The HTTP status the page answers for an error `run` raises, by error class
    #: (others: 400 for a ResilienceError, 503 for a StorageError, 500 for the rest).
    statuses: dict[type[Exception], int] = field(default_factory=dict)


@dataclass(kw_only=True)
class Source:
    """What a view reads from: the app, its stores, its tiers, the fleet's counters."""

    app: Celery
    tiers: Sequence[str] = ()
    #: Every outcome counter as {outcome, tier, guard, name, value}, or an unavailable dict.
    counters: Any = None
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def stores(self) -> Stores:
        """The app's stores."""
        return stores_for(self.app)

    def redis(self) -> redis.Redis:
        """The shared guard-state Redis client."""
        return self.stores.redis()

    def counted(self, guards: Iterable[str]) -> list[Row]:
        """The counters of `guards` (none when the counters could not be read)."""
        return counted(self.counters, guards)

    @cached_property
    def guards(self) -> list[tuple[Any, Any]]:
        """(task, guard) for every execution guard of every registered guarded task."""
        found = []
        for name, task in sorted(self.app.tasks.items()):
            if name.startswith("celery.") or not hasattr(task, "pipelines"):
                continue
            try:
                execution, _ = task.pipelines()
            except Exception as exc:  # noqa: BLE001 - a broken task must not hide the view
                logger.warning("guards of %s unreadable: %s", name, redact(str(exc)))
                continue
            found.extend((task, guard) for guard in execution.guards)
        return found

    def guards_named(self, *names: str) -> list[tuple[Any, Any]]:
        """(task, guard) for the configured guards called one of `names`."""
        return [(task, guard) for task, guard in self.guards
                if getattr(guard, "name", None) in names]


@dataclass(frozen=True, kw_only=True)
class Detail:
    """The page of one row of a view (`/resilience/<view>/<key>`): its document, a figure,
    tables of the document, and the view's row actions as forms on it."""

    #: The row's key in the page's address (its id); the first cell of the row links there.
    key: Callable[[Row], str]
    #: The row's document for a key. Raises for an unknown key (`statuses` says how).
    read: Callable[[Source, str], Row]
    #: One line above the figure (`workflow 1f2e... orders: failed`).
    heading: Callable[[Row], str]
    #: A standalone SVG document drawn from the document, rendered as is: the package builds
    #: it and escapes every value it puts in (`resilience.workflows.svg`). None: no figure.
    figure: Callable[[Row], str] | None = None
    #: Tables of the document (each a View whose `rows` read the document).
    tables: tuple[View, ...] = ()
    #: The actions offered as forms on the page: each its first form's inputs, less the
    #: fields `fields` fills in (hidden) from the document.
    actions: tuple[Action, ...] = ()
    fields: Callable[[Row], dict[str, str]] | None = None
    #: The HTTP status a `read` error answers with, by error class (others: 500).
    statuses: dict[type[Exception], int] = field(default_factory=dict)
    #: Whether the row is still changing (a running workflow): the page then reloads itself
    #: every few seconds. None: never.
    live: Callable[[Row], bool] | None = None


@dataclass(frozen=True, kw_only=True)
class View:
    """One section of the platform's state, declared by the package that owns it."""

    name: str  #: the section's key in the snapshot (`breakers`)
    title: str  #: the table's title (`circuit breakers`)
    store: str  #: the store it reads: `redis`, `database` or `broker`
    read: Callable[[Source], Any]
    columns: tuple[Column, ...] | Callable[[Any], tuple[Column, ...]] = ()
    #: The table's rows from the section (by default the section itself, a list).
    rows: Callable[[Any], list[Row]] = list
    #: The count shown after the title (`paused (2)`), None for none.
    count: Callable[[Any], int] | None = None
    metrics: tuple[Family, ...] = ()
    actions: tuple[Action, ...] = ()
    #: The page: a row's element id, its `data-*` attributes, and the badge of a row that
    #: needs attention (FULL, OPEN), None when it does not.
    row_id: Callable[[Row], str] | None = None
    row_data: Callable[[Row], dict[str, str]] | None = None
    alert: Callable[[Row], str | None] | None = None
    empty: str = ""  #: what the page says for no rows (default `no <title>`)
    headers: bool = True  #: False: a table of (field, value) rows shows no header line
    #: The page of one row (its first cell links there), None for none.
    detail: Detail | None = None

    def columns_of(self, section: Any) -> tuple[Column, ...]:
        """The columns for `section` (a view may derive them from the data)."""
        return self.columns(section) if callable(self.columns) else self.columns

    def title_of(self, section: Any) -> str:
        """The title, with the row count when the view counts."""
        if self.count is None or missing(section):
            return self.title
        return f"{self.title} ({self.count(section)})"
