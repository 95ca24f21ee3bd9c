"""Tasks of the singleton-loss partition test: a transactional singleton that keeps writing
to a fenced resource and calls `checkpoint()` while it runs (test_singleton_loss.py)."""

from __future__ import annotations

import threading
import time
from typing import Any

from sqlalchemy.exc import DBAPIError

from jobs import app
from resilience.errors import LockNotOwnedError, StaleFencingToken
from resilience.idempotency import idempotent
from resilience.locks import FencingTokens, singleton
from resilience.stores import stores_for
from tests.partition.tasks import _record, _write

TIER = "critical"


@app.task(tier=TIER, bind=True, name="tests.partition.singleton_writer")
@idempotent(key="partition-singleton:{run_id}:{role}", transactional=True, cache=False,
            lease_seconds=5, poll_seconds=1, store_down_retry_seconds=1)
@singleton(key="partition-singleton:{run_id}", policy="skip")
def singleton_writer(
    self: Any, run_id: str, role: str, seconds: float, interval_seconds: float = 0.2,
    fencing_token: int | None = None, checkpoint: Any = None, session: Any = None,
) -> dict[str, Any]:
    """For `seconds`, every `interval_seconds`, a write to `run_id`'s resource fenced with
    this holder's token (`partition_writes`: written / refused; a write that cannot reach
    PostgreSQL is skipped), whatever `checkpoint()` says — as a body that never asks would.
    Beside it a thread calls `checkpoint()` every 0.1 s and records its first failure
    ("lost"): the body's writes may block on a dead connection, the check does not. Then an
    `effect` row in the body's transaction, committed with the idempotency record. Records
    go to the guard Redis (`_record`, with the role). A later run of a role (the deferral
    of a refused commit) records "rerun" and writes nothing."""
    if stores_for(app).redis().incr(f"partition:{run_id}:{role}:runs") > 1:
        _record(run_id, "rerun", self.request.id, role=role, token=fencing_token)
        return {"rerun": True, "token": fencing_token}
    _record(run_id, "start", self.request.id, role=role, token=fencing_token)
    done = threading.Event()

    def check() -> None:
        while not done.wait(0.1):
            try:
                checkpoint()
            except LockNotOwnedError as exc:
                _record(run_id, "lost", self.request.id, role=role, error=str(exc)[:300])
                return

    checker = threading.Thread(target=check, daemon=True)
    checker.start()
    resource = f"partition-singleton:{run_id}"
    engine = stores_for(app).engine()
    deadline = time.monotonic() + seconds
    try:
        while True:
            try:
                outcome = "written"
                try:
                    with engine.begin() as connection:
                        FencingTokens.guard_write(connection, resource, fencing_token)
                        _write(connection, run_id, role, self.request.id, fencing_token,
                               outcome)
                except StaleFencingToken:
                    outcome = "refused"
                    with engine.begin() as connection:
                        _write(connection, run_id, role, self.request.id, fencing_token,
                               outcome)
            except DBAPIError:
                pass  # cut off from PostgreSQL: nothing was written
            if time.monotonic() >= deadline:
                break
            time.sleep(interval_seconds)
    finally:
        done.set()
        checker.join()
    _write(session, run_id, role, self.request.id, fencing_token, "effect")
    _record(run_id, "end", self.request.id, role=role, token=fencing_token)
    return {"token": fencing_token}
