"""`jobs worker --restart-on-stall`: a worker the consumption watchdog ended (status 75) is
started again, for supervisors that restart nothing (honcho under `jobs up`)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from jobs.cli import procfile, run_restarting_on_stall
from jobs.observe.watchdog import EXIT_STALLED
from jobs.settings import get_settings

#: Appends a line per start; exits 75 on its first two starts, then with the given status.
CHILD = """
import sys
from pathlib import Path
log = Path(sys.argv[1])
starts = len(log.read_text().splitlines()) if log.exists() else 0
log.write_text("start\\n" * (starts + 1))
sys.exit({stalled} if starts < 2 else int(sys.argv[2]))
"""


class TestRestartOnStall:
    def test_a_stalled_worker_is_started_again_until_it_ends_otherwise(
            self, tmp_path: Path) -> None:
        """Two stall exits are followed by new starts; the third exit's status is returned."""
        log = tmp_path / "starts"
        script = CHILD.format(stalled=EXIT_STALLED)
        status = run_restarting_on_stall([sys.executable, "-c", script, str(log), "3"])
        assert status == 3
        assert len(log.read_text().splitlines()) == 3

    def test_a_signal_stops_the_worker_and_is_not_restarted(self, tmp_path: Path) -> None:
        """SIGTERM reaches the child and ends the loop, whatever status the child exits with."""
        runner = subprocess.Popen([
            sys.executable, "-c",
            "import sys; from jobs.cli import run_restarting_on_stall as r; "
            f"sys.exit(r([sys.executable, '-c', 'import signal,sys,time; "
            f"signal.signal(signal.SIGTERM, lambda *a: sys.exit({EXIT_STALLED})); "
            "open(sys.argv[1], \"a\").write(\"start\\\\n\"); time.sleep(60)', "
            f"{str(tmp_path / 'starts')!r}]))",
        ])
        deadline = time.monotonic() + 20
        while not (tmp_path / "starts").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(timeout=20) == EXIT_STALLED
        assert len((tmp_path / "starts").read_text().splitlines()) == 1

    def test_jobs_up_runs_its_workers_restarting_on_stall(self) -> None:
        lines = [line for line in procfile(get_settings()).splitlines()
                 if line.startswith("worker_")]
        assert lines and all("--restart-on-stall" in line for line in lines)
