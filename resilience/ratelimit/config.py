"""Options of the limit guards: `ConcurrencyLimitConfig`, `RateLimitConfig`, limit names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from resilience.config import check
from resilience.errors import ConfigurationError
from resilience.keys import KeyOption
from resilience.ratelimit.algorithms import RATE_ALGORITHMS, Params, algorithm_named
from resilience.ratelimit.rates import Rate, parse
from resilience.store_down import StoreDown, store_down_policy


def split_name(name_or_key: str, key: KeyOption) -> tuple[str, KeyOption]:
    """`"customer:{customer_id}"` -> ("customer", "{customer_id}"); a plain name stays.

    Raises:
        ConfigurationError: empty name, a template without a name prefix, or a template
            together with `key=`.
    """
    if not isinstance(name_or_key, str) or not name_or_key.strip():
        raise ConfigurationError(f"a limit needs a non-empty name, got {name_or_key!r}")
    if "{" not in name_or_key:
        return name_or_key, key
    if key is not None:
        raise ConfigurationError(f"limit {name_or_key!r} is a key template; do not also pass key=")
    prefix, brace, rest = name_or_key.partition("{")
    name = prefix.rstrip(":-_/ ")
    if not name:
        raise ConfigurationError(
            f"key template {name_or_key!r} needs a name before the first field, e.g. "
            "'vendor:{customer_id}'; or pass the name and key= separately"
        )
    return name, prefix[len(name) :].lstrip(":-_/ ") + brace + rest


def _positive_integer(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value > 0


def _validate_common(config: Any) -> None:
    """The options both configs share: name, retry_seconds, on_store_down (resolved)."""
    if not config.name:
        raise ConfigurationError("a limit needs a non-empty name")
    check(config, "retry_seconds", "positive", lambda v: v > 0)
    object.__setattr__(config, "on_store_down", store_down_policy(config.on_store_down))


def _refused(kind: str, name: str, problem: str) -> ConfigurationError:
    return ConfigurationError(f"{kind} {name!r}: {problem}", name=name)


@dataclass(frozen=True, kw_only=True)
class ConcurrencyLimitConfig:
    """At most `limit` executions at once across the fleet, per `name` (and key).

    Args:
        name: the limit's name (a dependency: "payments-api"); counters use it.
        limit: slots (> 0).
        lease_seconds: how long a slot is held if its holder never releases it (SIGKILL);
            None takes the task's hard time limit plus 10 s. It must not be shorter than
            the hard time limit, or a slow holder's slot would be handed to a second one.
        retry_seconds: typical countdown when no slot is free (jittered 0.5x-1.5x, and
            never past the earliest lease expiry).
        on_store_down: "fail_open" (default: run anyway) or "fail_closed" (defer).
    """

    name: str
    limit: int
    lease_seconds: float | None = None
    retry_seconds: float = 1.0
    on_store_down: StoreDown | str = StoreDown.FAIL_OPEN

    def __post_init__(self) -> None:
        _validate_common(self)
        kind = "concurrency limit"
        if not _positive_integer(self.limit):
            raise _refused(kind, self.name, f"limit must be a positive integer, got {self.limit!r}")
        if self.lease_seconds is not None and not self.lease_seconds > 0:
            raise _refused(
                kind, self.name, f"lease_seconds must be positive, got {self.lease_seconds!r}"
            )


@dataclass(frozen=True, kw_only=True)
class RateLimitConfig:
    """At most `rate` permits across the fleet, per `name` (and key).

    Args:
        name: the limit's name; counters use it.
        rate: `Rate` or notation such as "100/minute".
        algorithm: a rate algorithm of `resilience.ratelimit.algorithms.ALGORITHMS`:
            "gcra" (O(1) state, smooth; default) or "sliding_window" (strict quota: never
            more than `limit` in any window; O(limit) state).
        burst: GCRA only; permits that may be taken at once (default 1: evenly spaced,
            which also keeps every window of one period within the limit).
        retry_seconds: countdown when the store failed and on_store_down is "fail_closed".
        on_store_down: "fail_open" (default: run anyway) or "fail_closed" (defer).
    """

    name: str
    rate: Rate
    algorithm: str = "gcra"
    burst: int = 1
    retry_seconds: float = 1.0
    on_store_down: StoreDown | str = StoreDown.FAIL_OPEN

    def __post_init__(self) -> None:
        _validate_common(self)
        if not isinstance(self.rate, Rate):
            object.__setattr__(self, "rate", parse(self.rate))
        if self.algorithm not in RATE_ALGORITHMS:
            raise _refused("rate limit", self.name, f"unknown algorithm {self.algorithm!r}; "
                           f"use one of {', '.join(RATE_ALGORITHMS)}")
        if not _positive_integer(self.burst):
            raise _refused("rate limit", self.name,
                           f"burst must be an integer >= 1, got {self.burst!r}")
        if self.burst != 1 and not algorithm_named(self.algorithm).bursts:
            raise _refused("rate limit", self.name, f"burst applies to gcra only; "
                           f"{self.algorithm} allows its whole limit at once")

    def params(self) -> Params:
        """The limit's figures, as the algorithm reads them."""
        return Params.of_rate(self.rate, burst=self.burst)
