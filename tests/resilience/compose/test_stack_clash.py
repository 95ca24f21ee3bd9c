"""A stack with two guards of one exclusivity stage is refused when its pipeline is built.

`@singleton` and `@exclusive` both take the EXCLUSIVITY place in the pipeline; stacking
them would silently pick an order between two locks of different stores. The matrix leaves
that pair out and checks here, without workers, that it is a `ConfigurationError` — in
either decorator order, both when the pipeline is built and at `.delay()` (nothing is
published). Before 8851007 ("Pipeline v2") nothing refused it.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from resilience.errors import ConfigurationError
from tests.resilience.compose.tasks import INLINE_QUEUE, Stack, build


@pytest.mark.parametrize("guards", [("singleton", "exclusive"), ("exclusive", "singleton")])
def test_singleton_with_exclusive_is_a_configuration_error(
    app: Any, guards: tuple[str, str]
) -> None:
    """Both lock guards on one task: ConfigurationError naming them, in either order."""
    task = build(Stack("+".join(guards), guards),
                 name=f"tests.compose.clash.{uuid.uuid4().hex[:8]}")
    try:
        with pytest.raises(ConfigurationError, match="singleton.*exclusive|exclusive.*singleton"):
            task.pipelines()
        with pytest.raises(ConfigurationError):
            # A queue nobody consumes, in case the enqueue path let it through.
            task.apply_async(kwargs={"run": "clash", "key": "k"}, queue=INLINE_QUEUE)
    finally:
        app.tasks.unregister(task.name)
