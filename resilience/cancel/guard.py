"""`CancelGuard` (Stage.CANCEL): a cancelled job never starts, whatever delivers it.

Flow only. The job's targets (its task id; its task and `cancel_key`) are looked up in this
worker process's copy of the live cancellations, refreshed when the store's version moved
(asked at most once per `refresh_seconds`); a job cancelled mid-run is stopped at
`call.checkpoint()`. A store whose version is gone has lost its copy, never "nothing is
cancelled": it is restored from PostgreSQL. See docs/operations.md, "Cancellation".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from resilience.cancel.backends import CancelBackend, Marks, id_target, key_target
from resilience.cancel.results import GUARD_NAME, cancelled_stop
from resilience.cancel.tombstones import Cancellations
from resilience.errors import ConfigurationError, StorageError
from resilience.keys import KeySpec
from resilience.outcomes import Outcome, Stop
from resilience.pipeline import Call, Guard, Stage
from resilience.store_down import StoreDown, store_down_policy, store_failed

if TYPE_CHECKING:
    from celery import Task

logger = logging.getLogger("resilience.cancel")

#: The task option naming a job's cancel key: `@app.task(cancel_key="{order_id}")`.
CANCEL_KEY_OPTION = "cancel_key"


@dataclass(frozen=True, kw_only=True)
class CancelConfig:
    """Options of the cancel guard.

    Args:
        refresh_seconds: longest a worker process trusts its copy without asking the store's
            version (how long a cancellation takes to reach every worker).
        on_store_down: "fail_open" (default: run when the store cannot be read and there is
            no copy) or "fail_closed" (defer by `retry_seconds`).
        retry_seconds: the deferral under "fail_closed".
        restore_retry_seconds: after a failed restore of a lost store (PostgreSQL down too),
            how long a worker process keeps its copy before it tries again.
    """

    refresh_seconds: float = 1.0
    on_store_down: StoreDown | str = StoreDown.FAIL_OPEN
    retry_seconds: float = 5.0
    restore_retry_seconds: float = 5.0

    def __post_init__(self) -> None:
        if not self.refresh_seconds >= 0 or not self.retry_seconds > 0:
            raise ConfigurationError("refresh_seconds must be >= 0 and retry_seconds > 0")
        if not self.restore_retry_seconds >= 0:
            raise ConfigurationError("restore_retry_seconds must be >= 0")
        object.__setattr__(self, "on_store_down", store_down_policy(self.on_store_down))


class CancelGuard(Guard):
    """Stops a cancelled job before it starts; see the module doc."""

    name = GUARD_NAME
    stage = Stage.CANCEL

    def __init__(self, config: CancelConfig,
                 backend: CancelBackend | Callable[[Task], CancelBackend],
                 *, record: Cancellations | Callable[[Task], Cancellations] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """Args:
            config: the guard's options.
            backend: the copy workers read (or a callable giving it for a task).
            record: the PostgreSQL record that restores a lost copy (or a callable giving
                it for a task); None builds it on the task app's stores and `backend`.
            clock: monotonic seconds (injected by tests).
        """
        self.config = config
        self._backend = backend
        self._record = record
        self.clock = clock
        #: When this process last failed to restore a lost store (monotonic seconds).
        self._restore_failed_at: float | None = None
        #: Per task name: its cancel key spec, or None. One guard serves every task of a
        #: platform (a class-level default), so nothing per task is kept on the guard itself.
        self._keys: dict[str, KeySpec | None] = {}
        #: (when asked, version, marks) of this process's copy; replaced whole, so read
        #: and written without a lock.
        self._copy: tuple[float, str, Marks] | None = None

    def bind(self, task: Task) -> None:
        """Check the task's `cancel_key` template at definition time."""
        template = getattr(task, CANCEL_KEY_OPTION, None)
        self._keys[task.name] = KeySpec(task.run, template) if template else None

    def backend(self, task: Task) -> CancelBackend:
        return self._backend(task) if callable(self._backend) else self._backend

    def record(self, call: Call) -> Cancellations:
        """The record that restores a lost copy."""
        if self._record is None:
            return Cancellations(call.stores.guard_engine(), self.backend(call.task))
        return self._record(call.task) if callable(self._record) else self._record

    def targets(self, call: Call) -> list[str]:
        """What a cancellation of this job would name: its id, and its task and key."""
        found = [id_target(call.task_id)] if call.task_id else []
        name = call.task.name
        keys = self._keys.get(name)
        if keys is not None:
            try:
                key = keys.value(call.args, call.kwargs)
            except Exception:  # noqa: BLE001 - bad arguments fail the job elsewhere
                key = None
            if key:
                found.append(key_target(name, key))
        return found

    def _read(self, call: Call, copy: tuple[float, str, Marks] | None) -> tuple[str, Marks]:
        """The store's version and marks: the copy's own when the version has not moved, a
        reload when it moved, a restore from the record when it is gone."""
        backend = self.backend(call.task)
        version = backend.version()
        if version and copy is not None and version == copy[1]:
            return version, copy[2]
        if version:
            version, marks = backend.load()
            if version:
                return version, marks
        return self._restored(call, backend)

    def _restored(self, call: Call, backend: CancelBackend) -> tuple[str, Marks]:
        """The copy restored from PostgreSQL after the store lost it.

        Raises:
            StorageError: the restore failed now or recently (PostgreSQL down as well).
        """
        failed_at = self._restore_failed_at
        if failed_at is not None and (
                self.clock() - failed_at < self.config.restore_retry_seconds):
            raise StorageError("the cancellation store lost its copy; restore failed, "
                               "tried again later")
        try:
            self.record(call).restore_if_lost()
            version, marks = backend.load()
        except StorageError as error:
            self._restore_failed_at = self.clock()
            # Plain StorageError: whatever failed, the job meets `on_store_down`, never a
            # dead letter (a refusal here says nothing about the job).
            raise StorageError(f"the cancellation store lost its copy and the restore "
                               f"failed: {error}") from error
        if not version:
            self._restore_failed_at = self.clock()
            raise StorageError("the cancellation store lost its copy again while restoring")
        self._restore_failed_at = None
        return version, marks

    def before_run(self, call: Call) -> None:
        targets = self.targets(call)
        if not targets:
            return
        now, copy = self.clock(), self._copy  # refreshed as the module doc says
        if copy is None or now - copy[0] >= self.config.refresh_seconds:
            try:
                version, marks = self._read(call, copy)
                copy = (now, version, marks)
            except StorageError as error:
                if copy is None:  # no copy to keep
                    store_failed(call, error, guard=self.name, policy=self.config.on_store_down,
                                 retry_after_seconds=self.config.retry_seconds)
                    return
                logger.warning("cancellations unreadable, keeping the last copy: %s", error)
                copy = (now, copy[1], copy[2])
            self._copy = copy
        marks = copy[2]
        wall = time.time()
        for target in targets:
            mark = marks.get(target)
            if mark is not None and mark[1] > wall:
                raise self._cancelled(call, mark[0], target)
        call.checks.append(lambda: self._check(call, targets))  # one read at a checkpoint

    def _check(self, call: Call, targets: list[str]) -> None:
        """At a checkpoint: raise if the job was cancelled since it started."""
        try:
            reason = self.backend(call.task).reasons(targets, now=time.time())
        except StorageError as error:
            logger.warning("cancellation not checked at the checkpoint: %s", error)
            return
        if reason is not None:
            raise self._cancelled(call, reason, targets[0])

    def _cancelled(self, call: Call, reason: str, target: str) -> Stop:
        call.count(Outcome.CANCELLED, guard=self.name)
        return cancelled_stop(reason, target)
