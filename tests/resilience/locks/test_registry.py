"""`describe()` and `force_release()`: the live state of the locks, on real stores."""

from __future__ import annotations

import uuid
from typing import Any

from resilience.locks import (
    AdvisoryLockBackend,
    Claimant,
    FencingTokens,
    Redlock,
    RedlockBackend,
    describe,
    force_release,
)
from resilience.locks.backends.postgres import HeldLockRegistry, discard_thread_session
from tests.resilience.locks.conftest import Nodes


class TestDescribe:
    def test_lists_a_held_singleton_and_exclusive_lock(self, stores: Any, nodes: Nodes) -> None:
        """Both kinds are listed with their holder task and fencing token, alive, and are
        gone from the listing once released."""
        slot = uuid.uuid4().hex[:8]
        advisory = AdvisoryLockBackend(stores.database_url, engine=stores.engine)
        redlock = RedlockBackend(Redlock.from_urls(nodes.urls),
                                 registry=HeldLockRegistry(stores.engine),
                                 tokens=FencingTokens(stores.engine()), ttl_seconds=10)
        single = advisory.acquire(f"s:{slot}", Claimant(task_id="task-s", task_name="n"))
        excl = redlock.acquire(f"e:{slot}", Claimant(task_id="task-e", task_name="n"))
        assert single is not None and excl is not None
        try:
            listed = {holder.key: holder for holder in describe(stores, nodes.urls)}
            assert listed[f"s:{slot}"].kind == "singleton"
            assert listed[f"s:{slot}"].owner == "task-s"
            assert listed[f"s:{slot}"].token == single.token
            assert listed[f"e:{slot}"].kind == "exclusive"
            assert listed[f"e:{slot}"].owner == "task-e"
            assert listed[f"e:{slot}"].token == excl.token
            assert listed[f"s:{slot}"].alive and listed[f"e:{slot}"].alive
        finally:
            advisory.release(single)
            redlock.release(excl)
            discard_thread_session()
        keys = {holder.key for holder in describe(stores, nodes.urls)}
        assert not keys & {f"s:{slot}", f"e:{slot}"}

    def test_a_row_whose_lock_is_gone_is_not_alive(self, stores: Any, nodes: Nodes) -> None:
        """A registry row left behind (the lock deleted on the nodes) is listed, not alive;
        without Redlock nodes to check, exclusive rows are reported not alive either."""
        key = f"e:{uuid.uuid4().hex[:8]}"
        redlock = RedlockBackend(Redlock.from_urls(nodes.urls),
                                 registry=HeldLockRegistry(stores.engine), ttl_seconds=10)
        taken = redlock.acquire(key, Claimant(task_id="task-e", task_name="n"))
        assert taken is not None
        assert {h.key: h for h in describe(stores, ())}[key].alive is False
        redlock.redlock.force_release(key)
        assert {h.key: h for h in describe(stores, nodes.urls)}[key].alive is False
        assert "registry entry removed" in force_release(stores, key, nodes.urls)
        assert key not in {h.key for h in describe(stores, nodes.urls)}

    def test_force_release_ends_the_holding_session(self, stores: Any) -> None:
        """A singleton held by another session is freed by terminating that session."""
        key = f"s:{uuid.uuid4().hex[:8]}"
        advisory = AdvisoryLockBackend(stores.database_url, engine=stores.engine)
        taken = advisory.acquire(key, Claimant(task_id="task-s", task_name="n"))
        assert taken is not None
        done = force_release(stores, key)
        assert "terminated 1 PostgreSQL session" in done and "registry entry removed" in done
        discard_thread_session()
        assert advisory.acquire(key, Claimant(task_id="next", task_name="n")) is not None
        discard_thread_session()
