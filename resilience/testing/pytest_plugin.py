"""pytest plugin (entry point `pytest11: resilience`, `pip install celery-resilience[pytest]`):
guards in memory, fresh for each test.

- `resilience_memory` fixture: for the test, every app's guards keep their state in memory
  (`resilience.testing.memory_mode`), so no Redis or PostgreSQL is reached and nothing
  outlives the test. It gives a `MemoryMode` (`outcomes(app)`, `dead_letters(app)`). When
  the test also uses `celery.contrib.pytest`'s `celery_app` (and `celery_worker`) or
  `celery_session_app`, that app is passed to `resilience.init_app` first.
- `resilience_memory = true` in the ini file: every test gets it.

The fixture is set up before the test's other fixtures (an autouse fixture asks for it), so
a `celery_worker` starts with its tasks already guarded, whatever the argument order.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from resilience.testing import MemoryMode


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("resilience_memory", type="bool", default=False,
                  help="run every test with the resilience_memory fixture (guards in memory)")


@pytest.fixture
def resilience_memory(request: pytest.FixtureRequest) -> Iterator[MemoryMode]:
    """Guards of every app in memory for this test, empty at its start and end."""
    # lazy: every pytest run loads this plugin; Celery and the stores load when it is used
    from resilience import init_app, testing

    with testing.memory_mode() as mode:
        for name in ("celery_app", "celery_session_app"):
            if name in request.fixturenames:
                init_app(request.getfixturevalue(name))
        yield mode


@pytest.fixture(autouse=True)
def _resilience_memory_first(request: pytest.FixtureRequest) -> None:
    """Set `resilience_memory` up before the test's own fixtures, when it is asked for or
    the ini file turns it on; nothing otherwise."""
    if ("resilience_memory" in request.fixturenames
            or request.config.getini("resilience_memory")):
        request.getfixturevalue("resilience_memory")
