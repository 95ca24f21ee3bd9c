"""What `jobs pipeline TASK` prints: a task's effective pipelines, in order, with options."""

from __future__ import annotations

from enum import Enum
from typing import Any

from resilience.pipeline import attached
from resilience.task import GuardedTask


def _value(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if callable(value) and not isinstance(value, type):
        return getattr(value, "__qualname__", None) or type(value).__name__
    if isinstance(value, tuple | list):
        return [_value(item) for item in value]
    if hasattr(value, "__dataclass_fields__") and type(value).__str__ is not object.__str__:
        return str(value)  # a value type with its own notation (a Rate: "100/60s")
    if hasattr(value, "__dataclass_fields__"):
        return {name: _value(getattr(value, name)) for name in value.__dataclass_fields__}
    return value


def describe_pipelines(task: Any) -> dict[str, Any]:
    """The task's enqueue and execution guards in the order they run; a task that is no
    `GuardedTask` has empty pipelines and `unguarded`, one line saying so.

    Raises:
        ConfigurationError: the task's guards clash (two in a stage that holds one).
    """
    if not isinstance(task, GuardedTask):
        guards = sorted({guard.name for guard in attached(getattr(task, "run", None))})
        why = (f"its guards ({', '.join(guards)}) need its app initialised with "
               "resilience.init_app(app)" if guards else
               f"a plain {type(task).__mro__[1].__name__} with no guard decorators")
        return {"enqueue": [], "execution": [], "unguarded": f"{task.name} is not guarded: {why}"}
    execution, enqueue = task.pipelines()
    view: dict[str, Any] = {"enqueue": [], "execution": []}
    for phase, guards in (("enqueue", enqueue.guards), ("execution", execution.guards)):
        for guard in guards:
            options = {name: _value(value) for name, value in guard.describe(task).items()}
            view[phase].append({
                "stage": type(guard.stage)(guard.stage).name,
                "guard": guard.name,
                "options": options,
                "options_text": ", ".join(
                    f"{name}={value!r}" if isinstance(value, str) else f"{name}={value}"
                    for name, value in options.items() if value is not None),
            })
    return view
