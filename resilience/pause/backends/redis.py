"""Pause switches in Redis: one hash per switch, read for a whole call with one MGET-like
pipeline; keys from `resilience.keys.redis_key`, so a task name cannot name another key.
On a Redis Cluster the switches live in different slots: they are read per master
(`resilience.connections.redis.mget`)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from resilience.connections.redis import RedisStoreBackend, mget
from resilience.keys import redis_key, stored_keys
from resilience.pause.backends import Paused

NAMESPACE = "resilience:pause"


class RedisPauseBackend(RedisStoreBackend):
    """Switches as string keys holding `{"reason": ..., "since": ...}` (no TTL: a pause
    lasts until someone resumes it).

    Args:
        client: a Redis client, or a callable returning the process's client (fork-safe).
    """

    store_operation = "pause switches"

    @staticmethod
    def key(scope: str, name: str) -> str:
        return redis_key(NAMESPACE, f"{scope}:{name}")

    def pause(self, scope: str, name: str, *, reason: str) -> None:
        seconds, micros = self.client.time()
        value = json.dumps({"reason": reason, "since": seconds + micros / 1e6})
        self.client.set(self.key(scope, name), value)

    def resume(self, scope: str, name: str) -> bool:
        return bool(self.client.delete(self.key(scope, name)))

    def paused(self, switches: Sequence[tuple[str, str]]) -> list[Paused]:
        if not switches:
            return []
        values = mget(self.client, [self.key(scope, name) for scope, name in switches])
        return [_decode(scope, name, value)
                for (scope, name), value in zip(switches, values, strict=True) if value]

    def all_paused(self) -> list[Paused]:
        stored = stored_keys(self.client, NAMESPACE, suffixed=True)
        values = mget(self.client, list(stored)) if stored else []
        found = []
        for (_, switch), value in zip(stored.items(), values, strict=True):
            if value is None:  # resumed since the SCAN
                continue
            scope, _, name = switch.partition(":")
            found.append(_decode(scope, name, value))
        return sorted(found, key=lambda paused: (paused.scope, paused.name))


def _decode(scope: str, name: str, value: str) -> Paused:
    try:
        data = json.loads(value)
        return Paused(scope, name, str(data.get("reason", "")), float(data.get("since", 0)))
    except (ValueError, TypeError, AttributeError):
        return Paused(scope, name, "", 0.0)
