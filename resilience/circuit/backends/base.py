"""The storage Protocol of the circuit breakers: the atomic steps, and what they return.

Every step that decides (`acquire`, `record`, `force`) reads and changes one breaker at
once, so no two workers see the same transition. The state machine is written once per
store: as Lua scripts in Redis (`redis.py`, the specification), and in Python for one
process (`memory.py`). The `*_later` steps queue into a call's rounds
(`resilience.pipeline.Call.reads` / `writes`) where a store batches, and run at once where
it does not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from resilience.batch import Rounds
    from resilience.circuit.config import BreakerConfig
    from resilience.errors import StorageError

#: The states a breaker can be in.
STATES = ("closed", "open", "half_open", "forced_open", "forced_closed")


@dataclass(frozen=True)
class Permission:
    """What acquire said: may the call go ahead, and under which generation."""

    allowed: bool
    state: str
    generation: int
    wait_seconds: float = 0.0
    transition: str = ""
    store_down: bool = False


@dataclass(frozen=True)
class Verdict:
    """What record said: the transition it caused ('' for none) and the window figures."""

    transition: str
    state: str
    calls: int = 0
    failures: int = 0
    slow_calls: int = 0


@dataclass(frozen=True)
class BreakerState:
    """One breaker's live state (admin and status views); a breaker never used is closed.

    `calls`, `failures` and `slow_calls` are the count window's figures (a time window keeps
    its figures in its slots: they show 0 here). Durations are on the store's clock.
    """

    name: str
    state: str = "closed"
    generation: int = 0
    calls: int = 0
    failures: int = 0
    slow_calls: int = 0
    #: Probe permits handed out in the current half-open period.
    probes: int = 0
    times_opened: int = 0
    times_half_opened: int = 0
    times_closed: int = 0
    #: Probe permits handed out since the breaker was first used.
    probes_total: int = 0
    #: Since the last transition; None before the first one.
    seconds_in_state: float | None = None
    #: While open: how long until the next acquire may half-open it.
    retry_in_seconds: float | None = None

    @property
    def open(self) -> bool:
        """Calls are refused now (open, or held open by an operator)."""
        return self.state in ("open", "forced_open")

    @property
    def failure_rate(self) -> float:
        """Failures / calls in the window (0.0 with no calls)."""
        return self.failures / self.calls if self.calls else 0.0


#: What `peek_later` hands on: the permission a closed breaker gives, None when only the
#: full `acquire` can tell, or the store's error.
Peek = Permission | None


class BreakerBackend(Protocol):
    """Where the breakers live; each step is one atomic operation of the store."""

    def acquire(self, config: BreakerConfig) -> Permission:
        """May a call go ahead now? Opens to half-open when the open period is over.

        Raises:
            StorageError: the store failed (StoreUnavailable, StoreRejected).
        """

    def record(
        self, config: BreakerConfig, generation: int, outcome: str, slow: bool, calls: int = 1
    ) -> Verdict:
        """Report a call's outcome ('success', 'failure', 'ignored') under the generation
        it was admitted in; applies the transition it causes. `calls` > 1 reports that many
        equal outcomes at once (a process's aggregated successes; a closed breaker only).

        Raises:
            StorageError: the store failed.
        """

    def force(self, name: str, state: str) -> str:
        """Set `state` ('forced_open', 'forced_closed', 'closed'): a new generation, an
        empty window. Returns the previous state.

        Raises:
            StorageError: the store failed.
        """

    def peek_later(
        self, rounds: Rounds, name: str, then: Callable[[Peek | StorageError], None]
    ) -> None:
        """Read the state into the call's read round; `then` gets a `Peek` or the error."""

    def record_later(
        self,
        rounds: Rounds,
        config: BreakerConfig,
        generation: int,
        outcome: str,
        slow: bool,
        then: Callable[[Verdict | StorageError], None],
        calls: int = 1,
    ) -> None:
        """`record`, queued into the call's write round; `then` gets the verdict or error."""

    def describe(
        self, names: Iterable[str] = (), *, include_stored: bool = False
    ) -> list[BreakerState]:
        """Live state of the breakers `names` (and, with `include_stored`, of every breaker
        the store holds), sorted by name; one read of the store.

        Raises:
            StorageError: the store failed.
        """

    def names(self) -> list[str]:
        """Every breaker the store holds state for, sorted."""

    def count(self, name: str, outcome: str) -> None:
        """Add one to the fleet-wide counter of `outcome` for breaker `name`; never raises."""
