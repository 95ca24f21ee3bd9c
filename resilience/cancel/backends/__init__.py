"""Where workers read cancellations: the atomic steps a cancellation store offers.

A cancellation names a job by its task id (`id:<task id>`) or by its task and key
(`key:<task name>:<key>`). The PostgreSQL table (`resilience.cancel.tombstones`) is the
record; a backend holds the copy workers read, with a version that moves on every change.
A store without a version has lost its copy: never "no cancellations" (writing the copy
always leaves a version).
"""

from __future__ import annotations

from typing import Protocol

#: target -> (reason, expiry in epoch seconds)
Marks = dict[str, tuple[str, float]]


def id_target(task_id: str) -> str:
    """The target naming one job by its task id."""
    return f"id:{task_id}"


def key_target(task_name: str, key: str) -> str:
    """The target naming every job of `task_name` whose cancel key is `key`."""
    return f"key:{task_name}:{key}"


class CancelBackend(Protocol):
    """The copy of the live cancellations."""

    def cancel(self, target: str, *, reason: str, expires_at: float) -> None:
        """Mark `target` cancelled until `expires_at` (epoch seconds); moves the version."""

    def uncancel(self, target: str) -> bool:
        """Remove the mark (True if there was one); moves the version."""

    def version(self) -> str:
        """A value that changes whenever a mark is added or removed (never repeats); ""
        when the store lost its copy."""

    def load(self) -> tuple[str, Marks]:
        """The version and every mark, read together."""

    def reasons(self, targets: list[str], *, now: float) -> str | None:
        """A fresh read: the reason of the first of `targets` cancelled at `now`, or None."""

    def prune(self, *, now: float) -> int:
        """Drop marks expired at `now`; returns how many."""

    def replace(self, marks: Marks) -> str:
        """Make the copy exactly `marks`, in one step; returns the new version."""
