"""`jobs status`: every section, once, while `jobs demo` runs a workload through real workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from jobs.observe.snapshot import VIEWS
from tests.support import ROOT, wait_for

#: Section titles, in display order.
TITLES = {view.name: view.title for view in VIEWS}


def _purge(app: Any) -> None:
    from jobs.tiers import TIERS

    with app.connection_for_write() as connection:
        for tier in TIERS:
            connection.default_channel.queue_purge(tier)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}


class TestStatus:
    @pytest.mark.timeout(240)
    def test_status_once_during_demo_prints_every_section(
        self, app: Any, engine: Any, worker_factory: Any, purge_queues: None
    ) -> None:
        """`jobs status --once` during `jobs demo` prints each section's title and exits 0;
        piped to a file, every table is printed whole (no header or cell cut to `…`)."""
        from sqlalchemy import text

        def charges() -> int:
            with engine.connect() as connection:
                return int(connection.execute(text("SELECT count(*) FROM ledger_entries"))
                           .scalar_one())

        before = charges()
        worker_factory("critical,standard,optional", name="observe-status", concurrency=1)
        demo = subprocess.Popen([sys.executable, "-m", "jobs", "demo", "--rate", "5",
                                 "--seconds", "120"], cwd=ROOT, env=_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            # The demo is flowing once its payments reach the ledger (jobs finish too fast
            # on an idle machine to be caught queued or active reliably).
            wait_for(lambda: charges() > before, timeout_seconds=90, interval=0.5,
                     message="the demo's payments in the ledger")
            # Piped (not a terminal) and no COLUMNS: rich alone would cut cells to 80 columns.
            piped = {k: v for k, v in _env().items() if k not in ("COLUMNS", "LINES")}
            done = subprocess.run([sys.executable, "-m", "jobs", "status", "--once"], cwd=ROOT,
                                  env=piped, capture_output=True, text=True, timeout=120)
        finally:
            demo.terminate()
            demo.wait(30)
            _purge(app)  # the demo's backlog is not the next test's business
        assert done.returncode == 0, done.stderr[-3000:]
        for title in TITLES.values():
            assert title in done.stdout, f"section {title!r} missing:\n{done.stdout}"
        for tier in ("critical", "standard", "optional"):
            assert tier in done.stdout
        assert "unavailable" not in done.stdout.split("beat leader")[0]
        assert "…" not in done.stdout, f"a cell was cut when piped:\n{done.stdout}"
        for header in ("rejected", "discarded", "deferred", "replayed", "dead-lettered",
                       "failure rate", "half-open in"):
            assert header in done.stdout, f"{header!r} missing:\n{done.stdout}"

    @pytest.mark.timeout(120)
    def test_status_json_is_the_snapshot(self) -> None:
        """`jobs status --json` prints the snapshot: exactly the documented top-level keys;
        every store probed answers, so `unavailable` is empty and the exit code 0."""
        done = subprocess.run([sys.executable, "-m", "jobs", "status", "--json"], cwd=ROOT,
                              env=_env(), capture_output=True, text=True, timeout=110)
        assert done.returncode == 0, done.stderr[-3000:]
        snapshot = json.loads(done.stdout)
        for section in TITLES:
            assert section in snapshot
        assert set(snapshot) == {"taken_at", "collect_seconds", "stores", "unavailable",
                                 *TITLES, "counters", "workers", "errors"}
        assert snapshot["unavailable"] == {}
        assert {name: store["ok"] for name, store in snapshot["stores"].items()} == {
            "broker": True, "redis": True, "database": True}
