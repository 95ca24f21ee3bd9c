"""Redis limiter backend: each decision one Lua script (the algorithm's), on Redis server
time, so limits hold across the fleet (Celery's own `rate_limit` is per worker).

Key layout (`resilience.keys.redis_key`): `<prefix>:<namespace>:{<key>}` is a limiter and
`<prefix>:<namespace>:{<key>}:waiting` its waiting line, the key percent-encoded (or
digested when long) inside the hash tag: no key can name another key's waiting line, and a
limiter and its line share a Redis Cluster slot.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any

from resilience.connections import wrap_store_errors
from resilience.connections.redis import RedisStoreBackend, is_cluster
from resilience.errors import ConfigurationError
from resilience.keys import redis_key, stored_keys
from resilience.ratelimit.algorithms import (
    ALGORITHMS,
    Algorithm,
    Decision,
    LimiterState,
    Params,
    Schema,
)
from resilience.scripts import LuaScript

if TYPE_CHECKING:
    import redis


@cache
def script(filename: str) -> LuaScript:
    """The Lua script `filename` of this folder, read once (an algorithm's `script`)."""
    return LuaScript.load(__file__, filename)


def _read_sorted_set(pipe: Any, stored: str) -> None:
    pipe.zrange(stored, 0, -1, withscores=True)


#: One reader per state schema: the command queued, and the reply as the pure step's state.
_READERS: dict[Schema, tuple[Callable[[Any, str], None], Callable[[Any], Any]]] = {
    Schema.TIME: (lambda pipe, stored: pipe.get(stored),
                  lambda reply: int(reply) if reply is not None else None),
    Schema.LOG: (_read_sorted_set, lambda reply: [int(score) for _, score in reply]),
    Schema.LEASES: (_read_sorted_set, lambda reply: {member: int(s) for member, s in reply}),
}


class RedisBackend(RedisStoreBackend):
    """Limiter state in Redis.

    Args:
        client: a Redis client, or a callable returning the process's client (fork-safe).
        prefix: key prefix of all limiter state (no `{` or `}`).
    """

    store_operation = "limiter"

    def __init__(
        self, client: redis.Redis | Callable[[], redis.Redis], *, prefix: str = "resilience:limits"
    ) -> None:
        super().__init__(client)
        self.prefix = prefix

    def key(self, algorithm: Algorithm, key: str, *suffixes: str) -> str:
        """The Redis key of limiter `key` of `algorithm`; its waiting line adds `waiting`."""
        return redis_key(f"{self.prefix}:{algorithm.namespace}", key, *suffixes)

    def run(
        self, algorithm: Algorithm, key: str, params: Params, caller: str | None = None
    ) -> Decision:
        keys = [self.key(algorithm, key)]
        if algorithm.waits:
            keys.append(self.key(algorithm, key, "waiting"))
        arguments = algorithm.arguments(params, caller or uuid.uuid4().hex)
        what = "concurrency limit" if algorithm.holds else "rate limit"
        with wrap_store_errors(what, key=key):
            decide = script(algorithm.script)
            allowed, retry, now, *rest = decide(self.client, keys=keys, args=arguments)
        used = int(rest[0]) if rest else 0
        return Decision(bool(int(allowed)), int(retry) / 1e6, int(now) / 1e6, used)

    def release(self, algorithm: Algorithm, key: str, caller: str) -> bool:
        if algorithm.release_script is None:
            raise ConfigurationError(f"algorithm {algorithm.name!r} holds no slots to release")
        with wrap_store_errors("concurrency limit release", key=key):
            # An expired lease may already be gone (reclaimed by a later acquire).
            release = script(algorithm.release_script)
            return bool(release(self.client, keys=[self.key(algorithm, key)], args=[caller]))

    def describe(
        self, algorithm: Algorithm | None = None, key: str | None = None
    ) -> list[LimiterState]:
        chosen = [algorithm] if algorithm is not None else list(ALGORITHMS.values())
        found = [(each, one, stored) for each in chosen for one, stored in self._stored(each, key)]
        # One round trip for the clock and every limiter's state and waiting line. A Redis
        # Cluster's pipeline refuses TIME (no key, no slot): one more round trip reads it
        # there, and the pipeline goes out per master.
        client = self.client
        cluster = is_cluster(client)
        with client.pipeline(transaction=False) as pipe:
            if not cluster:
                pipe.time()
            for each, one, stored in found:
                _READERS[each.schema][0](pipe, stored)
                if each.waits:
                    pipe.zcard(self.key(each, one, "waiting"))
            replies = pipe.execute()
        if cluster:
            replies = [client.time(), *replies]
        replies = iter(replies)
        seconds, micros = next(replies)
        now = int(seconds) * 1_000_000 + int(micros)
        states = []
        for each, one, _ in found:
            state = _READERS[each.schema][1](next(replies))
            waiting = int(next(replies)) if each.waits else 0
            states.append(each.describe(one, state, now, waiting))
        return states

    def _stored(self, algorithm: Algorithm, key: str | None) -> list[tuple[str, str]]:
        """(key, Redis key) of `key`, or of every limiter of `algorithm` with state in Redis
        (one SCAN; waiting lines left out), sorted by key."""
        if key is not None:
            return [(key, self.key(algorithm, key))]
        namespace = f"{self.prefix}:{algorithm.namespace}"
        return sorted((value, name) for name, value in stored_keys(self.client, namespace).items())
