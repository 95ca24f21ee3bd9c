"""Helpers of the outbox tests: `jobs outbox relay` as a real process, the ledger's reads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from typing import Any

from sqlalchemy import text

from tests.support import ARTIFACTS, ROOT

READY_LINE = "outbox relay ready"


class RelayProcess:
    """One `python -m jobs outbox relay` process that a test can SIGKILL and restart."""

    def __init__(self, *options: str, name: str = "relay", env: dict[str, str] | None = None
                 ) -> None:
        self.options = list(options)
        self.env = dict(env or {})
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = ARTIFACTS / "outbox" / f"{name}-{uuid.uuid4().hex[:8]}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)

    def start(self) -> RelayProcess:
        env = {**os.environ, **self.env, "PYTHONPATH": str(ROOT)}
        env.pop("PYTEST_CURRENT_TEST", None)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "jobs", "outbox", "relay", *self.options],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def ready_count(self) -> int:
        """How many lives of this relay reached their loop (one line each)."""
        if not self.log_path.exists():
            return 0
        return self.log_path.read_text(errors="replace").count(READY_LINE)

    def wait_ready(self, lives: int, timeout_seconds: float = 60) -> None:
        """Block until the log shows `lives` lives ready."""
        deadline = time.monotonic() + timeout_seconds
        while self.ready_count() < lives:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"relay exited:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"relay not ready:\n{self.log_tail()}")
            time.sleep(0.02)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def sigkill(self) -> None:
        if self.alive():
            assert self.process is not None
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self, timeout_seconds: float = 10) -> None:
        """SIGTERM (the relay finishes its batch), SIGKILL if it does not exit in time."""
        if not self.alive():
            return
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_seconds)
        except subprocess.TimeoutExpired:
            self.sigkill()

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]


def effects(engine: Any, run: str) -> list[Any]:
    """The ledger rows of one test run: (n, task_id, ran_at)."""
    with engine.connect() as connection:
        return connection.execute(
            text("SELECT n, task_id, ran_at FROM outbox_test_effects WHERE run = :run "
                 "ORDER BY id"), {"run": run}).all()


def outbox_rows(engine: Any, task_ids: list[str] | None = None) -> list[Any]:
    """Outbox rows (all, or of these task ids), in id order."""
    query = "SELECT * FROM resilience_outbox"
    params: dict[str, Any] = {}
    if task_ids is not None:
        query += " WHERE task_id = ANY(:ids)"
        params["ids"] = list(task_ids)
    with engine.connect() as connection:
        return connection.execute(text(query + " ORDER BY id"), params).all()
