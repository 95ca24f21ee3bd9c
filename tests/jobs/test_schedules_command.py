"""`jobs schedules` against the session's PostgreSQL: every command changes the table as it
says, and bad input answers one clear line (exit 2), never a traceback."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from resilience.schedules import Cron, Interval, ScheduleNotFound, describe, next_fires, remove

TASK = "tests.observe.idle"


@pytest.fixture()
def name(stores: Any) -> Iterator[str]:
    """A fresh schedule name, removed after the test if it still exists."""
    chosen = f"cli-{uuid.uuid4().hex[:8]}"
    yield chosen
    with contextlib.suppress(ScheduleNotFound):
        remove(stores, chosen)


def run(*args: str) -> Any:
    from jobs.admin.schedules import cli

    return CliRunner().invoke(cli, list(args))


def one_line(result: Any) -> str:
    """The command's output as one line (rich wraps at the terminal's width)."""
    assert "Traceback" not in result.output, result.output
    return " ".join(result.output.split())


class TestSchedulesCommand:
    def test_add_edit_pause_resume_run_now_remove(self, app: Any, stores: Any,
                                                  name: str) -> None:
        """Each command's change is in the table: add (interval), edit to a cron entry in
        Paris with policies, pause, resume, run-now (a run row with the task id printed),
        list and show (the next five fires), remove."""
        added = run("add", name, "--task", TASK, "--every", "1h", "--args", "[1]",
                    "--overlap", "skip")
        assert added.exit_code == 0, added.output
        assert f"schedule '{name}' added" in one_line(added)
        summary = describe(stores, name)
        assert (summary.every, summary.args, summary.overlap.value, summary.source) == (
            Interval(3600.0), [1], "skip", "runtime")

        edited = run("edit", name, "--every", "*/5 * * * *", "--timezone", "Europe/Paris",
                     "--catch-up", "all", "--catch-up-window", "90m")
        assert edited.exit_code == 0, edited.output
        summary = describe(stores, name)
        assert summary.every == Cron("*/5 * * * *", timezone="Europe/Paris")
        assert (summary.catch_up.value, summary.catch_up_window_seconds,
                summary.overlap.value) == ("all", 5400.0, "skip")
        retimed = run("edit", name, "--timezone", "Asia/Kolkata")
        assert retimed.exit_code == 0, retimed.output
        assert describe(stores, name).every == Cron("*/5 * * * *", timezone="Asia/Kolkata")

        shown = run("show", name, "--json")
        assert shown.exit_code == 0, shown.output
        fires = [dt.datetime.fromisoformat(moment)
                 for moment in json.loads(shown.output)["next_fires"]]
        now = dt.datetime.now(dt.timezone.utc)
        assert len(fires) == 5 and now < fires[0] <= now + dt.timedelta(minutes=5)
        assert fires == next_fires(Cron("*/5 * * * *", timezone="Asia/Kolkata"),
                                   fires[0] - dt.timedelta(seconds=1), 5)
        table = one_line(run("show", name))
        assert f"schedule {name}: {TASK} */5 * * * * (Asia/Kolkata)" in table
        assert "next fires" in table and "IST" in table

        assert run("pause", name).exit_code == 0
        assert describe(stores, name).paused is True
        listed = json.loads(run("list", "--json").output)
        assert [row["paused"] for row in listed if row["name"] == name] == [True]
        resumed = run("resume", name)
        assert resumed.exit_code == 0 and "resumed: next fire" in one_line(resumed)
        assert describe(stores, name).paused is False

        fired = run("run-now", name)
        assert fired.exit_code == 0, fired.output
        task_id = one_line(fired).rsplit(" ", 1)[-1]
        assert [run_.task_id for run_ in describe(stores, name).last_runs] == [task_id]

        removed = run("remove", name)
        assert removed.exit_code == 0 and "removed" in one_line(removed)
        with pytest.raises(ScheduleNotFound):
            describe(stores, name)

    @pytest.mark.parametrize(("args", "says"), [
        (("show", "no-such-schedule"), "ScheduleNotFound: no schedule named 'no-such-schedule'"),
        (("pause", "no-such-schedule"), "no schedule named 'no-such-schedule'"),
        (("resume", "no-such-schedule"), "no schedule named 'no-such-schedule'"),
        (("remove", "no-such-schedule"), "no schedule named 'no-such-schedule'"),
        (("run-now", "no-such-schedule"), "no schedule named 'no-such-schedule'"),
        (("edit", "no-such-schedule", "--overlap", "skip"), "no schedule named"),
        (("add", "{name}", "--task", TASK, "--every", "61 * * * *"),
         "minute '61': 61 is out of range 0-59"),
        (("add", "{name}", "--task", TASK, "--every", "0 9 * * *", "--timezone", "Mars/Base"),
         "unknown time zone 'Mars/Base'"),
        (("add", "{name}", "--task", TASK, "--every", "2x"), "every is a period"),
        (("add", "{name}", "--task", TASK, "--every", "30", "--timezone", "Europe/Paris"),
         "a time zone goes with a cron expression"),
        (("add", "{name}", "--task", TASK, "--every", "30", "--args", "{"), "args is JSON"),
        (("add", "{name}", "--task", TASK, "--every", "30", "--catch-up", "sometimes"),
         "catch_up must be one of skip, once, all"),
        (("add", "{name}", "--task", TASK, "--every", "30", "--overlap", "never"),
         "overlap must be one of"),
    ])
    def test_bad_input_is_one_line(self, app: Any, stores: Any, name: str,
                                   args: tuple[str, ...], says: str) -> None:
        """An unknown name, a bad cron, time zone, period, JSON or policy: exit 2 and one
        line saying what is wrong; nothing is written."""
        result = run(*(arg.replace("{name}", name) for arg in args))
        assert result.exit_code == 2, result.output
        assert says in one_line(result)
        with pytest.raises(ScheduleNotFound):
            describe(stores, name)

    def test_refusals_on_an_existing_entry(self, app: Any, stores: Any, name: str) -> None:
        """A taken name, an edit with nothing to change, a time zone for an interval entry."""
        assert run("add", name, "--task", TASK, "--every", "60").exit_code == 0
        for args, says in (
            (("add", name, "--task", TASK, "--every", "60"), "already exists"),
            (("edit", name), "nothing to change"),
            (("edit", name, "--timezone", "Europe/Paris"), "a time zone goes with a cron"),
            (("edit", name, "--every", "0 0 31 2 *"), "never fires"),
        ):
            result = run(*args)
            assert result.exit_code == 2, (args, result.output)
            assert says in one_line(result), (args, result.output)
        assert describe(stores, name).every == Interval(60.0)
