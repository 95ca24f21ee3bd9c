"""`SingletonConfig` / `ExclusiveConfig`: bad options fail at definition time, named."""

from __future__ import annotations

import types
from typing import Any

import pytest

from resilience.errors import ConfigurationError
from resilience.locks import ExclusiveConfig, ExclusiveGuard, exclusive, singleton
from tests.resilience.locks.conftest import Nodes


class TestConfig:
    def test_ttl_must_be_positive(self) -> None:
        """TTL <= 0 (or not a number) is refused when the decorator is applied."""
        for ttl in (0, -1, float("nan")):
            with pytest.raises(ConfigurationError, match="ttl_seconds"):
                exclusive(ttl_seconds=ttl)

    def test_fewer_than_three_nodes(self, nodes: Nodes) -> None:
        """A Redlock option with fewer than 3 nodes is refused."""
        with pytest.raises(ConfigurationError, match="at least 3"):
            exclusive(nodes=nodes.urls[:2])

    def test_nodes_as_one_string(self, nodes: Nodes) -> None:
        """`nodes` may be a comma-separated string, as `REDLOCK_URLS` is."""
        config = ExclusiveConfig(nodes=",".join(nodes.urls))  # type: ignore[arg-type]
        assert config.nodes == tuple(nodes.urls)

    def test_bad_policies(self) -> None:
        """An unknown policy or a renew fraction outside (0, 1) is refused."""
        with pytest.raises(ConfigurationError, match="policy"):
            singleton(policy="wait")
        with pytest.raises(ConfigurationError, match="renew_fraction"):
            exclusive(renew_fraction=1.5)

    def test_lease_shorter_than_time_limit(self) -> None:
        """An exclusive lease that cannot outlast the task's time limit is refused."""

        def body() -> None: ...

        guard = ExclusiveGuard(body, None, ExclusiveConfig(ttl_seconds=5, heartbeat=False))
        task: Any = types.SimpleNamespace(name="t", time_limit=20, run=body)
        with pytest.raises(ConfigurationError, match="time limit"):
            guard.bind(task)

    def test_longest_hold_counts_every_renewal(self) -> None:
        """The longest hold is the TTL plus every capped renewal (TTL alone without heartbeat)."""
        config = ExclusiveConfig(ttl_seconds=10, renew_fraction=0.5, max_extensions=4)
        assert config.longest_hold_seconds == 30
        assert ExclusiveConfig(ttl_seconds=10, heartbeat=False).longest_hold_seconds == 10
