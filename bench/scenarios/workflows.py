"""Workflows: Celery's canvas plain against the same canvas started durably (issue 27).

The same `--chains` chains of 3 no-op steps and `--chords` chords of 10 no-op header steps
plus a body, started two ways on the same kind of task (`bench.tasks_workflows`):
- `plain`: a Celery task in Celery's canvas, results in the Redis result backend, the
  stock chord (the Redis backend's counter: the header's last task applies the body);
- `durable`: `resilience.workflows.durable(<the same canvas>).apply_async()` on the same
  task with no result backend: the graph, the steps' state and results in PostgreSQL, a
  step's completion and the publish of what it releases in one transaction.
With `--variants`, also `platform` and `platform_durable`: the same two on a platform task
(`app.task`: the platform's default guards, the tier bulkhead on every publish), which
separates what the platform's guards cost from what the workflow machinery costs.

Each round runs the variants in turn for each shape (rounds alternate, so every variant sees
the same machine load) on one worker of `--concurrency` pool processes: consumers paused,
every workflow started, consumers resumed, time until the last chain step / chord body ran
(a Redis counter each INCRs). A durable round also checks that every workflow reached
`succeeded` in PostgreSQL. `durable_chain_ratio` / `durable_chord_ratio` are the medians of
each round's durable/plain workflow rate (targets: chains >= 0.7, chords >= 1.0); steps per
second count every step (3 per chain, 11 per chord). `start_per_s` is the producer's rate
of starting workflows while the consumers are paused (not part of the drain time).

Cost per step, which a loaded machine does not stretch as it stretches rates
(`cpu_us_per_step`, `wal_syncs_per_step`, `redis_commands_per_step`; `CpuMeter`): from the
end of each start to the end of its drain, the CPU time of the worker (main and pool
processes; `worker_main` the main process's share: the consumer, which does the same work
per message in both variants, so its difference shows how much the other processes on the
cores stretch it), of the PostgreSQL backends of the bench's database and of the Redis
server, the server's WAL syncs (`pg_stat_wal`: the commits that waited for a flush) and the Redis
commands the server ran (the bench's own GET polls and INFO reads left out), per step, the
mean of the rounds.

PostgreSQL per durable step (`pg_statements_per_step`): after the timed rounds, a second
worker (started with the first, idle until then) whose pool processes count every query
they send (`bench.tasks_scale`'s client-side psycopg2 counter: each execute, the BEGIN
psycopg2 sends itself, each COMMIT/ROLLBACK; one query is one round trip) runs
`--statement-workflows` durable chains and a fifth as many chords (each shape started
while its consumer is paused); the totals per step, by statement kind, are in the JSON
(`pg_statements_by_kind`). What the producer sends to start a workflow is not counted.
Rates swing with the machine's load; these counts do not. The same phase reads the
server's WAL syncs per step (`pg_wal_syncs_per_step`) once every backend reported its
statistics (`--wal-settle-seconds`, 11 s idle before and after each shape): the timed
rounds' `wal_syncs_per_step` miss up to a second of syncs at either end of a drain (a busy
backend reports once a second, an idle one after 10 s).

Sizes: the defaults are the issue's (1,000 chains, 200 chords, 3 rounds); `--quick` is a
smoke-sized run (100 chains, 20 chords, 1 round):

    python -m bench workflows                   # the issue's sizes, plain and durable
    python -m bench workflows --quick
    python -m bench workflows --variants plain,durable,platform,platform_durable
    python -m bench workflows --profile /tmp/profiles   # + cProfile stats per variant
    python -m bench workflows --quick --profile /tmp/profiles --profile-clock cpu
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from bench.harness import (
    Stopwatch,
    drain_paused,
    paired_ratio,
    platform,
    psql,
    purge,
    table,
    wait_until,
    workers,
)
from tests.harness import Worker, running

QUEUE = "standard"
VARIANTS = ("plain", "durable", "platform", "platform_durable")
DEFAULT_VARIANTS = ("plain", "durable")
SHAPES = ("chain", "chord")
CHAIN_LENGTH = 3
CHORD_WIDTH = 10
#: Steps of one workflow of each shape (a chord's body is a step).
STEPS = {"chain": CHAIN_LENGTH, "chord": CHORD_WIDTH + 1}
#: Seconds an idle PostgreSQL backend may keep its statistics before it reports them
#: (PGSTAT_IDLE_INTERVAL, 10 s, plus a margin): `pg_stat_wal` read sooner misses the WAL
#: syncs of the last second of a burst (a busy backend reports at most once a second).
STATS_SETTLE_SECONDS = 11.0


def _options(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench workflows")
    parser.add_argument("--chains", type=int, default=1000, help="chains of 3 per round")
    parser.add_argument("--chords", type=int, default=200, help="chords of 10 per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each variant")
    parser.add_argument("--quick", action="store_true",
                        help="smoke size: 100 chains, 20 chords, 1 round (overrides those)")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                        help=f"comma-separated subset of {', '.join(VARIANTS)}")
    parser.add_argument("--statement-workflows", type=int, default=100,
                        help="chains run to count PostgreSQL statements per durable step "
                             "(and a fifth as many chords); 0 skips the count")
    parser.add_argument("--wal-settle-seconds", type=float, default=None,
                        help="idle wait before and after each shape of the statement count, "
                             "so pg_stat_wal holds every backend's syncs (default: "
                             f"{STATS_SETTLE_SECONDS:g} with --statement-workflows >= 20, "
                             "else 0: no settled WAL figure)")
    parser.add_argument("--profile", metavar="DIR",
                        help="also run each variant's chains and chords (the statement "
                             "count's sizes) on a worker profiled with cProfile, stats in DIR")
    parser.add_argument("--profile-clock", choices=("wall", "cpu"), default="wall",
                        help="--profile times functions in wall-clock seconds (waits "
                             "included) or in CPU seconds of their process")
    parser.add_argument("--servers-cpu", type=int, default=None, metavar="CPU",
                        help="pin the PostgreSQL and Redis servers (local ones) to this CPU "
                             "and the workers and this process to the others: a model of "
                             "servers on hosts of their own, the workers' cores compared")
    options = parser.parse_args(argv)
    if options.servers_cpu is not None:
        cpus = sorted(os.sched_getaffinity(0))
        if options.servers_cpu not in cpus or len(cpus) < 2:
            parser.error(f"--servers-cpu must be one of this process's CPUs {cpus}, "
                         "and at least one other must remain")
    if options.quick:
        options.chains, options.chords, options.rounds = 100, 20, 1
    if options.wal_settle_seconds is None:
        options.wal_settle_seconds = (STATS_SETTLE_SECONDS if options.statement_workflows >= 20
                                      else 0.0)
    options.variants = [v for v in VARIANTS if v in options.variants.split(",")]
    if "plain" not in options.variants:
        parser.error("--variants must include plain (the ratios' base)")
    if min(options.chains, options.chords, options.rounds) < 1:
        parser.error("--chains, --chords and --rounds must be at least 1")
    return options


class Starter:
    """Builds and starts one workflow of a shape for a variant, counted by `counter`."""

    def __init__(self, variant: str, tasks: dict[str, Any]) -> None:
        self.variant = variant
        self.task = tasks[variant]
        self.durable = variant.endswith("durable")

    def signature(self, shape: str, counter: str) -> Any:
        from celery import chain, chord

        step = self.task
        if shape == "chain":
            return chain(*[step.s() for _ in range(CHAIN_LENGTH - 1)], step.s(counter=counter))
        return chord([step.s() for _ in range(CHORD_WIDTH)], step.s(counter=counter))

    def start(self, shape: str, counter: str) -> str:
        """Start one workflow; its id (the durable run's, else the Celery result's)."""
        signature = self.signature(shape, counter)
        if self.durable:
            from resilience.workflows import durable

            return str(durable(signature, name=f"bench-{shape}").apply_async().id)
        return str(signature.apply_async().id)


def _durable_states(database_url: str, ids: list[str]) -> Counter[str]:
    rows = psql(database_url, "SELECT state, count(*) FROM resilience_workflows "
                              "WHERE id::text = ANY(%s) GROUP BY state", (ids,))
    return Counter({str(state): int(count) for state, count in rows})


def _await_succeeded(database_url: str, ids: list[str]) -> None:
    """Every durable workflow in `ids` reached `succeeded` (the last step's record commits
    just after its body INCRs the counter).

    Raises:
        RuntimeError: some did not within 30 s (their states are named).
    """
    states: Counter[str] = Counter()

    def done() -> bool:
        nonlocal states
        states = _durable_states(database_url, ids)
        return states["succeeded"] == len(ids)

    try:
        wait_until(done, timeout_seconds=30, what="durable workflows", poll_seconds=0.05)
    except TimeoutError:
        raise RuntimeError(f"of {len(ids)} durable workflows: {dict(states)}") from None


def _read_statements(directory: Path) -> Counter[str]:
    """Statements by kind, summed over the counting worker's pool processes' files."""
    total: Counter[str] = Counter()
    for path in directory.glob("*.json"):
        try:
            total.update(json.loads(path.read_text())["statements"])
        except (OSError, ValueError, KeyError):
            continue  # being replaced right now
    total.pop("(connections opened)", None)
    return total


def _wal_syncs(database_url: str) -> int:
    rows = psql(database_url, "SELECT wal_sync FROM pg_stat_wal")
    return int(rows[0][0]) if rows else 0


def _count_statements(options: argparse.Namespace, starter: Starter, redis: Any,
                      database_url: str, directory: Path, timed: list[str],
                      counting: str) -> dict[str, Any]:
    """PostgreSQL statements per durable step, by kind, counted in the pool of the worker
    `counting` (started with the others, its consumer cancelled until now); and the
    server's WAL syncs per step, read once every backend reported its statistics
    (`--wal-settle-seconds` idle before and after each shape; 0: not read)."""
    from jobs import app

    sizes = _phase_sizes(options)
    by_shape: dict[str, Counter[str]] = {}
    wal_syncs: dict[str, float] = {}
    settle = options.wal_settle_seconds
    app.control.cancel_consumer(QUEUE, destination=timed, reply=True)
    app.control.add_consumer(QUEUE, destination=[counting], reply=True)
    _run_unpaused(starter, "chain", min(10, sizes["chain"]), redis, database_url)
    for shape, n in sizes.items():
        before = _read_statements(directory)
        # Started (the producer's transactions) before the window: its syncs are not a step's.
        counter = f"bench:workflows:{uuid.uuid4().hex}"
        app.control.cancel_consumer(QUEUE, destination=[counting], reply=True)
        ids = [starter.start(shape, counter) for _ in range(n)]
        time.sleep(settle)
        syncs = _wal_syncs(database_url)
        app.control.add_consumer(QUEUE, destination=[counting], reply=True)
        wait_until(lambda n=n, counter=counter: int(redis.get(counter) or 0) >= n,
                   timeout_seconds=120, what=f"{n} durable {shape}s", poll_seconds=0.01)
        _await_succeeded(database_url, ids)
        by_shape[shape] = _read_statements(directory) - before
        if settle > 0:
            time.sleep(settle)
            wal_syncs[shape] = (_wal_syncs(database_url) - syncs) / (n * STEPS[shape])
    per_step = {shape: {kind: count / (sizes[shape] * STEPS[shape])
                        for kind, count in found.most_common()}
                for shape, found in by_shape.items()}
    return {"sizes": sizes, "per_step": per_step, "wal_syncs": wal_syncs}


def _phase_sizes(options: argparse.Namespace) -> dict[str, int]:
    return {"chain": options.statement_workflows,
            "chord": max(1, options.statement_workflows // 5)}


def _profile(options: argparse.Namespace, starters: dict[str, Starter], redis: Any,
             database_url: str) -> None:
    """Each variant's workflows once more on a worker profiled with cProfile (its main
    process and each pool process): `<--profile>/<variant>/{main,pool}-<pid>.prof`, read
    them with pstats."""
    from bench.tasks_workflows import PROFILE_CLOCK_ENV, PROFILE_DIR_ENV

    sizes = _phase_sizes(options)
    for variant, starter in starters.items():
        directory = Path(options.profile) / variant
        directory.mkdir(parents=True, exist_ok=True)
        with workers(QUEUE, concurrency=options.concurrency,
                     env={PROFILE_DIR_ENV: str(directory),
                          PROFILE_CLOCK_ENV: options.profile_clock}):
            for shape, n in sizes.items():
                _run_unpaused(starter, shape, n, redis, database_url)


def _run_unpaused(starter: Starter, shape: str, n: int, redis: Any, database_url: str) -> None:
    """Start `n` workflows while the workers run and wait for all of them."""
    counter = f"bench:workflows:{uuid.uuid4().hex}"
    ids = [starter.start(shape, counter) for _ in range(n)]
    wait_until(lambda: int(redis.get(counter) or 0) >= n, timeout_seconds=120,
               what=f"{n} {starter.variant} {shape}s", poll_seconds=0.01)
    if starter.durable:
        _await_succeeded(database_url, ids)


def run(argv: list[str]) -> dict[str, Any]:
    options = _options(argv)
    sizes = {"chain": options.chains, "chord": options.chords}
    messages = max(sizes["chain"], sizes["chord"] * CHORD_WIDTH)
    # The standard tier's bulkhead: room for a whole round of first steps, with margin.
    env = {"JOBS_STANDARD__MAX_QUEUE_DEPTH": str(max(10_000, 4 * messages))}

    with platform(env) as services:
        from bench.tasks_scale import STATEMENTS_DIR_ENV
        from bench.tasks_workflows import (
            workflows_bench_durable,
            workflows_bench_plain,
            workflows_bench_platform,
            workflows_bench_platform_durable,
        )
        from jobs import app
        from resilience.stores import stores_for

        tasks = {"plain": workflows_bench_plain, "durable": workflows_bench_durable,
                 "platform": workflows_bench_platform,
                 "platform_durable": workflows_bench_platform_durable}
        starters = {variant: Starter(variant, tasks) for variant in options.variants}
        redis = stores_for(app).redis()
        database_url = services.database_url.replace("postgresql+psycopg2", "postgresql")
        if options.servers_cpu is not None:
            pin_servers(database_url, redis, options.servers_cpu)
        purge([QUEUE])
        # rates[shape][variant]: workflows per second, one per round; starts likewise.
        rates = {shape: {v: [] for v in options.variants} for shape in SHAPES}
        starts = {shape: {v: [] for v in options.variants} for shape in SHAPES}
        # costs[shape][variant][kind]: per step, summed over rounds (divided at the end).
        costs = {shape: {v: Counter[str]() for v in options.variants} for shape in SHAPES}
        count = "durable" in starters and options.statement_workflows > 0
        counts_dir = Path(tempfile.mkdtemp(prefix="bench-workflows-statements-"))
        # The counting worker starts with the timed one (one start-up wait, not two) and
        # stays idle, its consumer cancelled, until its phase after the timed rounds.
        timed = Worker(QUEUE, name="bench-workflows", concurrency=options.concurrency)
        counting = Worker(QUEUE, name="bench-workflows-count", concurrency=options.concurrency,
                          env={STATEMENTS_DIR_ENV: str(counts_dir)})
        statements = None
        try:
            with running([timed, *([counting] if count else [])]):
                names = [timed.nodename]
                meter = CpuMeter(timed.pid, database_url, redis)
                if count:
                    app.control.cancel_consumer(QUEUE, destination=[counting.nodename],
                                                reply=True)
                for starter in starters.values():
                    for shape in SHAPES:
                        _run_unpaused(starter, shape, min(20, sizes[shape]), redis,
                                      database_url)  # warm-up: connections, imports, scripts
                for _ in range(options.rounds):
                    for shape in SHAPES:
                        for variant, starter in starters.items():
                            n = sizes[shape]
                            seconds, start_seconds, cost = _drain(
                                starter, shape, n, redis, database_url, names, meter)
                            rates[shape][variant].append(n / seconds)
                            starts[shape][variant].append(n / start_seconds)
                            for kind, value in cost.items():
                                costs[shape][variant][kind] += value / (n * STEPS[shape])
                if count:
                    statements = _count_statements(options, starters["durable"], redis,
                                                   database_url, counts_dir, names,
                                                   counting.nodename)
        finally:
            shutil.rmtree(counts_dir, ignore_errors=True)
        if options.profile:
            _profile(options, starters, redis, database_url)

    return _report(options, sizes, rates, starts, costs, statements)


#: Redis commands the bench itself sends while it measures (its counter polls, these
#: snapshots), left out of `redis_commands`.
BENCH_REDIS_COMMANDS = frozenset({"get", "info"})


def pin_servers(database_url: str, redis: Any, cpu: int) -> None:
    """Pin the PostgreSQL server of `database_url` (its postmaster and every process it has
    forked; backends forked later inherit the postmaster's affinity) and the Redis server of
    `redis` to `cpu`, and this process with its other children (workers started later
    inherit it) to the other CPUs. The bench's embedded servers end with the run; a shared
    server (DATABASE_URL, REDIS_URL) keeps the pinning until it restarts.

    Raises:
        SystemExit: a server is not a process of this machine.
    """
    import contextlib

    import psutil
    import psycopg2

    others = sorted(set(os.sched_getaffinity(0)) - {cpu})
    with contextlib.closing(psycopg2.connect(database_url)) as connection:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            (backend,) = cursor.fetchone()
        try:  # read while the backend lives: its parent is the postmaster
            postmaster = psutil.Process(backend).parent()
            redis_server = psutil.Process(int(redis.info("server")["process_id"]))
        except psutil.Error:
            postmaster = redis_server = None
    if postmaster is None or redis_server is None:
        raise SystemExit("--servers-cpu needs the PostgreSQL and Redis servers on this machine")
    servers = [postmaster, *postmaster.children(recursive=True), redis_server]
    for process in servers:
        process.cpu_affinity([cpu])
    pinned = {process.pid for process in servers}
    for process in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        if process.pid not in pinned:
            process.cpu_affinity(others)
    print(f"PostgreSQL (pid {postmaster.pid}) and Redis (pid {redis_server.pid}) pinned to "
          f"CPU {cpu}; the workers and the bench to CPUs {others}", flush=True)


class CpuMeter:
    """CPU seconds spent by the worker (main and pool processes), by the PostgreSQL backends
    of the bench's database and by the Redis server, the server's WAL syncs and the Redis
    commands the server ran (`BENCH_REDIS_COMMANDS` left out): the cost of a step in time
    the machine's load does not stretch (a loaded box stretches rates).

    The Redis server and WAL figures are server-wide: exact on the bench's own embedded
    servers (no REDIS_URL / DATABASE_URL), shared with anything else on a shared server.
    """

    def __init__(self, worker_pid: int, database_url: str, redis: Any) -> None:
        self.worker_pid = worker_pid
        self.database_url = database_url
        self.redis = redis

    def snapshot(self) -> dict[str, Any]:
        import psutil

        def cpu(process: Any) -> float:
            try:
                times = process.cpu_times()
            except psutil.Error:
                return 0.0
            return float(times.user + times.system)

        main = psutil.Process(self.worker_pid)
        backends = {int(pid): cpu(psutil.Process(int(pid))) for (pid,) in psql(
            self.database_url, "SELECT pid FROM pg_stat_activity WHERE datname = "
            "current_database() AND pid <> pg_backend_pid() AND backend_type = "
            "'client backend'") if psutil.pid_exists(int(pid))}
        info = self.redis.info("cpu")
        commands = sum(int(stats["calls"]) for name, stats in
                       self.redis.info("commandstats").items()
                       if name.removeprefix("cmdstat_") not in BENCH_REDIS_COMMANDS)
        wal = psql(self.database_url, "SELECT wal_sync FROM pg_stat_wal")
        return {"worker": cpu(main) + sum(cpu(child) for child in main.children(True)),
                "worker_main": cpu(main),
                "backends": backends,
                "redis": float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
                "wal_syncs": int(wal[0][0]) if wal else 0, "redis_commands": commands}

    @staticmethod
    def delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
        """Seconds (and syncs) spent between two snapshots; a backend that exited in
        between is lost, one that started counts from zero."""
        postgresql = sum(seconds - before["backends"].get(pid, 0.0)
                         for pid, seconds in after["backends"].items())
        return {"worker": after["worker"] - before["worker"], "postgresql": postgresql,
                "worker_main": after["worker_main"] - before["worker_main"],
                "redis": after["redis"] - before["redis"],
                "wal_syncs": after["wal_syncs"] - before["wal_syncs"],
                "redis_commands": after["redis_commands"] - before["redis_commands"]}


def _drain(starter: Starter, shape: str, n: int, redis: Any, database_url: str,
           names: list[str], meter: CpuMeter) -> tuple[float, float, dict[str, float]]:
    """(seconds the paused workers take to finish `n` workflows, seconds to start them,
    what the workers' side cost: `CpuMeter.delta` from after the start to the end)."""
    counter = f"bench:workflows:{uuid.uuid4().hex}"
    ids: list[str] = []
    start_seconds = 0.0
    before: dict[str, Any] = {}

    def enqueue() -> None:
        nonlocal start_seconds, before
        watch = Stopwatch()
        ids.extend(starter.start(shape, counter) for _ in range(n))
        start_seconds = watch.elapsed
        before = meter.snapshot()

    def done() -> bool:
        return int(redis.get(counter) or 0) >= n

    seconds = drain_paused(QUEUE, enqueue, done, names)
    if starter.durable:
        _await_succeeded(database_url, ids)
    return seconds, start_seconds, CpuMeter.delta(before, meter.snapshot())


def _report(options: argparse.Namespace, sizes: dict[str, int],
            rates: dict[str, dict[str, list[float]]], starts: dict[str, dict[str, list[float]]],
            costs: dict[str, dict[str, Counter[str]]],
            statements: dict[str, Any] | None) -> dict[str, Any]:
    def median(values: list[float]) -> float:
        return statistics.median(values)

    table(
        f"workflows: {options.chains} chains of {CHAIN_LENGTH}, {options.chords} chords of "
        f"{CHORD_WIDTH} x {options.rounds} rounds, 1 worker x{options.concurrency}",
        ["shape", "variant", "workflows/s", "steps/s", "min", "max", "vs plain", "starts/s"],
        [(shape, variant, median(rates[shape][variant]),
          median(rates[shape][variant]) * STEPS[shape], min(rates[shape][variant]),
          max(rates[shape][variant]), paired_ratio(rates[shape], variant),
          median(starts[shape][variant]))
         for shape in SHAPES for variant in options.variants],
    )
    figures: dict[str, Any] = {"chains": sizes["chain"], "chords": sizes["chord"],
                               "rounds": options.rounds, "concurrency": options.concurrency,
                               "servers_cpu": options.servers_cpu}
    for shape in SHAPES:
        for variant in options.variants:
            figures[f"{variant}_{shape}_steps_per_s"] = round(
                median(rates[shape][variant]) * STEPS[shape], 1)
            figures[f"{variant}_{shape}_start_per_s"] = round(median(starts[shape][variant]), 1)
            if variant != "plain":
                figures[f"{variant}_{shape}_ratio"] = round(
                    paired_ratio(rates[shape], variant), 3)
    # Per step, averaged over the rounds: CPU µs by process kind, WAL syncs.
    cost = {shape: {variant: {kind: value / options.rounds
                              for kind, value in costs[shape][variant].items()}
                    for variant in options.variants} for shape in SHAPES}
    table("CPU µs per step (worker main+pool, of it the main process, PostgreSQL backends, "
          "Redis server), WAL syncs and Redis commands per step, mean of the rounds",
          ["shape", "variant", "worker", "of it main", "PostgreSQL", "Redis", "total",
           "WAL syncs", "Redis cmds"],
          [(shape, variant, *(1e6 * found.get(kind, 0.0)
                              for kind in ("worker", "worker_main", "postgresql", "redis")),
            1e6 * sum(found.get(kind, 0.0) for kind in ("worker", "postgresql", "redis")),
            found.get("wal_syncs", 0.0), found.get("redis_commands", 0.0))
           for shape in SHAPES for variant, found in cost[shape].items()])
    figures["cpu_us_per_step"] = {
        shape: {variant: {kind: round(1e6 * found.get(kind, 0.0))
                          for kind in ("worker", "worker_main", "postgresql", "redis")}
                for variant, found in cost[shape].items()} for shape in SHAPES}
    figures["wal_syncs_per_step"] = {
        shape: {variant: round(found.get("wal_syncs", 0.0), 2)
                for variant, found in cost[shape].items()} for shape in SHAPES}
    figures["redis_commands_per_step"] = {
        shape: {variant: round(found.get("redis_commands", 0.0), 2)
                for variant, found in cost[shape].items()} for shape in SHAPES}
    if statements is not None:
        per_step = statements["per_step"]
        table(f"durable: PostgreSQL statements per step (worker pool, client-side count; "
              f"{statements['sizes']['chain']} chains, {statements['sizes']['chord']} chords)",
              ["statement", *SHAPES],
              [(kind, *(per_step[shape].get(kind, 0.0) for shape in SHAPES))
               for kind in sorted({k for found in per_step.values() for k in found})]
              + [("total", *(sum(per_step[shape].values()) for shape in SHAPES))]
              + ([("WAL syncs (server, settled)",
                   *(statements["wal_syncs"][shape] for shape in SHAPES))]
                 if statements["wal_syncs"] else []))
        figures["pg_statements_per_step"] = {
            shape: round(sum(found.values()), 2) for shape, found in per_step.items()}
        if statements["wal_syncs"]:
            figures["pg_wal_syncs_per_step"] = {
                shape: round(syncs, 2) for shape, syncs in statements["wal_syncs"].items()}
        figures["pg_statements_by_kind"] = {
            shape: {kind: round(count, 3) for kind, count in found.items()}
            for shape, found in per_step.items()}
    return figures
