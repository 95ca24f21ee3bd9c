"""The storage Protocol of the circuit breakers: the atomic steps, and what they return.

Every deciding step (`acquire`, `record`, `force`) reads and changes one breaker at once, so
no two workers see the same transition. Lua scripts in Redis (`redis.py`) are the
specification; `memory.py` follows them for one process. The `*_later` steps queue into a
call's rounds (`Call.reads` / `writes`) where a store batches, and run at once otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from resilience.batch import Rounds
    from resilience.circuit.config import BreakerConfig
    from resilience.errors import StorageError

#: The states a breaker can be in (`jobs_breaker_state` has one series per state).
STATES = ("closed", "open", "half_open", "forced_open", "forced_closed")
#: The states in which acquire.lua only reads: a copy or a peek may stand for it.
CLOSED = ("closed", "forced_closed")


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

    @classmethod
    def decode(cls, name: str, fields: Mapping[str, Any], *, now_ms: int) -> BreakerState:
        """A state hash's fields (Redis strings, or the memory backend's ints) at `now_ms`."""

        def number(field: str) -> int:
            try:
                return int(float(fields.get(field) or 0))
            except ValueError:
                return 0

        state = fields.get("state") or "closed"
        changed_at, open_until = number("changed_at"), number("open_until")
        return cls(
            name=name, state=state, generation=number("gen"), calls=number("calls"),
            failures=number("failures"), slow_calls=number("slow"),
            probes=number("probes") if state == "half_open" else 0,
            times_opened=number("n_opened"), times_half_opened=number("n_half_opened"),
            times_closed=number("n_closed"), probes_total=number("n_probes"),
            seconds_in_state=(now_ms - changed_at) / 1000 if changed_at else None,
            retry_in_seconds=(
                max(0, open_until - now_ms) / 1000 if state == "open" and open_until else None
            ),
        )

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
    """Where the breakers live; each step is one atomic operation of the store. Every step
    but `count` raises `StorageError` when the store fails."""

    def acquire(self, config: BreakerConfig) -> Permission:
        """May a call go ahead now? Opens to half-open when the open period is over."""

    def record(
        self, config: BreakerConfig, generation: int, outcome: str, slow: bool, calls: int = 1
    ) -> Verdict:
        """Report a call's outcome ('success', 'failure', 'ignored') under the generation
        it was admitted in; applies the transition it causes. `calls` > 1 reports that many
        equal outcomes at once (a process's aggregated successes; a closed breaker only)."""

    def force(self, name: str, state: str) -> str:
        """Set `state` ('forced_open', 'forced_closed', 'closed'): a new generation, an
        empty window. Returns the previous state."""

    def peek_later(
        self, rounds: Rounds, name: str, then: Callable[[Peek | StorageError], None]
    ) -> None:
        """Read the state into the call's read round; `then` gets a `Peek` or the error."""

    def record_later(
        self, rounds: Rounds, config: BreakerConfig, generation: int, outcome: str, slow: bool,
        then: Callable[[Verdict | StorageError], None], calls: int = 1,
    ) -> None:
        """`record`, queued into the call's write round; `then` gets the verdict or error."""

    def describe(
        self, names: Iterable[str] = (), *, include_stored: bool = False
    ) -> list[BreakerState]:
        """Live state of the breakers `names` (and, with `include_stored`, of every breaker
        the store holds), sorted by name; one read of the store."""

    def names(self) -> list[str]:
        """Every breaker the store holds state for, sorted."""

    def count(self, name: str, outcome: str) -> None:
        """Add one to the fleet-wide counter of `outcome` for breaker `name`; never raises."""
