"""Where a tier's queue depth is read and admission reserved: the broker itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Admission:
    """One admission decision: `depth` messages waiting plus `reserved` being published."""

    admitted: bool
    depth: int
    reserved: int = 0


class DepthBackend(Protocol):
    """Reads queue depth and admits publishes against a limit."""

    #: Most messages by which concurrent admitted producers can push the queue past its limit.
    overshoot_bound: str

    def depth(self, queue: str) -> int:
        """Messages waiting in `queue`."""

    def try_admit(self, queue: str, *, limit: int, reservation: str,
                  reservation_ttl_seconds: float) -> Admission:
        """Admit one publish if depth plus in-flight reservations stays within `limit`."""

    def release(self, queue: str, reservation: str) -> None:
        """The reserved publish finished (it is in the queue now, or it failed)."""

    def transport_bound(self, queue: str, limit: int) -> dict[str, Any] | None:
        """How the broker itself keeps `queue` within `limit` as it takes the publish: the
        `BOUND_HEADER` value to send (`{}`: nothing to send), or None when it does not (the
        guard admits with `try_admit` / `release` instead)."""

    def refusal(self, error: BaseException, queue: str, limit: int) -> Exception | None:
        """The publish error as `QueueFull` when it is the broker refusing a full queue,
        else None."""
