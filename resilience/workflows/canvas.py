"""A Celery canvas as a step graph: positions, dependencies, and where each input comes from.

Positions are given depth-first in the order the canvas is written:
`chain(a, group(b, c), d)` is a=0, b=1, c=2, d=3. Each step keeps a *source*: the template of
the value Celery would prepend to its arguments (None for a first step, a position for the
step before it in a chain, a list of templates after a group, nested as the canvas nests),
so `resolve(source, results)` gives the value, and `positions(source)` its dependencies.
The workflow's own result is the template of the whole canvas, resolved the same way: what
plain Celery's `.get()` returns for it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from celery.canvas import Signature, group

from resilience.workflows.errors import InvalidWorkflow

#: The signature option carrying a step's compensation (Celery's idiom: `.set(...)`).
COMPENSATE_OPTION = "compensate"

#: Options of a canvas member that describe Celery's own canvas wiring: the engine replaces
#: that wiring, so they are never stored or published.
_CANVAS_OPTIONS = frozenset({
    "task_id", "link", "link_error", "chord", "group_id", "group_index", "chain",
    "reply_to", "parent_id", "root_id", "producer", "compensate", "subtask_type",
})

Template = int | list["Template"] | dict[str, Any] | None

#: A template node standing for the outcome of several steps, not their results: a batch
#: callback's first argument (`{"outcomes": [positions], "with": {...}}`, see `resolve`).
OUTCOMES = "outcomes"


@dataclass
class StepSpec:
    """One step of a flattened canvas, as it is written to `resilience_workflow_steps`."""

    position: int
    task_name: str
    args: list[Any]
    kwargs: dict[str, Any]
    options: dict[str, Any]
    immutable: bool
    source: Template
    task_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    compensate: dict[str, Any] | None = None
    compensation_task_id: str | None = None
    #: The positions that depend on this step (`link`).
    dependents: list[int] = field(default_factory=list)
    #: Its completion is one statement (`link`): it has dependents (one with several
    #: sources, a fan-in, only counts it unless this step is its last: that completion
    #: takes a transaction), or it has none and is the workflow's result.
    simple: bool = False
    #: A simple step with a fan-in dependent: its one statement takes the locks first, so
    #: it can compute that dependent's input when it is its last source (`link`).
    fan_in: bool = False
    #: "step", or "callback" (a batch's on_success / on_complete).
    kind: str = "step"
    #: Released when every dependency "succeeded" (a canvas edge), or is "final".
    release: str = "succeeded"
    #: A batch member: its failure ends only itself (`WorkflowBackend.fail`), and the
    #: caller writes its outbox row through the task's own enqueue path.
    member: bool = False

    @property
    def depends_on(self) -> list[int]:
        return positions(self.source)

    def signature(self) -> dict[str, Any]:
        """The JSON the step row keeps (`signature` column)."""
        signature = {"args": self.args, "kwargs": self.kwargs, "options": self.options,
                     "immutable": self.immutable, "source": self.source, "simple": self.simple}
        if self.member:
            signature["member"] = True
        if self.fan_in:
            signature["fan_in"] = True
        return signature


def positions(template: Template) -> list[int]:
    """Every position a template reads, in order, each once."""
    found: dict[int, None] = {}  # ordered and O(1) (a batch callback reads every member)

    def walk(node: Template) -> None:
        if node is None:
            return
        if isinstance(node, int):
            found.setdefault(node)
            return
        for child in node[OUTCOMES] if isinstance(node, dict) else node:
            walk(child)

    walk(template)
    return list(found)


def resolve(template: Template, results: dict[int, Any],
            states: dict[int, str] | None = None) -> Any:
    """The value a template stands for, given the steps' results (and, for an outcomes
    node, their final states) by position."""
    if template is None:
        return None
    if isinstance(template, int):
        return results.get(template)
    if isinstance(template, dict):
        return outcomes(template, states or {})
    return [resolve(child, results, states) for child in template]


def outcomes(node: dict[str, Any], states: dict[int, str]) -> dict[str, Any]:
    """An outcomes node's value: its `with` fields, the steps' count, whether all
    succeeded, and how many ended in each final state (every one, zeros included)."""
    found = [states.get(position) for position in node[OUTCOMES]]
    tallies = {state: found.count(state) for state in FINAL_STEP_STATES}
    return {**node.get("with", {}), "total": len(found),
            "succeeded": all(state in SUCCESS_STEP_STATES for state in found),
            "tallies": tallies}


#: A step's final states, in the order tallies show them; the first two count as success.
FINAL_STEP_STATES = ("succeeded", "replayed", "failed", "shed", "skipped", "cancelled",
                     "dead_lettered")
SUCCESS_STEP_STATES = frozenset(FINAL_STEP_STATES[:2])


def input_args(signature: dict[str, Any], results: dict[int, Any],
               states: dict[int, str] | None = None) -> list[Any]:
    """The arguments a step is published with: its source's value first, unless immutable
    or first in the canvas (Celery's chain and chord rule)."""
    args = list(signature.get("args") or ())
    if signature.get("immutable") or signature.get("source") is None:
        return args
    return [resolve(signature["source"], results, states), *args]


def stored_signature(signature: Signature, role: str) -> dict[str, Any]:
    """A compensation (or callback) signature as JSON: task, args, kwargs, options,
    immutable."""
    if not _is_task(signature):
        raise InvalidWorkflow(f"{role} must be one task's signature (task.s(...)), not "
                              f"{_kind(signature)}")
    return {
        "task": signature.task,
        "args": list(signature.args),
        "kwargs": dict(signature.kwargs),
        "options": _options(signature),
        "immutable": bool(signature.immutable),
    }


def flatten(canvas: Signature) -> tuple[list[StepSpec], Template]:
    """The steps of `canvas` in position order, and the template of its result.

    Raises:
        InvalidWorkflow: a canvas type the engine does not run (chunks, map, starmap), an
            empty group or chain, or a compensation that is not one task's signature.
    """
    steps: list[StepSpec] = []

    def visit(node: Any, source: Template) -> Template:
        if not isinstance(node, Signature):
            if isinstance(node, dict) and node.get("task"):
                node = Signature.from_dict(node)
            else:
                raise InvalidWorkflow(f"a workflow member must be a Celery signature, got "
                                      f"{type(node).__name__}")
        kind = node.subtask_type
        if kind is None:
            if not node.task:
                raise InvalidWorkflow("a signature without a task name")
            compensate = node.options.get(COMPENSATE_OPTION)
            spec = StepSpec(
                position=len(steps), task_name=node.task, args=list(node.args),
                kwargs=dict(node.kwargs), options=_options(node),
                immutable=bool(node.immutable), source=source,
                compensate=(None if compensate is None
                            else stored_signature(_signature(compensate),
                                                  f"the compensation of {node.task}")),
            )
            if spec.compensate is not None:
                spec.compensation_task_id = str(uuid.uuid4())
            steps.append(spec)
            return spec.position
        if kind == "chain":
            members = list(node.tasks)
            if not members:
                raise InvalidWorkflow("an empty chain")
            current = source
            for member in members:
                current = visit(member, current)
            return current
        if kind == "group":
            members = list(node.tasks)
            if not members:
                raise InvalidWorkflow("an empty group")
            return [visit(member, source) for member in members]
        if kind == "chord":
            header = visit(_as_group(node.tasks), source)
            body = node.body
            if body is None:
                return header
            return visit(body, header)
        raise InvalidWorkflow(f"{kind} canvases are not run durably; write them as a group of "
                              "task signatures")

    template = visit(canvas, None)
    link(steps, template)
    return steps, template


def link(steps: list[StepSpec], template: Template) -> None:
    """Fill each step's `dependents`, `simple` and `fan_in` from the sources of the others
    (a batch member's completion always takes the transaction: its callback counts
    outcomes)."""
    by_position = {step.position: step for step in steps}
    for step in steps:
        step.dependents = []
    for step in steps:
        for source in step.depends_on:
            by_position[source].dependents.append(step.position)
    for step in steps:
        single = all(isinstance(by_position[d].source, int) for d in step.dependents)
        canvas_edges = not step.member and all(by_position[d].kind == "step"
                                               for d in step.dependents)
        step.simple = ((bool(step.dependents) and (single or canvas_edges))
                       or (template == step.position and single))
        step.fan_in = step.simple and not single


def _as_group(tasks: Any) -> Signature:
    if isinstance(tasks, Signature) and tasks.subtask_type == "group":
        return tasks
    return group(list(tasks))


def _signature(value: Any) -> Signature:
    if isinstance(value, Signature):
        return value
    if isinstance(value, dict) and value.get("task"):
        return Signature.from_dict(value)
    raise InvalidWorkflow(f"a compensation must be a task signature, got {type(value).__name__}")


def _options(signature: Signature) -> dict[str, Any]:
    return {name: value for name, value in signature.options.items()
            if name not in _CANVAS_OPTIONS and value is not None}


def _is_task(value: Any) -> bool:
    return isinstance(value, Signature) and not value.subtask_type and bool(value.task)


def _kind(value: Any) -> str:
    subtask_type = getattr(value, "subtask_type", None)
    return f"a {subtask_type}" if subtask_type else type(value).__name__
