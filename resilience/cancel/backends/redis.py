"""Cancellation marks in Redis: one hash (target -> {"reason", "until"}) and a version key
set to a new random value with every change (never a counter: a flushed Redis would count
again from 0 and a worker could take new marks for its old copy), so a worker polls one
small GET and reloads the hash only when something changed. A missing version key means
the copy was lost (FLUSHDB, a restart without persistence), not that nothing is cancelled."""

from __future__ import annotations

import json
import uuid

from resilience.cancel.backends import Marks
from resilience.connections.redis import RedisStoreBackend

#: The marks and their version change together in one MULTI, so they share a hash tag:
#: on a Redis Cluster a transaction must stay in one slot.
MARKS_KEY = "resilience:cancel:{marks}"
VERSION_KEY = "resilience:cancel:{marks}:version"


class RedisCancelBackend(RedisStoreBackend):
    """Args: client: a Redis client, or a callable returning the process's client."""

    store_operation = "cancellations"

    def cancel(self, target: str, *, reason: str, expires_at: float) -> None:
        mark = json.dumps({"reason": reason or "cancelled", "until": expires_at})
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(MARKS_KEY, target, mark).set(VERSION_KEY, _new_version()).execute()

    def uncancel(self, target: str) -> bool:
        with self.client.pipeline(transaction=True) as pipe:
            removed, _ = pipe.hdel(MARKS_KEY, target).set(VERSION_KEY, _new_version()).execute()
        return bool(removed)

    def version(self) -> str:
        return str(self.client.get(VERSION_KEY) or "")

    def load(self) -> tuple[str, Marks]:
        with self.client.pipeline(transaction=True) as pipe:
            version, raw = pipe.get(VERSION_KEY).hgetall(MARKS_KEY).execute()
        return str(version or ""), {target: _decode(value) for target, value in raw.items()}

    def reasons(self, targets: list[str], *, now: float) -> str | None:
        if not targets:
            return None
        for value in self.client.hmget(MARKS_KEY, targets):
            if value is not None:
                reason, until = _decode(value)
                if until > now:
                    return reason
        return None

    def replace(self, marks: Marks) -> str:
        version = _new_version()
        with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(MARKS_KEY)
            if marks:
                pipe.hset(MARKS_KEY, mapping={
                    target: json.dumps({"reason": reason or "cancelled", "until": until})
                    for target, (reason, until) in marks.items()})
            pipe.set(VERSION_KEY, version).execute()
        return version

    def prune(self, *, now: float) -> int:
        expired = [target for target, (_, until) in self.load()[1].items() if until <= now]
        if not expired:
            return 0
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hdel(MARKS_KEY, *expired).set(VERSION_KEY, _new_version()).execute()
        return len(expired)


def _new_version() -> str:
    return uuid.uuid4().hex


def _decode(value: str | bytes) -> tuple[str, float]:
    try:
        mark = json.loads(value)
        return str(mark["reason"]), float(mark["until"])
    except (ValueError, KeyError, TypeError):
        return "cancelled", float("inf")  # unreadable: err on the side of the operator
