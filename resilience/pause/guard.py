"""`PauseGuard` (Stage.PAUSE): a job whose tier or task is paused is DEFERRED, not run.

Flow only: the switches live in a `PauseBackend`; the guard reads a task's two switches (its
tier's and its own) at most once every `refresh_seconds` per process, so the hot path costs
no round trip. When the store cannot be read the last copy stays in use; without one the
guard follows `on_store_down` (fail open: a pause switch must never stop a fleet by itself).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from resilience.errors import ConfigurationError, StorageError
from resilience.outcomes import Outcome, Stop
from resilience.pause.backends import PauseBackend, Paused
from resilience.pipeline import Call, Guard, Stage
from resilience.store_down import StoreDown, store_down_policy, store_failed

if TYPE_CHECKING:
    from celery import Task

logger = logging.getLogger("resilience.pause")


@dataclass(frozen=True, kw_only=True)
class PauseConfig:
    """Options of the pause guard.

    Args:
        refresh_seconds: longest a worker process keeps its copy of the switches (how long
            a pause or a resume takes to reach every worker).
        retry_seconds: deferral of a paused job (it comes back, sees the switch, waits again).
        on_store_down: "fail_open" (default: run when the switches cannot be read) or
            "fail_closed" (defer).
    """

    refresh_seconds: float = 1.0
    retry_seconds: float = 5.0
    on_store_down: StoreDown | str = StoreDown.FAIL_OPEN

    def __post_init__(self) -> None:
        if not self.refresh_seconds >= 0 or not self.retry_seconds > 0:
            raise ConfigurationError("refresh_seconds must be >= 0 and retry_seconds > 0")
        object.__setattr__(self, "on_store_down", store_down_policy(self.on_store_down))


class PauseSwitch:
    """The operator's side: pause, resume and list switches (`jobs pause`, `jobs resume`)."""

    def __init__(self, backend: PauseBackend) -> None:
        self.backend = backend

    def pause(self, scope: str, name: str, *, reason: str = "paused by an operator") -> None:
        """Raises: ConfigurationError for an unknown scope or an empty name."""
        self.backend.pause(*_switch(scope, name), reason=reason)

    def resume(self, scope: str, name: str) -> bool:
        return self.backend.resume(*_switch(scope, name))

    def describe(self) -> list[Paused]:
        """Every switch that is on (live state, for status views)."""
        return self.backend.all_paused()


def _switch(scope: str, name: str) -> tuple[str, str]:
    if scope not in ("tier", "task") or not name:
        raise ConfigurationError(f"pause a 'tier' or a 'task' by name, got {scope!r} {name!r}")
    return scope, name


class PauseGuard(Guard):
    """Defers the jobs of a paused tier or task; see the module doc."""

    name = "pause"
    stage = Stage.PAUSE

    def __init__(self, config: PauseConfig,
                 backend: PauseBackend | Callable[[Task], PauseBackend]) -> None:
        self.config = config
        self._backend = backend
        #: Per (tier, task name): when the switches were last read, and what came back
        #: (the switches found on, or the store's error while there is no copy to keep).
        self._copies: dict[tuple[str, str], tuple[float, list[Paused] | StorageError]] = {}

    def backend(self, task: Task) -> PauseBackend:
        return self._backend(task) if callable(self._backend) else self._backend

    def before_run(self, call: Call) -> None:
        # The call's switches (its tier's, its task's) from this process's copy, read again
        # (one MGET) when older than `refresh_seconds`: a store that is down costs one
        # attempt per refresh, not one per job.
        task = call.task
        mine = (str(getattr(task, "tier", None) or ""), task.name)
        now = time.monotonic()
        copy = self._copies.get(mine)  # one dict read or write: atomic, no lock needed
        if copy is None or now - copy[0] >= self.config.refresh_seconds:
            switches = [("tier", mine[0]), ("task", mine[1])] if mine[0] else [("task", mine[1])]
            try:
                found: list[Paused] | StorageError = self.backend(task).paused(switches)
            except StorageError as error:
                kept = copy[1] if copy is not None else error
                if not isinstance(kept, StorageError):
                    logger.warning("pause switches unreadable, keeping the last copy: %s",
                                   error)
                found = kept
            copy = self._copies[mine] = (now, found)
        found = copy[1]
        if isinstance(found, StorageError):  # unreadable, and no earlier copy to keep
            store_failed(call, found, guard=self.name, policy=self.config.on_store_down,
                         retry_after_seconds=self.config.retry_seconds)
            return
        if not found:
            return
        hit = found[0]
        call.count(Outcome.DEFERRED, guard=self.name)
        raise Stop(
            Outcome.DEFERRED, guard=self.name,
            reason=f"paused: {hit.scope} {hit.name!r} ({hit.reason or 'no reason given'})",
            retry_after_seconds=self.config.retry_seconds,
            details={"scope": hit.scope, "name": hit.name, "reason": hit.reason})
