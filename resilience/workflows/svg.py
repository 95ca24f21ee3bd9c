"""A workflow drawn as its graph: one SVG document, rendered server-side from step summaries.

    svg = render(describe(stores, workflow_id).steps)

Steps are boxes in columns by depth (a step with no dependency is in column 0, any other one
column right of its deepest dependency), in position order down each column; an edge runs
from each dependency to its dependent; a box's colour is its state, and a step with a
compensation carries a dashed box under it coloured by the compensation's state. A legend
names every colour. The document needs no script and no stylesheet: a page inlines it (the
`/resilience` workflow page), a file holds it (`jobs workflows show ID --svg FILE`).

Its DOM is what tests and scripts read: each step is `<g class="step" data-position="3"
data-state="failed" data-task="shop.charge">` (`id="step-3"`), each compensation
`<g class="compensation" data-position="3" data-state="succeeded" data-task="shop.refund">`,
each edge `<path class="edge" data-from="0" data-to="3">`. A column with more than
`COLUMN_LIMIT` steps (a batch's members) draws its first ones and one `<g class="more"
data-count="N">` box for the rest, with their states counted.

Pure: it reads only the summaries (objects with `StepSummary`'s attributes, or their JSON
dicts) and never a store.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape, quoteattr

#: State -> (fill, stroke): Bootstrap's palette, so the page's badges and the graph agree.
STATE_COLOURS: dict[str, tuple[str, str]] = {
    "pending": ("#f8f9fa", "#adb5bd"),
    "queued": ("#cfe2ff", "#0d6efd"),
    "succeeded": ("#d1e7dd", "#198754"),
    "replayed": ("#c3f0e3", "#0f8a66"),
    "failed": ("#f8d7da", "#dc3545"),
    "dead_lettered": ("#f1aeb5", "#842029"),
    "cancelled": ("#ffe5d0", "#fd7e14"),
    "shed": ("#fff3cd", "#cc9a06"),
    "skipped": ("#e9ecef", "#6c757d"),
}
#: A state this module does not know (a newer engine's): drawn, and named in the legend.
OTHER_COLOURS = ("#ffffff", "#212529")
#: A compensation that has not run (the step succeeded; nothing failed yet).
NOT_RUN_COLOURS = ("#ffffff", "#adb5bd")

#: Geometry, in SVG user units (pixels at 100 %).
BOX_WIDTH = 172
BOX_HEIGHT = 44
COMPENSATION_HEIGHT = 22
COMPENSATION_GAP = 6
COLUMN_GAP = 56
ROW_GAP = 18
MARGIN = 16
LEGEND_ROW = 20
#: Narrowest document: room for the legend on a few lines under a one-column graph.
MIN_WIDTH = 560
FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif"
#: Steps drawn per column; the rest of a wider column is one "+ N more" box.
COLUMN_LIMIT = 24
#: Characters of a box's first line, `#3 charge` (the full task name is in its tooltip).
LABEL_CHARACTERS = 21


@dataclass(frozen=True)
class _Step:
    position: int
    task_name: str
    state: str
    depends_on: tuple[int, ...]
    error: str | None
    compensate: str | None
    compensation_state: str | None


def _field(step: Any, name: str, default: Any = None) -> Any:
    if isinstance(step, Mapping):
        return step.get(name, default)
    return getattr(step, name, default)


def _state(value: Any) -> str | None:
    """A state's name: an enum's value, or the string itself."""
    if value is None:
        return None
    return str(getattr(value, "value", value))


def _steps(steps: Sequence[Any]) -> list[_Step]:
    found = []
    for step in steps:
        compensate = _field(step, "compensate")
        found.append(_Step(
            position=int(_field(step, "position")),
            task_name=str(_field(step, "task_name") or "?"),
            state=_state(_field(step, "state")) or "pending",
            depends_on=tuple(int(d) for d in _field(step, "depends_on") or ()),
            error=_field(step, "error"),
            compensate=(None if compensate is None
                        else str(compensate if isinstance(compensate, str)
                                 else _field(compensate, "task", compensate))),
            compensation_state=_state(_field(step, "compensation_state"))))
    return sorted(found, key=lambda s: s.position)


def depths(steps: Sequence[Any]) -> dict[int, int]:
    """Each step's column: 0 with no dependency, else one more than its deepest dependency.

    A dependency on a position that is not among the steps is ignored, and so is the edge
    that would close a cycle (neither happens in a graph the engine wrote).
    """
    graph = {step.position: step.depends_on for step in _steps(steps)}
    found: dict[int, int] = {}
    for start in graph:
        # Iterative depth-first walk: a long chain must not hit the recursion limit.
        stack, entered = [start], {start}
        while stack:
            position = stack[-1]
            if position in found:
                stack.pop()
                continue
            waiting = [d for d in graph[position]
                       if d in graph and d not in found and d not in entered]
            if waiting:
                stack.extend(waiting)
                entered.update(waiting)
                continue
            known = [found[d] for d in graph[position] if d in found]
            found[position] = 1 + max(known) if known else 0
            stack.pop()
    return found


def _colours(state: str | None, *, compensation: bool = False) -> tuple[str, str]:
    if state is None:
        return NOT_RUN_COLOURS if compensation else STATE_COLOURS["pending"]
    return STATE_COLOURS.get(state, OTHER_COLOURS)


def _fit(text: str, characters: int = LABEL_CHARACTERS) -> str:
    return text if len(text) <= characters else text[:characters - 1] + "…"


def _short(name: str) -> str:
    """A task's name without its module (`shop.tasks.charge` -> `charge`)."""
    return name.rsplit(".", 1)[-1]


def _label(state: str) -> str:
    return state.replace("_", "-")


def _text(x: float, y: float, text: str, *, size: int = 12, weight: str = "normal",
          anchor: str = "start", fill: str = "#212529", role: str = "") -> str:
    klass = f' class="{role}"' if role else ""
    return (f'<text{klass} x="{x:g}" y="{y:g}" font-size="{size}" font-weight="{weight}" '
            f'text-anchor="{anchor}" fill="{fill}">{escape(text)}</text>')


@dataclass(frozen=True)
class _Box:
    x: float
    y: float

    @property
    def left(self) -> tuple[float, float]:
        return self.x, self.y + BOX_HEIGHT / 2

    @property
    def right(self) -> tuple[float, float]:
        return self.x + BOX_WIDTH, self.y + BOX_HEIGHT / 2


def render(steps: Sequence[Any], *, title: str = "") -> str:
    """The workflow's graph as a standalone SVG document (a string).

    Args:
        steps: the workflow's step summaries (`StepSummary` objects or their dicts): each
            with `position`, `task_name`, `state`, `depends_on`, and optionally `error`,
            `compensate` (a task name) and `compensation_state`.
        title: the document's accessible title (`<title>`), e.g. the workflow's name.
    """
    parsed = _steps(steps)
    by_position = {step.position: step for step in parsed}
    column_of = depths(parsed)
    columns: dict[int, list[_Step]] = {}
    for step in parsed:
        columns.setdefault(column_of[step.position], []).append(step)
    compensations = any(step.compensate for step in parsed)
    slot = BOX_HEIGHT + ROW_GAP + (COMPENSATION_GAP + COMPENSATION_HEIGHT if compensations
                                   else 0)

    # Which steps each column draws, and the rest folded into its "+ N more" box.
    drawn: dict[int, list[_Step]] = {}
    folded: dict[int, list[_Step]] = {}
    for index, members in columns.items():
        if len(members) > COLUMN_LIMIT:
            drawn[index], folded[index] = members[:COLUMN_LIMIT - 1], members[COLUMN_LIMIT - 1:]
        else:
            drawn[index], folded[index] = members, []
    rows = max((len(drawn[i]) + (1 if folded[i] else 0) for i in columns), default=0)
    graph_height = rows * slot - ROW_GAP if rows else BOX_HEIGHT

    boxes: dict[int, _Box] = {}
    more: dict[int, _Box] = {}
    for index in columns:
        count = len(drawn[index]) + (1 if folded[index] else 0)
        top = MARGIN + (graph_height - (count * slot - ROW_GAP)) / 2
        x = MARGIN + index * (BOX_WIDTH + COLUMN_GAP)
        for row, step in enumerate(drawn[index]):
            boxes[step.position] = _Box(x, top + row * slot)
        if folded[index]:
            box = _Box(x, top + len(drawn[index]) * slot)
            more[index] = box
            for step in folded[index]:
                boxes.setdefault(step.position, box)

    width = max(MIN_WIDTH,
                MARGIN * 2 + max(len(columns), 1) * (BOX_WIDTH + COLUMN_GAP) - COLUMN_GAP)
    legend, legend_height = _legend(parsed, width, MARGIN * 2 + graph_height,
                                    compensations=compensations)
    height = MARGIN * 2 + graph_height + legend_height
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="workflow-graph" role="img" '
        f'width="{width:g}" height="{height:g}" viewBox="0 0 {width:g} {height:g}" '
        f'font-family="{FONT}" data-steps="{len(parsed)}">',
        f"<title>{escape(title or 'workflow graph')}</title>",
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" '
        'fill="#6c757d"/></marker></defs>',
    ]
    if not parsed:
        parts.append(_text(MARGIN, MARGIN + BOX_HEIGHT / 2, "no steps", fill="#6c757d"))
    parts.append('<g class="edges">')
    parts.extend(_edges(parsed, by_position, boxes))
    parts.append("</g>")
    parts.append('<g class="steps">')
    for index in columns:
        for step in drawn[index]:
            parts.append(_step(step, boxes[step.position]))
        if folded[index]:
            parts.append(_more(folded[index], more[index]))
    parts.append("</g>")
    parts.extend(legend)
    parts.append("</svg>")
    return "\n".join(parts)


def _edges(parsed: list[_Step], by_position: dict[int, _Step],
           boxes: dict[int, _Box]) -> list[str]:
    drawn: set[tuple[float, float, float, float]] = set()
    edges = []
    for step in parsed:
        for dependency in step.depends_on:
            if dependency not in by_position:
                continue
            (x1, y1), (x2, y2) = boxes[dependency].right, boxes[step.position].left
            if (x1, y1, x2, y2) in drawn:  # two folded steps share one box: one edge
                continue
            drawn.add((x1, y1, x2, y2))
            # A released edge (its dependency succeeded) is solid; one still waiting dashed.
            done = by_position[dependency].state in ("succeeded", "replayed")
            stroke, dash = ("#495057", "") if done else ("#adb5bd", ' stroke-dasharray="4 3"')
            bend = (x2 - x1) / 2
            edges.append(
                f'<path class="edge" data-from="{dependency}" data-to="{step.position}" '
                f'd="M {x1:g} {y1:g} C {x1 + bend:g} {y1:g}, {x2 - bend:g} {y2:g}, '
                f'{x2:g} {y2:g}" fill="none" stroke="{stroke}" stroke-width="1.5"{dash} '
                f'marker-end="url(#arrow)"/>')
    return edges


def _step(step: _Step, box: _Box) -> str:
    fill, stroke = _colours(step.state)
    tooltip = f"#{step.position} {step.task_name}: {step.state}"
    if step.depends_on:
        tooltip += f" (after {', '.join(f'#{d}' for d in step.depends_on)})"
    if step.error:
        tooltip += f"\n{step.error}"
    parts = [
        f'<g class="step" id="step-{step.position}" data-position="{step.position}" '
        f'data-state={quoteattr(step.state)} data-task={quoteattr(step.task_name)}>',
        f"<title>{escape(tooltip)}</title>",
        f'<rect x="{box.x:g}" y="{box.y:g}" width="{BOX_WIDTH}" height="{BOX_HEIGHT}" rx="6" '
        f'fill="{fill}" stroke="{stroke}" stroke-width="{2 if step.state != "pending" else 1}"/>',
        _text(box.x + 8, box.y + 18, _fit(f"#{step.position} {_short(step.task_name)}"),
              weight="600", role="name"),
        _text(box.x + 8, box.y + 35, _label(step.state), size=11, fill=stroke, role="state"),
    ]
    if step.compensate:
        parts.append(_compensation(step, box))
    parts.append("</g>")
    return "".join(parts)


def _compensation(step: _Step, box: _Box) -> str:
    fill, stroke = _colours(step.compensation_state, compensation=True)
    state = step.compensation_state or "not run"
    top = box.y + BOX_HEIGHT + COMPENSATION_GAP
    x = box.x + 14
    middle = box.x + BOX_WIDTH / 2
    return "".join([
        f'<g class="compensation" data-position="{step.position}" '
        f'data-state={quoteattr(step.compensation_state or "")} '
        f'data-task={quoteattr(step.compensate or "")}>',
        f"<title>{escape(f'compensation of #{step.position}: {step.compensate} ({state})')}"
        "</title>",
        f'<line x1="{middle:g}" y1="{box.y + BOX_HEIGHT:g}" x2="{middle:g}" y2="{top:g}" '
        f'stroke="{stroke}" stroke-dasharray="2 2"/>',
        f'<rect x="{x:g}" y="{top:g}" width="{BOX_WIDTH - 28}" height="{COMPENSATION_HEIGHT}" '
        f'rx="4" fill="{fill}" stroke="{stroke}" stroke-dasharray="4 2"/>',
        _text(x + 6, top + 15, _fit(f"↩ {_short(step.compensate or '')}: {_label(state)}", 24),
              size=10, fill="#212529"),
        "</g>",
    ])


def _more(steps: list[_Step], box: _Box) -> str:
    states = Counter(step.state for step in steps)
    counted = ", ".join(f"{_label(state)} {count}" for state, count in sorted(states.items()))
    worst = next((s for s in ("dead_lettered", "failed", "cancelled", "shed", "skipped",
                              "queued", "pending") if s in states), "succeeded")
    fill, stroke = _colours(worst)
    summary = ", ".join(f"{state}={count}" for state, count in sorted(states.items()))
    return "".join([
        f'<g class="more" data-count="{len(steps)}" data-states={quoteattr(summary)}>',
        f"<title>{escape(f'{len(steps)} more steps: {counted}')}</title>",
        f'<rect x="{box.x:g}" y="{box.y:g}" width="{BOX_WIDTH}" height="{BOX_HEIGHT}" rx="6" '
        f'fill="{fill}" stroke="{stroke}" stroke-dasharray="6 3"/>',
        _text(box.x + 8, box.y + 18, f"+ {len(steps)} more", weight="600"),
        _text(box.x + 8, box.y + 35, _fit(counted, 28),
              size=11, fill=stroke),
        "</g>",
    ])


def _legend(parsed: list[_Step], width: float, top: float, *,
            compensations: bool) -> tuple[list[str], float]:
    """Every known state's swatch (and any unknown state present), wrapped to `width`."""
    states = list(STATE_COLOURS)
    states += sorted({s.state for s in parsed} - set(states)
                     | ({s.compensation_state for s in parsed if s.compensation_state}
                        - set(states)))
    entries: list[tuple[str, str, tuple[str, str], bool]] = [
        (state, _label(state), _colours(state), False) for state in states]
    if compensations:
        entries.append(("compensation", "compensation (dashed)", NOT_RUN_COLOURS, True))
    parts = ['<g class="legend">']
    x, y = MARGIN, top
    for key, label, (fill, stroke), dashed in entries:
        entry_width = 22 + 7 * len(label) + 12
        if x + entry_width > width - MARGIN and x > MARGIN:
            x, y = MARGIN, y + LEGEND_ROW
        dash = ' stroke-dasharray="3 2"' if dashed else ""
        parts.append(
            f'<g class="legend-entry" data-state={quoteattr(key)}>'
            f'<rect x="{x:g}" y="{y:g}" width="14" height="14" rx="3" fill="{fill}" '
            f'stroke="{stroke}"{dash}/>' + _text(x + 20, y + 11, label, size=11) + "</g>")
        x += entry_width
    parts.append("</g>")
    return parts, (y - top) + LEGEND_ROW
