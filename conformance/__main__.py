"""`python -m conformance`: kombu's and Celery's own suites, stock and with the platform's pieces.

Fetches the PyPI source releases of the installed kombu and Celery (cached under
`.data/conformance`), then runs each suite twice in the same command: stock, and with the
platform's Redis transport, task base class and worker consumer in place
(`conformance.plugin`). Prints both tallies per suite and every test that passes stock
and fails with the platform, minus those `conformance/divergences.toml` lists as intended
(each with its reason). Exits 1 when an unexplained divergence remains.

Every run gets a Redis of its own (the runs go in parallel: a shared queue would let one
run's worker take the other's tasks); the platform runs share one embedded PostgreSQL
with the platform's schema, where the intake consumer writes its dead letters. A test
that diverges is run once more on its own with the platform: one that passes then is
reported as flaky, apart from the divergences (the machine is shared and the
runs go in parallel: some of these suites are timing-sensitive). See docs/conformance.md.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
DIVERGENCES = Path(__file__).with_name("divergences.toml")
#: The files holding the platform's pieces; the report names their state (commit, edits).
PIECES = ("jobs/broker.py", "jobs/fetch.lua", "resilience/admission/broker.py",
          "resilience/task.py", "resilience/deadletter/intake.py")
MODES = ("stock", "platform")
#: What a test's records fold into, worst first (subtests report under their test's id).
PRECEDENCE = ("error", "failed", "xpassed", "passed", "xfailed", "skipped")
PASSING = ("passed", "xpassed")
FAILING = ("failed", "error", "not run")


@dataclass(frozen=True)
class Suite:
    """Test files of one project's source release, run as one pytest session per mode."""

    name: str
    project: str
    paths: tuple[str, ...]
    #: Environment for a run against a Redis on 127.0.0.1:`port`.
    redis_env: tuple[tuple[str, str], ...] = ()

    def environment(self, port: int) -> dict[str, str]:
        return {key: value.format(port=port) for key, value in self.redis_env}


_KOMBU_REDIS = (("REDIS_HOST", "127.0.0.1"), ("REDIS_6379_TCP", "{port}"))
_CELERY_REDIS = (("TEST_BROKER", "redis://127.0.0.1:{port}/0"),
                 ("TEST_BACKEND", "redis://127.0.0.1:{port}/1"),
                 ("REDIS_HOST", "127.0.0.1"), ("REDIS_PORT", "{port}"))

SUITES = (
    # Longest first: the runs are started in this order.
    Suite("celery-canvas", "celery", ("t/integration/test_canvas.py",), _CELERY_REDIS),
    Suite("celery-integration", "celery",
          ("t/integration/test_tasks.py", "t/integration/test_inspect.py",
           "t/integration/test_connection_recovery.py"), _CELERY_REDIS),
    Suite("kombu-integration", "kombu",
          ("t/integration/test_redis.py", "t/integration/test_redis_brpop_qos.py"),
          _KOMBU_REDIS),
    Suite("kombu-unit", "kombu", ("t/unit/transport/test_redis.py",)),
    Suite("celery-unit", "celery", ("t/unit/tasks/test_tasks.py",)),
)


@dataclass
class Run:
    """One pytest session: a suite in one mode, and what each test did."""

    suite: Suite
    mode: str
    outcomes: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    exercised: dict[str, object] = field(default_factory=dict)
    cut_short: bool = False
    seconds: float = 0.0

    def tally(self) -> Counter[str]:
        folded = {"xpassed": "passed", "xfailed": "skipped"}
        return Counter(folded.get(outcome, outcome) for outcome in self.outcomes.values())


@dataclass(frozen=True)
class Entry:
    """A line of divergences.toml: tests of a suite (a glob on the test id) and why."""

    suite: str
    test: str
    reason: str

    def matches(self, suite: str, test: str) -> bool:
        return self.suite == suite and fnmatch.fnmatchcase(test, self.test)


def load_entries(path: Path = DIVERGENCES) -> tuple[list[Entry], list[Entry]]:
    """The intended divergences and the tests left out of both runs, from `path`.

    Raises:
        ValueError: an entry without a suite, a test or a reason, or an unknown suite.
    """
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    known = {suite.name for suite in SUITES}
    lists: list[list[Entry]] = []
    for kind in ("intended", "excluded"):
        entries = []
        for item in data.get(kind, []):
            entry = Entry(str(item.get("suite", "")), str(item.get("test", "")),
                          str(item.get("reason", "")).strip())
            if entry.suite not in known or not entry.test or not entry.reason:
                raise ValueError(f"{path.name}: [[{kind}]] needs a known suite ({sorted(known)}),"
                                 f" a test and a reason: {item}")
            entries.append(entry)
        lists.append(entries)
    return lists[0], lists[1]


# -- sources -------------------------------------------------------------------------
def fetch_sources(cache: Path) -> dict[str, Path]:
    """The test suites of the installed kombu and Celery, from their PyPI source releases.

    Downloads each sdist once (`pip download --no-binary :all:`) and extracts its `t/` tree
    and pytest configuration, not the package itself, so the tests import the installed code.
    """
    trees = {}
    for project in ("kombu", "celery"):
        version = importlib.metadata.version(project)
        tree = cache / "src" / f"{project}-{version}"
        if not (tree / "t").is_dir():
            sdists = cache / "sdist"
            archive = sdists / f"{project}-{version}.tar.gz"
            if not archive.exists():
                subprocess.run(
                    [sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:",
                     "--no-deps", f"{project}=={version}", "-d", str(sdists)], check=True)
            partial = tree.with_name(tree.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            with tarfile.open(archive) as sdist:
                prefix = f"{project}-{version}/"
                members = [member for member in sdist.getmembers()
                           if member.name.startswith((prefix + "t/", prefix + "setup.cfg",
                                                      prefix + "pyproject.toml"))]
                sdist.extractall(partial, members=members, filter="data")
            (partial / f"{project}-{version}").rename(tree)
            partial.rmdir()
        trees[project] = tree
    return trees


# -- services --------------------------------------------------------------------------
@contextmanager
def redis_server(data_dir: Path) -> Iterator[int]:
    """A throwaway Redis on a free port (the embedded one `jobs up` uses)."""
    from jobs.embedded import embedded_redis, free_port

    port = free_port()
    server = embedded_redis(port, data_dir).start()
    try:
        yield port
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


@contextmanager
def postgres_server(data_dir: Path) -> Iterator[str]:
    """An embedded PostgreSQL with the platform's schema, for the intake's dead letters."""
    from jobs.db import migrate
    from jobs.embedded import embedded_postgres, free_port

    server = embedded_postgres(free_port(), data_dir, database="conformance").start(60)
    try:
        migrate(server.url)
        yield server.url
    finally:
        server.stop()


# -- runs ------------------------------------------------------------------------------
def read_results(path: Path, run: Run) -> None:
    """Fold the plugin's JSON lines into `run` (subtests under their test, worst wins)."""
    if not path.exists():
        return
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if "exercised" in record:
            run.exercised = record["exercised"]
            continue
        test, outcome = record["test"], record["outcome"]
        current = run.outcomes.get(test)
        if current is None or PRECEDENCE.index(outcome) < PRECEDENCE.index(current):
            run.outcomes[test] = outcome
            if record.get("reason"):
                run.reasons[test] = record["reason"]


def start_run(run: Run, tree: Path, work: Path, *, redis_port: int | None,
              database_url: str | None, tests: list[str], deselect: list[str],
              timeout_seconds: int) -> tuple[subprocess.Popen[bytes], Path]:
    """Start one pytest session in the suite's source tree; its results go to a JSON file."""
    tag = f"{run.suite.name}-{run.mode}"
    results = work / f"{tag}.jsonl"
    results.unlink(missing_ok=True)
    env = {key: value for key, value in os.environ.items()
           if key not in ("REDIS_URL", "DATABASE_URL", "BROKER_URL", "PYTEST_ADDOPTS")}
    env.update(CONFORMANCE_MODE=run.mode, CONFORMANCE_RESULTS=str(results),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    if redis_port is not None:
        env.update(run.suite.environment(redis_port))
        env["CONFORMANCE_REDIS_URL"] = f"redis://127.0.0.1:{redis_port}/2"
        if database_url:
            env["CONFORMANCE_DATABASE_URL"] = database_url
    command = [sys.executable, "-m", "pytest", *tests, "-q", "-p", "no:cacheprovider",
               "-p", "conformance.plugin", f"--timeout={timeout_seconds}",
               *(f"--deselect={test}" for test in deselect)]
    log = (work / f"{tag}.log").open("wb")
    process = subprocess.Popen(command, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    log.close()
    return process, results


def run_all(runs: list[Run], trees: dict[str, Path], work: Path, *, database_url: str | None,
            tests_of: dict[str, list[str]], deselect_of: dict[str, list[str]], jobs: int,
            deadline_seconds: float, timeout_seconds: int) -> None:
    """Run `runs`, at most `jobs` at a time; a run past the deadline is stopped, cut short."""
    pending = list(runs)
    active: list[tuple[Run, subprocess.Popen[bytes], Path, ExitStack, float]] = []
    with ExitStack() as services:
        while pending or active:
            while pending and len(active) < jobs:
                run = pending.pop(0)
                stack = ExitStack()
                port = None
                if run.suite.redis_env:
                    port = stack.enter_context(redis_server(
                        Path(tempfile.mkdtemp(prefix=f"{run.suite.name}-", dir=work))))
                process, results = start_run(
                    run, trees[run.suite.project], work, redis_port=port,
                    database_url=database_url if run.mode == "platform" else None,
                    tests=tests_of[run.suite.name], deselect=deselect_of[run.suite.name],
                    timeout_seconds=timeout_seconds)
                services.callback(stack.close)
                active.append((run, process, results, stack, time.monotonic()))
            time.sleep(0.5)
            for item in list(active):
                run, process, results, stack, started = item
                elapsed = time.monotonic() - started
                if process.poll() is None and elapsed > deadline_seconds:
                    run.cut_short = True
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                if process.poll() is not None:
                    run.seconds = elapsed
                    read_results(results, run)
                    stack.close()
                    active.remove(item)
                    print(f"  {run.suite.name:<19} {run.mode:<8} {elapsed:6.0f} s"
                          f"{'  CUT SHORT at the deadline' if run.cut_short else ''}",
                          flush=True)


# -- comparison ------------------------------------------------------------------------
def diverging(stock: Run, platform: Run) -> list[str]:
    """Tests that pass stock and fail, error or never ran with the platform's pieces."""
    return sorted(test for test, outcome in stock.outcomes.items()
                  if outcome in PASSING
                  and platform.outcomes.get(test, "not run") in FAILING)


def pieces_state() -> str:
    """The commit and which platform piece files have uncommitted edits."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.rstrip()

    edited = git("status", "--porcelain", "--", *PIECES).splitlines()
    names = [line[3:] for line in edited]
    return f"commit {git('rev-parse', '--short', 'HEAD').strip()}" + (
        f", uncommitted edits in {', '.join(names)}" if names else ", pieces as committed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("--suite", action="append", choices=[s.name for s in SUITES],
                        help="run only this suite (repeatable); default: all")
    parser.add_argument("--cache", type=Path, default=ROOT / ".data" / "conformance",
                        help="sdists, extracted suites and run logs (default .data/conformance)")
    parser.add_argument("--jobs", type=int, default=6, help="pytest sessions at once")
    parser.add_argument("--deadline", type=float, default=780,
                        help="seconds one session may take before it is stopped")
    parser.add_argument("--test-timeout", type=int, default=60,
                        help="seconds one test may take (pytest-timeout)")
    parser.add_argument("--no-rerun", action="store_true",
                        help="report divergences without running them again")
    parser.add_argument("--report-only", action="store_true",
                        help="run nothing: report the last run's results (in the cache) "
                             "against divergences.toml as it is now")
    options = parser.parse_args(argv)

    started = time.monotonic()
    intended, excluded = load_entries()
    suites = [s for s in SUITES if not options.suite or s.name in options.suite]
    cache = options.cache.resolve()
    trees = fetch_sources(cache)
    work = cache / "runs"
    if options.report_only:
        return report_last(suites, work, intended, excluded)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    print(f"kombu {importlib.metadata.version('kombu')}, celery "
          f"{importlib.metadata.version('celery')}; platform pieces at {pieces_state()}")
    print(f"suites from {cache / 'src'}; logs in {work}", flush=True)

    deselect_of = {s.name: [e.test for e in excluded if e.suite == s.name] for s in suites}
    tests_of = {s.name: list(s.paths) for s in suites}
    runs = {(s.name, mode): Run(s, mode) for s in suites for mode in MODES}
    with postgres_server(cache / "postgres") as database_url:
        run_all(list(runs.values()), trees, work, database_url=database_url,
                tests_of=tests_of, deselect_of=deselect_of, jobs=options.jobs,
                deadline_seconds=options.deadline, timeout_seconds=options.test_timeout)
        found = {s.name: diverging(runs[s.name, "stock"], runs[s.name, "platform"])
                 for s in suites}
        flaky: dict[str, list[str]] = {}
        unexplained_first = {name: [t for t in tests if not any(
            e.matches(name, t) for e in intended)] for name, tests in found.items()}
        if not options.no_rerun and any(unexplained_first.values()):
            print("running each unexplained divergence again, alone, with the platform",
                  flush=True)
            again = {name: Run(Suite(f"{name}-again", runs[name, "platform"].suite.project,
                                     (), runs[name, "platform"].suite.redis_env), "platform")
                     for name, tests in unexplained_first.items() if tests}
            run_all(list(again.values()), trees, work, database_url=database_url,
                    tests_of={f"{n}-again": unexplained_first[n] for n in again},
                    deselect_of={f"{n}-again": [] for n in again},
                    jobs=options.jobs, deadline_seconds=options.deadline,
                    timeout_seconds=options.test_timeout)
            for name, run in again.items():
                flaky[name] = [t for t in unexplained_first[name]
                               if run.outcomes.get(t) in PASSING]
                found[name] = [t for t in found[name] if t not in flaky[name]]
    return report(suites, runs, found, flaky, intended, excluded, time.monotonic() - started)


def report_last(suites: list[Suite], work: Path, intended: list[Entry],
                excluded: list[Entry]) -> int:
    """`report` on the results a previous run left in `work` (flaky tests count again)."""
    runs = {(s.name, mode): Run(s, mode) for s in suites for mode in MODES}
    for (name, mode), run in runs.items():
        read_results(work / f"{name}-{mode}.jsonl", run)
    found = {s.name: diverging(runs[s.name, "stock"], runs[s.name, "platform"])
             for s in suites}
    flaky: dict[str, list[str]] = {}
    for suite in suites:
        again = Run(suite, "platform")
        read_results(work / f"{suite.name}-again-platform.jsonl", again)
        flaky[suite.name] = [t for t in found[suite.name] if again.outcomes.get(t) in PASSING]
        found[suite.name] = [t for t in found[suite.name] if t not in flaky[suite.name]]
    return report(suites, runs, found, flaky, intended, excluded, 0.0)


def report(suites: list[Suite], runs: dict[tuple[str, str], Run], found: dict[str, list[str]],
           flaky: dict[str, list[str]], intended: list[Entry], excluded: list[Entry],
           seconds: float) -> int:
    """Print the tallies and the divergences; 1 when one is not listed as intended."""
    print()
    print(f"{'suite':<20}{'mode':<10}{'passed':>8}{'failed':>8}{'skipped':>9}{'error':>7}"
          f"{'seconds':>9}")
    for suite in suites:
        for mode in MODES:
            run = runs[suite.name, mode]
            tally = run.tally()
            print(f"{suite.name:<20}{mode:<10}{tally['passed']:>8}{tally['failed']:>8}"
                  f"{tally['skipped']:>9}{tally['error']:>7}{run.seconds:>9.0f}"
                  f"{'  (cut short)' if run.cut_short else ''}")
        exercised = runs[suite.name, "platform"].exercised
        if exercised:
            print(f"{'':<20}platform code run in the pytest process: "
                  + ", ".join(f"{k}={v}" for k, v in exercised.items()))
    unexplained: list[tuple[str, str]] = []
    print()
    print("Intended divergences seen (divergences.toml):")
    seen_intended = False
    for suite in suites:
        for test in found[suite.name]:
            entry = next((e for e in intended if e.matches(suite.name, test)), None)
            if entry is None:
                unexplained.append((suite.name, test))
                continue
            seen_intended = True
            print(f"  {suite.name} {test}\n      reason: {entry.reason}")
    if not seen_intended:
        print("  (none)")
    stale = [e for e in intended if e.suite in {s.name for s in suites}
             and not any(e.matches(e.suite, t) for t in found[e.suite])]
    if stale:
        print("Listed as intended but not diverging today (remove when fixed for good):")
        for entry in stale:
            print(f"  {entry.suite} {entry.test}")
    if any(flaky.values()):
        print("Flaky (failed in the full run, passed when run again alone; not counted):")
        for name, tests in flaky.items():
            for test in tests:
                print(f"  {name} {test}")
    if excluded:
        print(f"Left out of both runs (divergences.toml [[excluded]]): {len(excluded)} entries")
    print()
    if unexplained:
        print(f"UNEXPLAINED: {len(unexplained)} tests pass stock and fail with the platform:")
        for name, test in unexplained:
            platform = runs[name, "platform"]
            outcome = platform.outcomes.get(test, "not run")
            print(f"  {name} {test}  [{outcome}]\n      "
                  f"{platform.reasons.get(test, '')}")
    else:
        print("No unexplained divergence.")
    print(f"conformance: {seconds:.0f} s")
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
