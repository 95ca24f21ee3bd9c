"""The workflow graph's SVG, from step summaries alone: columns by depth, one node per step
with its state, edges, compensations, a legend, and wide columns folded."""

from __future__ import annotations

import enum
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

from resilience.workflows.svg import COLUMN_LIMIT, STATE_COLOURS, depths, render

SVG = "{http://www.w3.org/2000/svg}"


def step(position: int, state: str = "succeeded", *after: int, task: str = "shop.step",
         **extra: Any) -> dict[str, Any]:
    return {"position": position, "task_name": task, "state": state,
            "depends_on": list(after), **extra}


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def groups(root: ET.Element, klass: str) -> list[ET.Element]:
    return [g for g in root.iter(f"{SVG}g") if g.get("class") == klass]


def box(group: ET.Element) -> tuple[float, float]:
    rect = group.find(f"{SVG}rect")
    assert rect is not None
    return float(rect.get("x", "nan")), float(rect.get("y", "nan"))


#: chain(a, group(b, c), d) with a failed `c`: what the engine writes for it.
CHAIN_GROUP = [step(0, "succeeded", task="shop.reserve", compensate="shop.release",
                    compensation_state="succeeded"),
               step(1, "succeeded", 0, task="shop.charge", compensate="shop.refund"),
               step(2, "dead_lettered", 0, task="shop.email", error="ValueError: no <such> & co"),
               step(3, "pending", 1, 2, task="shop.ship")]


class TestLayout:
    def test_columns_follow_the_deepest_dependency(self) -> None:
        """chain(a, group(b, c), d): a in column 0, b and c in 1, d in 2; a step after a
        chain inside a group goes right of the chain's end."""
        assert depths(CHAIN_GROUP) == {0: 0, 1: 1, 2: 1, 3: 2}
        nested = [step(0), step(1, "succeeded", 0), step(2, "succeeded", 1), step(3),
                  step(4, "pending", 2, 3)]
        assert depths(nested) == {0: 0, 1: 1, 2: 2, 3: 0, 4: 3}

    def test_boxes_sit_in_their_column_in_position_order(self) -> None:
        """Same column, same x; down a column in position order; columns left to right."""
        nodes = {int(g.get("data-position", -1)): box(g)
                 for g in groups(parse(render(CHAIN_GROUP)), "step")}
        assert nodes[1][0] == nodes[2][0] and nodes[1][1] < nodes[2][1]
        assert nodes[0][0] < nodes[1][0] < nodes[3][0]

    def test_a_long_chain_and_unknown_or_cyclic_dependencies_still_draw(self) -> None:
        """3,000 chained steps need no recursion; a dependency on a missing position is
        ignored and a cycle does not loop."""
        chain = [step(0)] + [step(i, "succeeded", i - 1) for i in range(1, 3000)]
        assert depths(chain)[2999] == 2999
        odd = [step(0, "pending", 1), step(1, "pending", 0), step(2, "pending", 99)]
        found = depths(odd)
        assert set(found) == {0, 1, 2} and found[2] == 0
        assert len(groups(parse(render(odd)), "step")) == 3


class TestDocument:
    def test_each_step_is_a_node_with_its_state_and_task(self) -> None:
        """Every step is one `g.step` carrying its position, state and task name; its
        tooltip holds the error, escaped."""
        root = parse(render(CHAIN_GROUP, title="orders"))
        assert root.get("class") == "workflow-graph" and root.get("data-steps") == "4"
        assert root.findtext(f"{SVG}title") == "orders"
        nodes = {int(g.get("data-position", -1)): g for g in groups(root, "step")}
        assert {p: (g.get("data-state"), g.get("data-task")) for p, g in nodes.items()} == {
            0: ("succeeded", "shop.reserve"), 1: ("succeeded", "shop.charge"),
            2: ("dead_lettered", "shop.email"), 3: ("pending", "shop.ship")}
        assert nodes[2].get("id") == "step-2"
        assert "ValueError: no <such> & co" in (nodes[2].findtext(f"{SVG}title") or "")
        texts = ["".join(t.itertext()) for t in nodes[2].iter(f"{SVG}text")]
        assert texts == ["#2 email", "dead-lettered"]
        fill, stroke = STATE_COLOURS["dead_lettered"]
        rect = nodes[2].find(f"{SVG}rect")
        assert rect is not None and (rect.get("fill"), rect.get("stroke")) == (fill, stroke)

    def test_edges_run_from_each_dependency_to_its_dependent(self) -> None:
        """One edge per dependency; an edge out of a succeeded step is solid, one out of a
        step that did not succeed is dashed."""
        root = parse(render(CHAIN_GROUP))
        edges = {(int(e.get("data-from", -1)), int(e.get("data-to", -1))): e
                 for e in root.iter(f"{SVG}path") if e.get("class") == "edge"}
        assert set(edges) == {(0, 1), (0, 2), (1, 3), (2, 3)}
        assert edges[(1, 3)].get("stroke-dasharray") is None
        assert edges[(2, 3)].get("stroke-dasharray") == "4 3"

    def test_compensations_are_drawn_with_their_state(self) -> None:
        """A step with a compensation carries a `g.compensation` naming its task and state
        ('' while it has not run); the legend then explains the dashed box."""
        root = parse(render(CHAIN_GROUP))
        found = {(g.get("data-position"), g.get("data-task"), g.get("data-state"))
                 for g in groups(root, "compensation")}
        assert found == {("0", "shop.release", "succeeded"), ("1", "shop.refund", "")}
        legend = [g.get("data-state") for g in groups(root, "legend-entry")]
        assert legend == [*STATE_COLOURS, "compensation"]

    def test_objects_with_enum_states_and_unknown_states(self) -> None:
        """Summaries as objects with enum states draw as their dicts do; a state this
        module does not know is drawn and added to the legend."""
        class State(enum.Enum):
            SUCCEEDED = "succeeded"
            RUNNING = "running"

        @dataclass
        class Summary:
            position: int
            task_name: str
            state: State
            depends_on: list[int] = field(default_factory=list)

        root = parse(render([Summary(0, "a", State.SUCCEEDED),
                             Summary(1, "b", State.RUNNING, [0])]))
        assert [g.get("data-state") for g in groups(root, "step")] == ["succeeded", "running"]
        assert [g.get("data-state") for g in groups(root, "legend-entry")][-1] == "running"

    def test_no_steps_and_hostile_names_make_valid_documents(self) -> None:
        """No steps: a valid document saying so; markup in a task name stays text."""
        assert "no steps" in render([])
        parse(render([], title="<script>"))
        root = parse(render([step(0, "failed", task='x"><script>alert(1)</script>')]))
        assert groups(root, "step")[0].get("data-task") == 'x"><script>alert(1)</script>'
        assert not list(root.iter(f"{SVG}script")) and not list(root.iter("script"))


class TestFolding:
    def test_a_wide_column_draws_its_first_steps_and_one_box_for_the_rest(self) -> None:
        """60 members after one step (a batch's shape): the first COLUMN_LIMIT - 1 are
        nodes, the other 37 one `g.more` counting their states; the callback's edges
        from the folded members become one."""
        members = [step(i, "failed" if i % 10 == 0 else "succeeded", 0) for i in range(1, 61)]
        root = parse(render([step(0), *members, step(61, "pending", *range(1, 61))]))
        shown = [int(g.get("data-position", -1)) for g in groups(root, "step")]
        assert shown == [0, *range(1, COLUMN_LIMIT), 61]
        (more,) = groups(root, "more")
        rest = range(COLUMN_LIMIT, 61)
        failed = sum(1 for i in rest if i % 10 == 0)
        assert more.get("data-count") == str(len(rest))
        assert more.get("data-states") == f"failed={failed}, succeeded={len(rest) - failed}"
        into_callback = [e for e in root.iter(f"{SVG}path") if e.get("data-to") == "61"]
        assert len(into_callback) == COLUMN_LIMIT
