"""Storage of the pause switches: the three atomic steps a backend offers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Paused:
    """One switch that is on: what is paused (`scope` "tier" or "task", `name`), and why."""

    scope: str
    name: str
    reason: str
    since_epoch_seconds: float


class PauseBackend(Protocol):
    """Where the switches live; every step is one atomic store operation."""

    def pause(self, scope: str, name: str, *, reason: str) -> None:
        """Turn the switch of `scope`/`name` on (again: the reason is replaced)."""

    def resume(self, scope: str, name: str) -> bool:
        """Turn it off; False when it was not on."""

    def paused(self, switches: Sequence[tuple[str, str]]) -> list[Paused]:
        """Which of `switches` are on (one read for all of them)."""

    def all_paused(self) -> list[Paused]:
        """Every switch that is on (admin views)."""
