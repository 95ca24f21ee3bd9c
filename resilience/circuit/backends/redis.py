"""Breaker state in Redis: each decision is one Lua script on Redis server time.

Key layout (`resilience.keys.redis_key`): `resilience:breaker:{<name>}` holds the state hash
and `resilience:breaker:{<name>}:window` the window, the name percent-encoded inside the
hash tag, so no breaker name can name another breaker's window and both keys of a script
share a Redis Cluster slot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from resilience.batch import for_client
from resilience.circuit.config import BreakerConfig, CountWindow
from resilience.keys import parse_redis_key, redis_key, redis_key_pattern
from resilience.scripts import LuaScript
from resilience.stores import wrap_store_errors

if TYPE_CHECKING:
    import redis

    from resilience.pipeline import Rounds

NAMESPACE = "resilience:breaker"


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


def state_key(name: str) -> str:
    """The Redis key of breaker `name`'s state hash."""
    return redis_key(NAMESPACE, name)


def window_key(name: str) -> str:
    """The Redis key of breaker `name`'s window (a list or a slot hash)."""
    return redis_key(NAMESPACE, name, "window")


class RedisBreakerBackend:
    """Runs `acquire.lua`, `record.lua` and `force.lua`; scripts registered once per client."""

    ACQUIRE = LuaScript.load(__file__, "acquire.lua")
    RECORD = LuaScript.load(__file__, "record.lua")
    FORCE = LuaScript.load(__file__, "force.lua")

    def __init__(self, client: Callable[[], redis.Redis]) -> None:
        self._client = client

    def _run(self, script: LuaScript, name: str, args: list[Any]) -> Any:
        state = state_key(name)
        with wrap_store_errors("breaker", breaker=name):
            return script(self._client(), [state, f"{state}:window"], args)

    def acquire(self, config: BreakerConfig) -> Permission:
        allowed, state, generation, wait_ms, transition = self._run(
            self.ACQUIRE,
            config.name,
            [
                config.half_open_probes,
                int(config.probe_timeout_seconds * 1000),
                int(config.open_seconds * 1000),
            ],
        )
        return Permission(bool(allowed), state, int(generation), int(wait_ms) / 1000, transition)

    @staticmethod
    def _record_args(config: BreakerConfig, generation: int, outcome: str,
                     slow: bool) -> list[Any]:
        window = config.window
        if isinstance(window, CountWindow):
            kind, size, slots = "count", window.calls, 1
        else:
            kind, size, slots = "time", int(window.seconds * 1000), window.slots
        slow_threshold = config.slow_call_rate_threshold
        return [
            generation,
            outcome,
            1 if slow else 0,
            kind,
            size,
            slots,
            config.minimum_calls,
            repr(float(config.failure_rate_threshold)),
            repr(float(slow_threshold if slow_threshold is not None else 2.0)),
            int(config.open_seconds * 1000),
            config.half_open_probes,
        ]

    def record(self, config: BreakerConfig, generation: int, outcome: str, slow: bool) -> Verdict:
        reply = self._run(self.RECORD, config.name,
                          self._record_args(config, generation, outcome, slow))
        return self.verdict(reply)

    @staticmethod
    def verdict(reply: Any) -> Verdict:
        transition, state, calls, failures, slow_calls = reply
        return Verdict(transition, state, int(calls), int(failures), int(slow_calls))

    # -- batched (one round trip for every guard of a call; see resilience.batch) ---------
    def client(self) -> redis.Redis:
        return self._client()

    def peek_later(self, rounds: Rounds, name: str, then: Callable[[Any], None]) -> None:
        """Queue a read of the state and generation (what acquire.lua reads first)."""
        for_client(rounds, self.client()).command("HMGET", state_key(name), "state", "gen",
                                                   then=then)

    @staticmethod
    def permission_from_peek(reply: Any) -> Permission | None:
        """The permission acquire.lua would give for a closed breaker, else None.

        acquire.lua only reads when the state is closed or forced_closed; anything else (a
        timer to check, a probe permit to take) needs the script itself.
        """
        if isinstance(reply, BaseException) or not isinstance(reply, list | tuple):
            return None
        state = reply[0] or "closed"
        if state not in ("closed", "forced_closed"):
            return None
        try:
            generation = int(reply[1] or 0)
        except (TypeError, ValueError):
            return None
        return Permission(True, state, generation)

    def record_later(self, rounds: Rounds, config: BreakerConfig, generation: int,
                     outcome: str, slow: bool, then: Callable[[Any], None]) -> None:
        """Queue record.lua; `then` gets its reply (see `verdict`) or the exception."""
        state = state_key(config.name)
        batch = for_client(rounds, self.client())
        batch.script(self.RECORD.for_client(batch.client), [state, f"{state}:window"],
                     self._record_args(config, generation, outcome, slow), then=then)

    def force(self, name: str, state: str) -> str:
        """Set `state` ('forced_open', 'forced_closed', 'closed'); return the previous state."""
        return str(self._run(self.FORCE, name, [state]))

    def snapshot(self, name: str) -> dict[str, str]:
        """The raw state hash (for admin views)."""
        with wrap_store_errors("breaker state", breaker=name):
            return dict(self._client().hgetall(state_key(name)))

    def stored_names(self) -> dict[str, str]:
        """Every breaker with state in Redis: its name (as `resilience.keys.decode_key_part`
        shows it: a name too long to keep is its digest) and the Redis key of its state."""
        found = {}
        with wrap_store_errors("breaker scan"):
            for key in self._client().scan_iter(match=redis_key_pattern(NAMESPACE), count=500):
                parsed = parse_redis_key(NAMESPACE, key)
                if parsed is not None and not parsed[1]:  # not a window
                    found[parsed[0]] = key
        return found

    def names(self) -> list[str]:
        """Every breaker that has state in Redis."""
        return sorted(self.stored_names())

    def states(self) -> dict[str, dict[str, str]]:
        """Every breaker's raw state hash by name, read by its stored key (admin views)."""
        stored = self.stored_names()
        with wrap_store_errors("breaker states"):
            client = self._client()
            return {name: dict(client.hgetall(key)) for name, key in sorted(stored.items())}
