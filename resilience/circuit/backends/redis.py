"""Breaker state in Redis: each decision is one Lua script on Redis server time.

Key layout (`resilience.keys.redis_key`): `resilience:breaker:{<name>}` holds the state hash
and `resilience:breaker:{<name>}:window` the window, the name percent-encoded inside the
hash tag, so no breaker name can name another breaker's window and both keys of a script
share a Redis Cluster slot.

State hash fields: state, gen, open_until / half_open_until (ms, server time), probes,
probes_ok, calls / failures / slow (count window), changed_at (ms), and the transition
tallies n_opened, n_half_opened, n_closed, n_probes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from resilience.batch import for_client
from resilience.circuit.backends.base import CLOSED, BreakerState, Peek, Permission, Verdict
from resilience.circuit.config import BreakerConfig, CountWindow
from resilience.connections import translate_store_error, wrap_store_errors
from resilience.connections.redis import RedisStoreBackend, read_hashes
from resilience.counters import count
from resilience.keys import redis_key, stored_keys
from resilience.scripts import LuaScript
from resilience.stores import stores_for

if TYPE_CHECKING:
    from celery import Celery

    from resilience.batch import Rounds
    from resilience.errors import StorageError

NAMESPACE = "resilience:breaker"


def state_key(name: str) -> str:
    """The Redis key of breaker `name`'s state hash."""
    return redis_key(NAMESPACE, name)


def window_key(name: str) -> str:
    """The Redis key of breaker `name`'s window (a list or a slot hash)."""
    return redis_key(NAMESPACE, name, "window")


def _answer(
    then: Callable[[Any], None], decode: Callable[[Any], Any], what: str, name: str
) -> Callable[[Any], None]:
    """A batch callback: `then` gets the decoded reply, or the store's error translated."""
    return lambda reply: then(
        translate_store_error(reply, what, breaker=name)
        if isinstance(reply, BaseException) else decode(reply)
    )


class RedisBreakerBackend(RedisStoreBackend):
    """Runs `acquire.lua`, `record.lua` and `force.lua`; scripts registered once per client."""

    store_operation = "breaker"
    ACQUIRE = LuaScript.load(__file__, "acquire.lua")
    RECORD = LuaScript.load(__file__, "record.lua")
    FORCE = LuaScript.load(__file__, "force.lua")

    @classmethod
    def of_app(cls, app: Celery) -> RedisBreakerBackend:
        """The backend on the app's shared Redis, one per process (`Stores.backend`), so
        every task naming a breaker shares the process's local copy of it.

        Raises:
            ConfigurationError: the app's stores are in memory (see `backend_of_app`).
        """
        return stores_for(app).backend("circuit", lambda stores: cls(stores.redis))

    def _run(self, script: LuaScript, name: str, args: list[Any]) -> Any:
        with wrap_store_errors("breaker", breaker=name):
            return script(self.client, [state_key(name), window_key(name)], args)

    def acquire(self, config: BreakerConfig) -> Permission:
        allowed, state, generation, wait_ms, transition = self._run(self.ACQUIRE, config.name, [
            config.half_open_probes, int(config.probe_timeout_seconds * 1000),
            int(config.open_seconds * 1000),
        ])
        return Permission(bool(allowed), state, int(generation), int(wait_ms) / 1000, transition)

    @staticmethod
    def _record_args(
        config: BreakerConfig, generation: int, outcome: str, slow: bool, calls: int = 1
    ) -> list[Any]:
        window = config.window
        if isinstance(window, CountWindow):
            kind, size, slots = "count", window.calls, 1
        else:
            kind, size, slots = "time", int(window.seconds * 1000), window.slots
        slow_threshold = config.slow_call_rate_threshold
        return [  # record.lua's ARGV, in its order
            generation, outcome, 1 if slow else 0, kind, size, slots, config.minimum_calls,
            repr(float(config.failure_rate_threshold)),
            repr(float(slow_threshold if slow_threshold is not None else 2.0)),
            int(config.open_seconds * 1000), config.half_open_probes, calls,
        ]

    def record(
        self, config: BreakerConfig, generation: int, outcome: str, slow: bool, calls: int = 1
    ) -> Verdict:
        args = self._record_args(config, generation, outcome, slow, calls)
        return self.verdict(self._run(self.RECORD, config.name, args))

    @staticmethod
    def verdict(reply: Any) -> Verdict:
        """record.lua's reply as a `Verdict`."""
        transition, state, calls, failures, slow_calls = reply
        return Verdict(transition, state, int(calls), int(failures), int(slow_calls))

    def force(self, name: str, state: str) -> str:
        return str(self._run(self.FORCE, name, [state]))

    # -- batched (one round trip for every guard of a call; see resilience.batch) ---------
    def peek_later(
        self, rounds: Rounds, name: str, then: Callable[[Peek | StorageError], None]
    ) -> None:
        """Queue a read of the state and generation (what acquire.lua reads first)."""
        done = _answer(then, self.permission_from_peek, "breaker state", name)
        for_client(rounds, self.client).command("HMGET", state_key(name), "state", "gen", then=done)

    @staticmethod
    def permission_from_peek(reply: Any) -> Permission | None:
        """The permission acquire.lua gives a closed breaker (it only reads then), else None:
        any other state (a timer to check, a probe permit to take) needs the script."""
        state = (reply[0] or "closed") if isinstance(reply, list | tuple) else None
        try:
            return Permission(True, state, int(reply[1] or 0)) if state in CLOSED else None
        except (TypeError, ValueError):
            return None

    def record_later(
        self, rounds: Rounds, config: BreakerConfig, generation: int, outcome: str, slow: bool,
        then: Callable[[Verdict | StorageError], None], calls: int = 1,
    ) -> None:
        """Queue record.lua; `then` gets its `Verdict` or the store's error."""
        batch = for_client(rounds, self.client)
        batch.script(self.RECORD.for_client(batch.client),
                     [state_key(config.name), window_key(config.name)],
                     self._record_args(config, generation, outcome, slow, calls),
                     then=_answer(then, self.verdict, "breaker", config.name))

    # -- live state ----------------------------------------------------------------------
    def _stored_keys(self) -> dict[str, str]:
        """State key -> name of every breaker with state in Redis (one SCAN). A name too
        long to keep shows as its digest (`resilience.keys.decode_key_part`)."""
        return stored_keys(self.client, NAMESPACE)  # windows (suffixed) left out

    def names(self) -> list[str]:
        return sorted(self._stored_keys().values())

    def describe(
        self, names: Iterable[str] = (), *, include_stored: bool = False
    ) -> list[BreakerState]:
        """One round trip on Redis server time (plus one SCAN with `include_stored`); a name
        given keeps its spelling even when its key is a digest."""
        keys = {state_key(name): name for name in names}
        if include_stored:
            keys = {**self._stored_keys(), **keys}
        ordered = sorted(keys.items(), key=lambda item: item[1])
        now_ms, hashes = read_hashes(self.client, [key for key, _ in ordered])
        return [
            BreakerState.decode(name, fields, now_ms=now_ms)
            for (_, name), fields in zip(ordered, hashes, strict=True)
        ]

    def count(self, name: str, outcome: str) -> None:
        try:
            client = self.client
        except Exception:  # noqa: BLE001 - counting never fails a call
            return
        count(client, outcome=outcome, guard="breaker", name=name)

