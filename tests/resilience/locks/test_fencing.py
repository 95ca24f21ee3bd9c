"""`FencingTokens`: tokens that only grow, and the resource-side check."""

from __future__ import annotations

from typing import Any

import pytest

from resilience.errors import StaleFencingToken
from resilience.locks import FencingTokens, Redlock, RedlockConfig
from tests.resilience.locks.conftest import Nodes


def _redlock_unchecked(nodes: Nodes, **options: Any) -> Redlock:
    import redis

    clients = [redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
               for url in nodes.urls]
    return Redlock(clients, options=RedlockConfig(**options))


class TestFencing:
    def test_tokens_increase_across_node_restarts(self, nodes: Nodes, engine: Any) -> None:
        """Tokens strictly increase per key, also after 2 of 5 nodes restart empty."""
        tokens = FencingTokens(engine)
        seen = []
        for round_ in range(3):
            redlock = _redlock_unchecked(nodes, retry_count=0)
            lease = redlock.acquire("fenced", ttl_seconds=5)
            assert lease is not None
            seen.append(tokens.mint("fenced"))
            redlock.release(lease)
            if round_ == 0:
                nodes.restart_empty(0)
                nodes.restart_empty(1)
        assert seen == sorted(seen) and len(set(seen)) == len(seen)

    def test_stale_token_write_rejected(self, engine: Any) -> None:
        """A write with an older token than the newest seen is refused and rolled back."""
        tokens = FencingTokens(engine)
        old, new = tokens.mint("r"), tokens.mint("r")
        key = f"resource-{new}"
        with engine.begin() as connection:
            FencingTokens.guard_write(connection, key, new)
        with engine.begin() as connection:
            FencingTokens.guard_write(connection, key, new)  # same holder writes again
        with pytest.raises(StaleFencingToken, match="older than"), engine.begin() as connection:
            FencingTokens.guard_write(connection, key, old)
        assert tokens.newest(key) == new
