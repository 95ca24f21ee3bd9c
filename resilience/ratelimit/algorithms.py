"""The limit algorithms as pure functions of (state, now): no storage, no clock.

The in-memory backend calls these directly; the Redis backend runs the same arithmetic in
one Lua script per decision (`backends/*.lua`) on Redis server time. Times are integer
microseconds so Python and Lua agree exactly (Lua numbers are doubles, exact to 2**53).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Decision:
    """One limiter decision.

    Args:
        allowed: a permit or slot was granted.
        retry_after_seconds: when denied, the earliest time a retry can succeed (0 if allowed).
        now_seconds: the decision's time on the store's clock (Redis server time).
        used: permits in the window / slots held after the decision.
    """

    allowed: bool
    retry_after_seconds: float
    now_seconds: float
    used: int = 0


@dataclass
class WaitingLine:
    """Where denied callers wait: first denied, first served.

    A denied caller is told to come back when the next permit frees plus one spacing per
    caller ahead of it, so N deferred jobs return spread at the limit's rate instead of all
    at once; a caller denied again keeps its place; a granted caller leaves the line. Ranking
    against the line (not against a precomputed schedule) adapts when callers come back late.
    """

    arrivals: dict[str, int] = field(default_factory=dict)

    def retry_after(self, caller: str, now_us: int, excess_us: int, spacing_us: int) -> int:
        """Microseconds until `caller` should try again (it was just denied)."""
        self.arrivals.setdefault(caller, now_us)
        # Callers join in time order, so their position in the dict is their place in line.
        ahead = list(self.arrivals).index(caller)
        return excess_us + ahead * spacing_us

    def granted(self, caller: str) -> None:
        self.arrivals.pop(caller, None)


def gcra(
    tat_us: int | None, now_us: int, *, interval_us: int, burst: int, cost: int = 1
) -> tuple[bool, int, int]:
    """Generic cell rate algorithm: one number of state (the theoretical arrival time).

    A request is allowed when, after adding `cost` emission intervals, the theoretical
    arrival time is at most `burst` intervals ahead of now.

    Bounds, for any arrival pattern, when `interval_us` is the period / limit rounded up
    (`Rate.emission_interval_us`; rounding down would let one extra permit in): the first
    and last of n permits granted are at least (n - burst) intervals apart, so a half-open
    window of one period, (t - period, t], holds at most `limit + burst - 1` permits:
    `limit` with burst=1 (permits at least one interval apart), limit + b - 1 with burst b.
    Over any span the long-run rate never exceeds the limit: permits <= span / interval +
    burst.

    Returns:
        (allowed, new_tat_us, retry_after_us); new_tat_us is the state to store.
    """
    tat = max(tat_us if tat_us is not None else now_us, now_us)
    new_tat = tat + interval_us * cost
    excess = new_tat - now_us - interval_us * burst
    if excess > 0:
        return False, tat, excess
    return True, new_tat, 0


def sliding_window(
    grants_us: list[int], now_us: int, *, limit: int, window_us: int
) -> tuple[bool, list[int], int]:
    """Strict sliding log: at most `limit` grants in any window of `window_us`.

    `grants_us` are earlier grant times, oldest first. Grants at or before now - window
    have left the window.

    Returns:
        (allowed, kept_grants_us, retry_after_us); kept includes the new grant if allowed.
    """
    kept = [grant for grant in grants_us if grant > now_us - window_us]
    if len(kept) < limit:
        return True, [*kept, now_us], 0
    return False, kept, kept[0] + window_us - now_us


def lease_acquire(
    leases: dict[str, int], now_us: int, *, holder: str, limit: int, lease_us: int
) -> tuple[bool, dict[str, int], int]:
    """Counting semaphore whose slots are leases: an expired lease is reclaimed.

    `leases` maps holder to expiry. A holder that already has a slot renews it.

    Returns:
        (allowed, live_leases, retry_after_us); retry_after is when the earliest lease ends.
    """
    live = {name: expiry for name, expiry in leases.items() if expiry > now_us}
    if holder in live or len(live) < limit:
        live[holder] = now_us + lease_us
        return True, live, 0
    return False, live, min(live.values()) - now_us
